"""Peer comparison: ``ws-mode proxy`` against LiteLLM's managed Responses WebSocket mode.

Both proxies stand in front of the same plain-HTTP upstream: the reference server
(``ws_mode.toolkit.reference``, no WebSocket mode, zero model cost) behind a recorder that keeps
every request body it receives and every answer it gives. Three ways of running the same 25-turn
tool loop (``ws_mode.toolkit.rollout``, 4 KiB tool outputs) are interleaved, round after round:

- ``http``: ``run_http`` straight to the upstream, the whole history in every request (the
  baseline, no proxy);
- ``ws-mode``: ``run_socket`` through ``ws-mode proxy --upstream UPSTREAM/v1``;
- ``litellm``: ``run_socket`` through LiteLLM's proxy (``litellm --config``), its model routed
  with the ``litellm_proxy/`` provider to ``UPSTREAM/v1``: a provider without a native
  WebSocket, so LiteLLM serves the socket itself (``ManagedResponsesWebSocketHandler``) and
  posts each turn to the upstream over HTTP, rebuilding the history from its own memory.

Measured per rollout: the client's wall time, the proxy process's CPU time (user + system,
read from outside with ``ws_mode.toolkit.bench.control.process_cpu``, including 0.3 s after the
answer for work it does later), and whether each upstream request carried exactly the history an
HTTP client keeps (the previous input, the previous output as the upstream returned it, the new tool
outputs) and the client's fields (``benchmarks/recorded_upstream.py``). Per proxy:
its RSS after the warm-up and its peak RSS. Once per front, untimed, a three-message conversation
(each answer an assistant message) is checked the same way. Each proxy and the upstream run in their
own processes; the client runs here. The runner is ``peer_run.py``, shared with the agentic-api
comparison.

Run it in the ws_mode venv (from any directory), giving LiteLLM's executable or the python of
the separate venv it is installed in::

    python -m benchmarks.peer_litellm ~/peer-venv/bin/litellm

It is not part of the package or the test suite (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ws_mode.testing._loopback import HOST, server_process

from .peer_run import HTTP, Mode, compare, front_process, report, ws_mode_command
from .recorded_upstream import MODEL


def litellm_command(peer: str, config: Path) -> Callable[[int], list[str]]:
    """The command line of LiteLLM's proxy, from its executable or its venv's python."""
    start = [peer, "-m", "litellm.proxy.proxy_cli"] if "python" in Path(peer).name else [peer]
    return lambda port: [*start, "--config", str(config), "--host", HOST, "--port", str(port)]


def litellm_config(upstream: str, master_key: str) -> str:
    """LiteLLM's config: the model routed to the upstream's Responses API over HTTP."""
    return (
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: litellm_proxy/{MODEL}\n"
        f"      api_base: {upstream}/v1\n"
        "      api_key: unused\n"
        "general_settings:\n"
        f"  master_key: {master_key}\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison and print its table."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("peer", help="LiteLLM's executable, or the python of its venv")
    parser.add_argument("--rounds", type=int, default=5, help="measured rollouts per mode")
    parser.add_argument("--turns", type=int, default=25, help="model calls per rollout")
    parser.add_argument("--tool-output-bytes", type=int, default=4096)
    args = parser.parse_args(arguments)
    master_key = "sk-" + secrets.token_hex(24)
    options: dict[str, Any] = {
        "turns": args.turns,
        "tool_output_bytes": args.tool_output_bytes,
        "headers": {"authorization": f"Bearer {master_key}"},
        "model": MODEL,
        "timeout": 120.0,
    }
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="peer-litellm-")))
        upstream = stack.enter_context(
            server_process(
                "benchmarks.recorded_upstream",
                ["--turns", str(args.turns)],
                ready_path="/healthz",
            )
        ).base_url
        config = workdir / "litellm.yaml"
        config.write_text(litellm_config(upstream, master_key))
        ws_mode = stack.enter_context(
            front_process(ws_mode_command(upstream), "/healthz", workdir / "ws-mode.log")
        )
        litellm = stack.enter_context(
            front_process(
                litellm_command(args.peer, config),
                "/health/liveliness",
                workdir / "litellm.log",
                env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"},
            )
        )
        modes = {
            HTTP: Mode("HTTP -> upstream (no proxy)", None),
            "ws-mode": Mode("socket -> ws-mode proxy", ws_mode),
            "litellm": Mode("socket -> LiteLLM", litellm),
        }
        results = compare(upstream, modes, options, args.rounds)
    report(
        results,
        modes,
        turns=args.turns,
        tool_output_bytes=args.tool_output_bytes,
        rounds=args.rounds,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
