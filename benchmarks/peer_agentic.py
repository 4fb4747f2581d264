"""Peer comparison: ``ws-mode proxy`` against vLLM's Agentic API gateway (PyPI ``agentic-api``).

agentic-api is a Rust gateway (``agentic-server``) with its own WebSocket mode: it keeps each
response in its store (SQLite here) and posts each turn upstream over HTTP with the history it
rebuilt. Both proxies stand in front of the same plain-HTTP upstream: by default the cheap raw
ASGI upstream of ``http_clients.py`` (it answers without parsing the body, so the fronts' cost is
not lost in the upstream's; ``--reference`` uses the reference server), behind the recorder of
``recorded_upstream.py``. The same 25-turn tool loop (``ws_mode.toolkit.rollout``, 4 KiB tool
outputs) runs four ways, interleaved round after round:

- ``http``: ``run_http`` straight to the upstream, the whole history in every request (the
  baseline, no proxy);
- ``ws-mode``: ``run_socket`` through ``ws-mode proxy --upstream UPSTREAM/v1`` (uvicorn accepts
  the permessage-deflate the client offers);
- ``ws-mode, no deflate``: the same through a second ``ws-mode proxy`` started with
  ``--ws-per-message-deflate false``;
- ``agentic``: ``run_socket`` through ``agentic-server --llm-api-base UPSTREAM`` (the binary
  itself, not its Python launcher, so the CPU read is the gateway's; it does not negotiate
  permessage-deflate).

Measured as in the LiteLLM comparison (``peer_run.py``): the client's wall time per rollout,
each proxy process's CPU (read from outside, 0.3 s after the answer included) per rollout and
per turn, its RSS after the warm-up and its peak, whether the upstream received exactly the
history an HTTP client sends (a tool loop each rollout; a three-message conversation once), and
the ratios of each ``ws-mode`` row to agentic-api's. Run it in the ws_mode venv, giving
agentic-api's ``agentic-server`` or the python of the venv it is installed in (keep it out of the
project's venv: ``python -m venv ~/agentic && ~/agentic/bin/pip install agentic-api``)::

    python -m benchmarks.peer_agentic ~/agentic/bin/agentic-server

It is not part of the package or the test suite (see benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from ws_mode.testing._loopback import HOST, server_process
from ws_mode.toolkit.link import LinkSpec, link_process

from .peer_run import HTTP, Mode, compare, front_process, report, ws_mode_command
from .recorded_upstream import MODEL

AGENTIC: Final = "agentic"
GATEWAY_BINARY: Final = "agentic-server"


def agentic_command(peer: str, workdir: Path, upstream: str) -> Callable[[int], list[str]]:
    """The command line of agentic-api's gateway in front of the upstream (its origin: the
    gateway adds ``/v1``), its store a SQLite file in ``workdir``; ``peer`` is the
    ``agentic-server`` binary, or any file beside it (the venv's python, ``agentic-api``)."""
    binary = Path(peer)
    if binary.name != GATEWAY_BINARY:
        binary = binary.parent / GATEWAY_BINARY
    start = [
        str(binary),
        "--llm-api-base",
        upstream,
        "--skip-llm-ready-check",
        "--db-url",
        f"sqlite://{workdir / 'agentic.db'}",
        "--gateway-host",
        HOST,
    ]
    return lambda port: [*start, "--gateway-port", str(port)]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison and print its table."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("peer", help="agentic-api's agentic-server, or the python of its venv")
    parser.add_argument("--rounds", type=int, default=7, help="measured rollouts per mode")
    parser.add_argument("--turns", type=int, default=25, help="model calls per rollout")
    parser.add_argument("--tool-output-bytes", type=int, default=4096)
    parser.add_argument(
        "--reference", action="store_true", help="the reference server as the upstream"
    )
    parser.add_argument(
        "--link",
        type=LinkSpec.parse,
        metavar="SPEC",
        help="put each client's connection through a modelled link (ws_mode.toolkit.link), as "
        "'rtt=30ms,up=10mbit,down=10mbit'; the fronts reach the upstream on loopback",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="one more ws-mode proxy in the run, started with these flags (repeatable), as "
        "'sansio=--ws websockets-sansio'",
    )
    args = parser.parse_args(arguments)
    options: dict[str, Any] = {
        "turns": args.turns,
        "tool_output_bytes": args.tool_output_bytes,
        "model": MODEL,
        "timeout": 120.0,
    }
    upstream_arguments = ["--turns", str(args.turns), *(() if args.reference else ("--cheap",))]
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="peer-agentic-")))
        upstream = stack.enter_context(
            server_process(
                "benchmarks.recorded_upstream",
                upstream_arguments,
                ready_path="/healthz",
            )
        ).base_url
        ws_mode = stack.enter_context(
            front_process(ws_mode_command(upstream), "/healthz", workdir / "ws-mode.log")
        )
        plain = stack.enter_context(
            front_process(
                ws_mode_command(upstream, "--ws-per-message-deflate", "false"),
                "/healthz",
                workdir / "ws-mode-plain.log",
            )
        )
        agentic = stack.enter_context(
            front_process(
                agentic_command(args.peer, workdir, upstream),
                "/health",
                workdir / "agentic.log",
                # Its home (default store, config) in the run's directory; warnings only.
                env={"HOME": str(workdir), "RUST_LOG": "warn"},
            )
        )
        modes = {
            HTTP: Mode("HTTP -> upstream (no proxy)", None),
            "ws-mode": Mode("socket -> ws-mode proxy", ws_mode),
            "ws-mode, no deflate": Mode("socket -> ws-mode proxy, no deflate", plain),
        }
        for variant in args.variant:
            name, _, flags = variant.partition("=")
            command = ws_mode_command(upstream, *shlex.split(flags))
            log = workdir / f"ws-mode-{len(modes)}.log"
            front = stack.enter_context(front_process(command, "/healthz", log))
            modes[name] = Mode(f"socket -> ws-mode proxy {flags}", front)
        modes[AGENTIC] = Mode("socket -> agentic-api", agentic)
        if args.link is not None:  # every client through its own relay of the modelled link
            for name, mode in modes.items():
                target = upstream if mode.front is None else mode.front.base_url
                relay = stack.enter_context(link_process(args.link, target))
                modes[name] = Mode(mode.label, mode.front, relay)
        results = compare(upstream, modes, options, args.rounds)
    upstream_name = "reference upstream" if args.reference else "cheap upstream"
    link = f", client -> front through {args.link.describe()}" if args.link else ""
    print(f"agentic-api against ws-mode proxy, {upstream_name}{link}")
    report(
        results,
        modes,
        turns=args.turns,
        tool_output_bytes=args.tool_output_bytes,
        rounds=args.rounds,
        against=AGENTIC,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
