"""A load test of WebSocket mode: hundreds of sockets running tool-call chains at once, and the
same conversations over plain HTTP at the same concurrency, against the same server process.

``python -m ws_mode.toolkit.bench.load --connections 300 --turns 5 --lanes 4`` starts the reference
server (:mod:`ws_mode.toolkit.reference`) behind :class:`~ws_mode.WebSocketModeMiddleware` under
uvicorn in a subprocess on loopback (:mod:`ws_mode.toolkit.bench.load_server`), then opens
``--connections`` sockets (the asyncio ``websockets`` client), all of them before any turn
starts. Each socket runs one tool-call chain of ``--turns`` turns on each of its lanes (1 to
``--lanes``, the default lane and named ones, concurrently): a user message, then
``turns - 1`` times the model asks for a tool and the client answers with a
``--tool-output-bytes`` output, the last turn is the model's final answer.

Then (unless ``--no-http``) the same conversations run over plain HTTP
(:mod:`ws_mode.toolkit.bench.load_http`): one keep-alive connection per conversation, all opened
before any turn starts, each turn a streamed ``POST /v1/responses`` with the whole history. With
``--rounds N`` the two sides alternate: sockets then HTTP in the first round, HTTP then sockets
in the second, and so on (:mod:`ws_mode.toolkit.bench.load_sides`); each side's figures add up over
its rounds.

Every turn is checked on both sides: its output must be exactly what the reference model gives
for that context over plain HTTP (the model is deterministic per context; each distinct chain
is run once over HTTP with the whole history first), a socket turn's events must carry its
lane's ``stream_id``, and no error may arrive. The report (:mod:`ws_mode.toolkit.bench.load_report`)
gives, per side, connections, turns, turns/s, p50/p99/max turn latency (request sent to
terminal event received), errors, the server's and this process's CPU time per turn, the
server's peak RSS, and the ratios WebSocket/HTTP; then the middleware's counters and the
server's RSS at rest. The sockets' peak RSS must stay under a bound derived from the cache
limits (:func:`~ws_mode.toolkit.bench.load_options.rss_bound`): the run fails when it does not.

Loopback only, bounded in count and time (``--duration`` caps the whole run); the server
subprocess is always killed, and kills itself if this process dies.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Final

from ws_mode.testing._loopback import ServerProcess, ServerStartError
from ws_mode.testing._loopback import server_process as loopback_process

from ..http_client import HttpClient
from .load_clients import reference_chains
from .load_http import history_bodies
from .load_options import LoadError, LoadOptions, rss_bound
from .load_report import LoadReport, SideReport
from .load_server import BACKLOG, STATS_PATH, raise_file_limit
from .load_sides import Load, Probe, run_side

__all__ = ["check_file_limit", "main", "run", "run_load", "server_process"]

SERVER_START_SECONDS: Final = 30.0
#: Open files besides the clients' connections: the server's stats client, threads, logs.
SPARE_FILES: Final = 64
#: How the report names where the server's peak RSS came from.
RSS_SOURCES: Final = {"/proc": "/proc VmHWM", "getrusage": "getrusage", "psutil": "psutil samples"}


def check_file_limit(options: LoadOptions) -> None:
    """Raise the open-file limit as far as it goes (the server inherits it); :class:`LoadError`
    when it still cannot hold every connection of the larger side at once."""
    needed = (options.conversations if options.http else options.connections) + SPARE_FILES
    limit = raise_file_limit()
    if 0 <= limit < needed:
        raise LoadError(
            f"this run holds {needed} open files at once but the limit is {limit} "
            "(raise it with ulimit -n, or run fewer connections)"
        )


@contextlib.contextmanager
def server_process(options: LoadOptions) -> Iterator[ServerProcess]:
    """Run the load server in a subprocess; yield its origin and pid. It is killed on exit."""
    spec = {
        "turns": options.turns,
        "tokens_per_second": options.tokens_per_second,
        "full_context": options.full_context,
        "connections": options.connections,
        "max_cached_bytes": options.max_cached_bytes,
        "max_cached_responses": options.max_cached_responses,
    }
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(
                loopback_process(
                    "ws_mode.toolkit.bench.load_server",
                    ["--spec", json.dumps(spec)],
                    ready_path=STATS_PATH,
                    lifetime=options.duration + 120.0,
                    backlog=BACKLOG,
                    start_timeout=SERVER_START_SECONDS,
                )
            )
        except ServerStartError as exc:
            raise LoadError(f"the load server did not start: {exc}") from exc
        yield server


async def run_load(options: LoadOptions, base_url: str, pid: int) -> LoadReport:
    """Run the load against a server already listening at `base_url` (process `pid`): each
    round runs the sockets then HTTP (HTTP first in odd rounds), one side after the other."""
    check_file_limit(options)
    report = LoadReport(options=asdict(options), server_pid=pid)
    report.http = SideReport("http") if options.http else None
    deadline = time.monotonic() + options.duration
    with HttpClient(base_url, timeout=30.0) as http:
        probe = Probe(http)
        chains = await asyncio.to_thread(reference_chains, base_url, options)
        at_rest = await probe.state()
        report.rss_at_rest = at_rest["memory"]["rss"] or 0
        report.rss_source = RSS_SOURCES.get(at_rest["memory"]["source"], "unavailable")
        report.cache_bytes_expected = sum(
            min(
                options.max_cached_bytes,
                sum(
                    chains[options.variant_of(index, lane)].cache_bytes
                    for lane in range(options.lanes_of(index))
                ),
            )
            for index in range(options.connections)
        )
        load = Load(base_url, pid, options, chains, history_bodies(chains), deadline, probe)
        sides = [report.websocket] if report.http is None else [report.websocket, report.http]
        for number in range(options.rounds):
            for side in sides if number % 2 == 0 else sides[::-1]:
                await run_side(load, side)
        after = await probe.state()
    for side in sides:
        side.finish()
    report.rss_after = after["memory"]["rss"] or 0
    if at_rest["memory"]["source"] != "/proc" and report.websocket.rss_peak:
        report.rss_source = "psutil samples"
    report.server_stats = after["stats"]
    report.rss_bound = rss_bound(
        report.rss_at_rest, options.connections, report.cache_bytes_expected
    )
    return report


def run(options: LoadOptions) -> LoadReport:
    """Start the server subprocess, run the load, kill the server; the report."""
    check_file_limit(options)
    with server_process(options) as server:
        return asyncio.run(run_load(options, server.base_url, server.pid))


# ----------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ws_mode.toolkit.bench.load",
        description="Load-test WebSocket mode: the reference server behind the middleware in a "
        "subprocess, hundreds of sockets running tool-call chains on loopback, then the same "
        "conversations over plain HTTP at the same concurrency.",
    )
    defaults = LoadOptions()
    parser.add_argument("--connections", type=int, default=defaults.connections)
    parser.add_argument("--turns", type=int, default=defaults.turns, help="turns per chain")
    parser.add_argument(
        "--lanes", type=int, default=defaults.lanes, help="most lanes per socket (1 to this)"
    )
    parser.add_argument("--tool-output-bytes", type=int, default=defaults.tool_output_bytes)
    parser.add_argument(
        "--duration",
        type=float,
        default=defaults.duration,
        help="cap on the run once the server listens, in seconds (closing takes up to 2 s more)",
    )
    parser.add_argument(
        "--full-context", choices=("always", "on_miss"), default=defaults.full_context
    )
    parser.add_argument(
        "--tokens-per-second",
        type=float,
        default=defaults.tokens_per_second,
        help="the reference model's speed (0: no delay)",
    )
    parser.add_argument("--max-cached-bytes", type=int, default=defaults.max_cached_bytes)
    parser.add_argument("--connect-concurrency", type=int, default=defaults.connect_concurrency)
    parser.add_argument(
        "--no-http",
        dest="http",
        action="store_false",
        help="run the sockets only, not the same conversations over plain HTTP",
    )
    parser.add_argument(
        "--no-compression",
        dest="compression",
        action="store_false",
        help="sockets without permessage-deflate (the openai SDK asks for it)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=defaults.rounds,
        help="rounds of both sides, alternating which goes first (sockets in the first)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ws_mode.toolkit.bench.load``: run the load, print the report; 0 when it is OK."""
    arguments = _parser().parse_args(argv)
    try:
        options = LoadOptions(
            connections=arguments.connections,
            turns=arguments.turns,
            lanes=arguments.lanes,
            tool_output_bytes=arguments.tool_output_bytes,
            duration=arguments.duration,
            full_context=arguments.full_context,
            tokens_per_second=arguments.tokens_per_second,
            max_cached_bytes=arguments.max_cached_bytes,
            connect_concurrency=arguments.connect_concurrency,
            http=arguments.http,
            rounds=arguments.rounds,
            compression=arguments.compression,
        )
        report = run(options)
    except LoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.to_json() if arguments.json else report.text())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
