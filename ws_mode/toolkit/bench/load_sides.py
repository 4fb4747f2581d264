"""One side of one round of the load test: every client connected, then every turn at once.

:func:`run_side` runs the sockets (:func:`ws_mode.toolkit.bench.load_clients.run_client`) or plain
HTTP (:func:`ws_mode.toolkit.bench.load_http.run_http_client`) against the load server, and adds
what it measured to that side's :class:`~ws_mode.toolkit.bench.load_report.SideReport`: turns,
errors, latencies, and, from the first turn to the last client's end, the seconds, the server's CPU
time (its own ``time.process_time()``, read from ``/load/stats``) and this process's, and the
server's RSS once the previous side's memory was released, and its peak (VmHWM), both through
``/load/reset`` before the side connects.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from ..http_client import HttpClient
from ..measure import PeakSampler
from .load_clients import Chain, Tally, run_client
from .load_http import run_http_client
from .load_options import LoadOptions
from .load_report import SideReport
from .load_server import RESET_PATH, STATS_PATH

__all__ = ["Probe", "run_side"]

#: How long a side waits for the server to close the sockets its clients closed.
CLOSE_WAIT_SECONDS = 5.0


@dataclass
class Probe:
    """The load server's stats routes, called off the event loop."""

    http: HttpClient

    async def state(self) -> dict[str, Any]:
        """``GET /load/stats``: pid, open sockets, memory, CPU time, HTTP connections seen."""
        return await asyncio.to_thread(self.http.get_json, STATS_PATH)

    async def reset(self) -> None:
        """``POST /load/reset``: the peak RSS and the HTTP connections seen start over."""
        await asyncio.to_thread(self.http.post_json, RESET_PATH)


@dataclass
class Load:
    """What every side of a run shares: where the server is, the options, the chains and
    their HTTP bodies, the run's deadline."""

    base_url: str
    pid: int
    options: LoadOptions
    chains: list[Chain]
    bodies: list[list[bytes]]
    deadline: float
    probe: Probe


async def run_side(load: Load, side: SideReport) -> None:
    """Run one round of `side` (its ``transport``), adding what it measured to it."""
    options = load.options
    await load.probe.reset()
    rss_start = (await load.probe.state())["memory"]["rss"] or 0
    sampler = PeakSampler(load.pid)
    sampler.start()
    tally = Tally(expected=options.connections)
    gate = asyncio.Semaphore(options.connect_concurrency)
    start = asyncio.Event()
    tls = ssl.create_default_context()
    clients = [
        asyncio.create_task(_client(load, side.transport, index, tally, gate, start, tls))
        for index in range(options.connections)
    ]
    try:
        # Every client is connected before the first turn starts.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.1, load.deadline - time.monotonic())):
                await tally.all_settled.wait()
        before = await load.probe.state()
        client_cpu = time.process_time()
        began = time.perf_counter()
        start.set()
        left = max(0.1, load.deadline - time.monotonic())
        _done, pending = await asyncio.wait(clients, timeout=left)
        seconds = time.perf_counter() - began
        client_cpu = time.process_time() - client_cpu
        after = await load.probe.state()
        if pending:
            tally.error("duration", f"{len(pending)} clients still running at the cap")
    finally:
        tally.stopped = True
        for client in clients:
            client.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
        sampler.stop()
    closed = await _closed(load.probe)
    if closed["connections"] != 0:
        tally.error("connections_left_open", f"{closed['connections']} sockets still open")
    if side.transport == "websocket":
        seen = before["connections"]  # open at once, before the first turn
        side.server_connections = seen if not side.rounds else min(side.server_connections, seen)
    else:
        side.server_connections = max(side.server_connections, after["http_connections"])
    side.rounds += 1
    side.connections_expected = (
        options.connections if side.transport == "websocket" else options.conversations
    )
    side.connections += tally.connected
    side.conversations = max(side.conversations, tally.lanes)
    side.turns += tally.turns
    side.turns_expected += options.turns * options.conversations
    side.seconds += seconds
    side.latencies.extend(tally.latencies)
    for kind, count in tally.errors.items():
        side.errors[kind] = side.errors.get(kind, 0) + count
    side.error_samples.extend(tally.samples[: max(0, 20 - len(side.error_samples))])
    side.server_cpu_seconds += after["cpu_seconds"] - before["cpu_seconds"]
    side.client_cpu_seconds += client_cpu
    peak = max(closed["memory"]["peak"] or 0, sampler.peak)
    side.rss_rounds.append([rss_start, peak])
    side.rss_start = max(side.rss_start, rss_start)
    side.rss_peak = max(side.rss_peak, peak)


def _client(
    load: Load,
    transport: str,
    index: int,
    tally: Tally,
    gate: asyncio.Semaphore,
    start: asyncio.Event,
    tls: ssl.SSLContext,
) -> Coroutine[Any, Any, None]:
    if transport == "websocket":
        return run_client(index, load.base_url, load.options, load.chains, tally, gate, start)
    return run_http_client(
        index, load.base_url, load.options, load.chains, load.bodies, tally, gate, start, tls
    )


async def _closed(probe: Probe) -> dict[str, Any]:
    """The server's state once it closed the sockets the clients closed (or gave up)."""
    state = await probe.state()
    deadline = time.monotonic() + CLOSE_WAIT_SECONDS
    while state["connections"] and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        state = await probe.state()
    return state
