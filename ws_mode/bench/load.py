"""A load test of WebSocket mode: hundreds of sockets running tool-call chains at once.

``python -m ws_mode.bench.load --connections 300 --turns 5 --lanes 4`` starts the reference
server (:mod:`ws_mode.reference`) behind :class:`~ws_mode.WebSocketModeMiddleware` under
uvicorn in a subprocess on loopback (:mod:`ws_mode.bench.load_server`), then opens
``--connections`` sockets (the asyncio ``websockets`` client), all of them before any turn
starts. Each socket runs one tool-call chain of ``--turns`` turns on each of its lanes (1 to
``--lanes``, the default lane and named ones, concurrently): a user message, then
``turns - 1`` times the model asks for a tool and the client answers with a
``--tool-output-bytes`` output, the last turn is the model's final answer.

Every turn is checked: its output must be exactly what the reference model gives for that
context over plain HTTP (the model is deterministic per context; each distinct chain is run
once over HTTP with the whole history first), its events must carry its lane's ``stream_id``,
and no error may arrive. The report gives connections, turns, turns/s, p50/p99 turn latency
(create sent to terminal event received), errors, the middleware's counters
(``middleware.stats``) and the server's RSS: at rest before the load and at its peak (VmHWM
from ``/proc``, or sampled with psutil when ``/proc`` is missing). The peak must stay under a
bound derived from the cache limits (:func:`~ws_mode.bench.load_options.rss_bound`): the run
fails when it does not.

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
from typing import Any, Final

from ..tools.http_client import HttpClient
from ..tools.loopback import ServerProcess, ServerStartError
from ..tools.loopback import server_process as loopback_process
from ..tools.measure import PeakSampler, percentile
from .load_clients import Tally, reference_chains, run_client
from .load_options import LoadError, LoadOptions, LoadReport, rss_bound
from .load_server import BACKLOG, STATS_PATH, raise_file_limit

__all__ = ["main", "run", "run_load", "server_process"]

SERVER_START_SECONDS: Final = 30.0
#: How the report names where the server's peak RSS came from (``Memory.source``).
RSS_SOURCES: Final = {"/proc": "/proc VmHWM", "getrusage": "getrusage", "psutil": "psutil samples"}


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
                    "ws_mode.bench.load_server",
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
    """Run the load against a server already listening at `base_url` (process `pid`)."""
    raise_file_limit()
    report = LoadReport(options=asdict(options), server_pid=pid)
    deadline = time.monotonic() + options.duration
    with HttpClient(base_url, timeout=30.0) as http:

        async def server_state() -> dict[str, Any]:
            return await asyncio.to_thread(http.get_json, STATS_PATH)

        chains = await asyncio.to_thread(reference_chains, base_url, options)
        at_rest = await server_state()
        report.rss_at_rest = at_rest["memory"]["rss"] or 0
        report.rss_source = RSS_SOURCES.get(at_rest["memory"]["source"], "unavailable")
        sampler = PeakSampler(pid)
        sampler.start()

        tally = Tally(expected=options.connections)
        gate = asyncio.Semaphore(options.connect_concurrency)
        start = asyncio.Event()
        clients = [
            asyncio.create_task(run_client(index, base_url, options, chains, tally, gate, start))
            for index in range(options.connections)
        ]
        report.turns_expected = options.turns * sum(
            options.lanes_of(index) for index in range(options.connections)
        )
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
        try:
            # Every socket is open before the first turn starts.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                    await tally.all_settled.wait()
            report.connections_open_peak = (await server_state())["connections"]
            report.connections = tally.connected
            began = time.perf_counter()
            start.set()
            left = max(0.1, deadline - time.monotonic())
            _done, pending = await asyncio.wait(clients, timeout=left)
            report.seconds = time.perf_counter() - began
            if pending:
                tally.error("duration", f"{len(pending)} connections still running at the cap")
        finally:
            tally.stopped = True
            for client in clients:
                client.cancel()
            await asyncio.gather(*clients, return_exceptions=True)
            sampler.stop()
        after = await server_state()
        for _ in range(100):  # the server closes the sockets soon after the clients did
            if after["connections"] == 0:
                break
            await asyncio.sleep(0.05)
            after = await server_state()
    _finish(report, tally, after, sampler.peak)
    return report


def _finish(report: LoadReport, tally: Tally, after: dict[str, Any], sampled_peak: int) -> None:
    """Fill the report in from what the clients saw and the server's state after the load."""
    report.turns = tally.turns
    report.lanes = tally.lanes
    report.errors = dict(tally.errors)
    report.error_samples = tally.samples
    report.turns_per_second = report.turns / report.seconds if report.seconds else 0.0
    report.latency_p50_ms = percentile(tally.latencies, 0.50) * 1000
    report.latency_p99_ms = percentile(tally.latencies, 0.99) * 1000
    report.latency_max_ms = max(tally.latencies, default=0.0) * 1000
    peak = after["memory"]["peak"] or 0
    report.rss_peak = max(peak, sampled_peak)
    report.rss_after = after["memory"]["rss"] or 0
    if report.rss_source == "psutil samples" or not peak:
        report.rss_source = "psutil samples" if sampled_peak else report.rss_source
    report.server_stats = after["stats"]
    report.rss_bound = rss_bound(
        report.rss_at_rest, report.connections, report.cache_bytes_expected
    )
    if after["connections"] != 0:
        report.errors["connections_left_open"] = after["connections"]


def run(options: LoadOptions) -> LoadReport:
    """Start the server subprocess, run the load, kill the server; the report."""
    with server_process(options) as server:
        return asyncio.run(run_load(options, server.base_url, server.pid))


# ----------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ws_mode.bench.load",
        description="Load-test WebSocket mode: the reference server behind the middleware in a "
        "subprocess, hundreds of sockets running tool-call chains on loopback.",
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
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ws_mode.bench.load``: run the load, print the report; 0 when it is OK."""
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
        )
        report = run(options)
    except LoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.to_json() if arguments.json else report.text())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
