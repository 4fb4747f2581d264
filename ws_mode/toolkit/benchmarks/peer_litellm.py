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
outputs) and the client's fields (``ws_mode/toolkit/benchmarks/recorded_upstream.py``). Per proxy:
its RSS after the warm-up and its peak RSS. Once per front, untimed, a three-message conversation
(each answer an assistant message) is checked the same way. Each proxy and the upstream run in their
own processes; the client runs here.

Run it in the ws_mode venv (from any directory), giving LiteLLM's executable or the python of
the separate venv it is installed in::

    python -m ws_mode.toolkit.benchmarks.peer_litellm ~/peer-venv/bin/litellm

It is not part of the package or the test suite (see ws_mode/toolkit/benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ws_mode.testing._loopback import HOST, bind_loopback, server_process, wait_answering

from ..agent import DEFAULT_PROMPT, user_message
from ..bench.control import process_cpu
from ..measure import format_bytes, format_seconds, median, memory
from ..rollout import RolloutResult, run_http, run_socket
from .recorded_upstream import (
    CONVERSATION_FIELDS,
    MODEL,
    PROMPTS,
    Check,
    check_history,
    conversation_follow,
    converse_http,
    converse_socket,
    fetch_records,
    tool_loop_fields,
    tool_outputs,
)

SETTLE_SECONDS: Final = 0.3
MODES: Final = ("http", "ws-mode", "litellm")


# ----------------------------------------------------------------------------- the processes


@dataclass(frozen=True)
class Front:
    """A proxy running in a child process: its base URL and process id."""

    base_url: str
    pid: int


def _free_port() -> int:
    with bind_loopback() as sock:
        port: int = sock.getsockname()[1]
    return port


@contextlib.contextmanager
def front_process(
    command: Callable[[int], list[str]],
    ready_path: str,
    log: Path,
    env: dict[str, str] | None = None,
) -> Iterator[Front]:
    """Run ``command(port)`` until the block ends; yield it once it answers ``GET ready_path``."""
    port = _free_port()
    base_url = f"http://{HOST}:{port}"
    with log.open("wb") as output:
        process = subprocess.Popen(
            command(port),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=log.parent,
            start_new_session=True,
        )
        try:
            wait_answering(base_url, process, path=ready_path, timeout=180)
            yield Front(base_url, process.pid)
        except Exception:
            print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
        finally:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def ws_mode_command(upstream: str) -> Callable[[int], list[str]]:
    """The command line of ``ws-mode proxy`` in front of the upstream."""
    start = [sys.executable, "-m", "ws_mode.toolkit.cli", "proxy", "--upstream", upstream + "/v1"]
    return lambda port: [*start, "--host", HOST, "--port", str(port), "--log-level", "warning"]


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


def cpu_seconds(pid: int) -> float:
    """Process `pid`'s CPU time so far (user + system, all threads), read from outside."""
    seconds = process_cpu(pid)
    if seconds is None:
        raise RuntimeError("this system cannot read another process's CPU-time clock")
    return seconds


# ----------------------------------------------------------------------------- the run


@dataclass
class Measured:
    """What one mode measured over the rounds."""

    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)
    turns: int = 0
    exact: int = 0
    differences: list[str] = field(default_factory=list)
    rss_after_warmup: int | None = None
    peak_rss: int | None = None
    conversation: Check | None = None


def run_one(
    run: Callable[[], RolloutResult],
    upstream: str,
    pid: int | None,
    tool_output_bytes: int,
    measured: Measured,
) -> None:
    """One rollout: its wall time, the proxy's CPU, and the check of the upstream's requests."""
    fetch_records(upstream, reset=True)
    before = cpu_seconds(pid) if pid is not None else 0.0
    result = run()
    if pid is not None:
        time.sleep(SETTLE_SECONDS)
        measured.cpus.append(cpu_seconds(pid) - before)
    measured.walls.append(result.total_seconds)
    measured.sent.append(result.bytes_sent)
    records = fetch_records(upstream, reset=True)
    check = check_history(
        records, tool_loop_fields(), [user_message(DEFAULT_PROMPT)], tool_outputs(tool_output_bytes)
    )
    measured.turns += check.turns
    measured.exact += check.exact
    if check.differences and not measured.differences:
        measured.differences = check.differences


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
    headers = {"authorization": f"Bearer {master_key}"}
    options: dict[str, Any] = {
        "turns": args.turns,
        "tool_output_bytes": args.tool_output_bytes,
        "headers": headers,
        "model": MODEL,
        "timeout": 120.0,
    }
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="peer-litellm-")))
        upstream = stack.enter_context(
            server_process(
                "ws_mode.toolkit.benchmarks.recorded_upstream",
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
        runs: dict[str, tuple[Callable[[], RolloutResult], int | None]] = {
            "http": (lambda: run_http(upstream, **options), None),
            "ws-mode": (lambda: run_socket(ws_mode.base_url, **options), ws_mode.pid),
            "litellm": (lambda: run_socket(litellm.base_url, **options), litellm.pid),
        }
        results = {mode: Measured() for mode in MODES}
        for mode, (run, pid) in runs.items():  # warm-up, checked but not timed
            warm = Measured()
            run_one(run, upstream, pid, args.tool_output_bytes, warm)
            if pid is not None:
                results[mode].rss_after_warmup = memory(pid).rss
        conversations: dict[str, Callable[[], None]] = {
            "http": lambda: converse_http(upstream, headers),
            "ws-mode": lambda: converse_socket(ws_mode.base_url, headers),
            "litellm": lambda: converse_socket(litellm.base_url, headers),
        }
        for mode, converse in conversations.items():
            fetch_records(upstream, reset=True)
            converse()
            records = fetch_records(upstream, reset=True)
            first = [user_message(PROMPTS[0])]
            check = check_history(records, CONVERSATION_FIELDS, first, conversation_follow)
            results[mode].conversation = check
        for round_ in range(args.rounds):
            order = MODES[round_ % 3 :] + MODES[: round_ % 3]
            for mode in order:
                run, pid = runs[mode]
                run_one(run, upstream, pid, args.tool_output_bytes, results[mode])
            print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        for mode, (_, pid) in runs.items():
            if pid is not None:
                results[mode].peak_rss = memory(pid).peak
    report(results, args)
    return 0


def report(results: dict[str, Measured], args: argparse.Namespace) -> None:
    """Print the table (Markdown) and the first difference each mode showed."""
    base = median(results["http"].walls)
    print(f"{args.turns}-turn tool loop, {args.tool_output_bytes} B tool outputs, ", end="")
    print(f"median of {args.rounds} interleaved rollouts\n")
    columns = (
        "client -> front",
        "wall per rollout",
        "vs HTTP",
        "proxy CPU per rollout",
        "proxy RSS after warm-up",
        "proxy peak RSS",
        "client sent",
        "exact history: tool loop",
        "exact history: conversation",
    )
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    names = {
        "http": "HTTP -> upstream (no proxy)",
        "ws-mode": "socket -> ws-mode proxy",
        "litellm": "socket -> LiteLLM",
    }
    for mode in MODES:
        m = results[mode]
        wall = median(m.walls)
        cells = (
            names[mode],
            format_seconds(wall),
            f"{wall / base:.2f}x",
            format_seconds(median(m.cpus)) if m.cpus else "-",
            format_bytes(m.rss_after_warmup),
            format_bytes(m.peak_rss),
            format_bytes(median(m.sent)),
            f"{m.exact}/{m.turns} turns",
            f"{m.conversation.exact}/{m.conversation.turns} turns" if m.conversation else "-",
        )
        print("| " + " | ".join(cells) + " |")
    for mode in MODES:
        conversation = results[mode].conversation
        for line in results[mode].differences:
            print(f"\n{mode}, tool loop, first difference: {line}")
        for line in conversation.differences if conversation else ():
            print(f"\n{mode}, conversation, first difference: {line}")


if __name__ == "__main__":
    sys.exit(main())
