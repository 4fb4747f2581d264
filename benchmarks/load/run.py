"""The load run and its command line: the server's process (:func:`server_process`), the rounds
(:func:`run_load`, :func:`run`), the options from ``argv`` and :func:`main` (``python -m
benchmarks.load``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Final

from ws_mode.testing._loopback import (
    WS_IMPLEMENTATIONS,
    ServerProcess,
    ServerStartError,
)
from ws_mode.testing._loopback import server_process as loopback_process

from .chains import reference_chains
from .client import Load, Probe, history_bodies, run_side
from .options import LONG_TOOL_OUTPUT_BYTES, LONG_TURNS, LoadError, LoadOptions, rss_bound
from .report import LoadReport, SideReport
from .server import BACKLOG, STATS_PATH, raise_file_limit, serve

if TYPE_CHECKING:
    pass


# ----------------------------------------------------------------------------- the run


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
        "ws": options.ws,
        "gc_threshold": options.gc_threshold,
    }
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(
                loopback_process(
                    "benchmarks.load",
                    ["--serve", "--spec", json.dumps(spec)],
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
    from ws_mode.toolkit.http_client import HttpClient

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


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks.load`` (the load's side)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.load",
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
        "--ws",
        choices=tuple(WS_IMPLEMENTATIONS),
        default=defaults.ws,
        help="the server's uvicorn WebSocket implementation, as ws-mode serve --ws "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--gc-threshold",
        type=int,
        default=defaults.gc_threshold,
        metavar="N",
        help="the server's garbage collector as ws-mode serve sets it: young collections every "
        "N allocations, what is alive at start frozen (ws_mode.tune_gc); 0 leaves "
        "Python's collector as it is (default: %(default)s)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=defaults.rounds,
        help="rounds of both sides, alternating which goes first (sockets in the first)",
    )
    parser.add_argument(
        "--long",
        action="store_true",
        help=f"longer histories: {LONG_TURNS} turns with {LONG_TOOL_OUTPUT_BYTES}-byte tool "
        "outputs, one lane per socket (overrides --turns, --tool-output-bytes and --lanes)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def options_from(arguments: argparse.Namespace) -> LoadOptions:
    """The load's options from the parsed command line (``--long`` sets the chains' shape)."""
    turns, tool_output_bytes, lanes = arguments.turns, arguments.tool_output_bytes, arguments.lanes
    if arguments.long:
        turns, tool_output_bytes, lanes = LONG_TURNS, LONG_TOOL_OUTPUT_BYTES, 1
    return LoadOptions(
        connections=arguments.connections,
        turns=turns,
        lanes=lanes,
        tool_output_bytes=tool_output_bytes,
        duration=arguments.duration,
        full_context=arguments.full_context,
        tokens_per_second=arguments.tokens_per_second,
        max_cached_bytes=arguments.max_cached_bytes,
        connect_concurrency=arguments.connect_concurrency,
        http=arguments.http,
        rounds=arguments.rounds,
        compression=arguments.compression,
        ws=arguments.ws,
        gc_threshold=arguments.gc_threshold,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.load``: run the load, print the report; 0 when it is OK.
    With ``--serve``, be the load server's process instead (:func:`serve`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--serve" in argv:
        return serve(argv)
    arguments = build_parser().parse_args(argv)
    try:
        report = run(options_from(arguments))
    except LoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.to_json() if arguments.json else report.text())
    return 0 if report.ok else 1
