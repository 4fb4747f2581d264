"""The event-forwarding microbenchmark of ``ws-mode bench``.

A handler streams ``events`` small ``response.output_text.delta`` SSE events through the
middleware to a websockets client; a bare Starlette WebSocket endpoint sends the same frames,
already encoded, to the same client (both served by :mod:`ws_mode.bench_server`). The
benchmark reports events/s for both, their ratio, and the server's CPU time per event.

:func:`forwarding_cost_in_process` isolates ws_mode's own share: the middleware in front of the
same handler, driven by a stand-in ASGI server whose ``send`` does nothing (no socket, no
framing), so the CPU time it measures is the handler's ASGI sends plus ws_mode's work.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import statistics
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import orjson
from starlette.types import Message

from .bench_server import BARE_PATH, FORWARD_PATH, ForwardHandler
from .middleware import WebSocketModeMiddleware

__all__ = [
    "ForwardError",
    "ForwardResult",
    "StatsControl",
    "forwarding_cost_in_process",
    "run_forward",
]

_T = TypeVar("_T")


class ForwardError(Exception):
    """The forwarding stream was not what the benchmark expects."""


class StatsControl(Protocol):
    """The benchmark server's stats and profile routes, as :func:`run_forward` uses them."""

    def reset(self) -> dict[str, Any]: ...

    def read(self) -> dict[str, Any]: ...

    def start_profile(self, name: str) -> None: ...

    def stop_profile(self) -> None: ...


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


@dataclass
class ForwardResult:
    """The forwarding microbenchmark: events/s through the middleware and from the bare
    endpoint, the server's CPU time per event (medians over the repetitions), and ws_mode's
    own CPU time per event measured in-process."""

    events: int
    batch: int
    bare_rates: list[float] = field(default_factory=list)
    middleware_rates: list[float] = field(default_factory=list)
    bare_cpu: list[float] = field(default_factory=list)
    middleware_cpu: list[float] = field(default_factory=list)
    in_process_cpu: list[float] = field(default_factory=list)

    @property
    def bare_rate(self) -> float:
        """Events per second from the bare endpoint (median)."""
        return _median(self.bare_rates)

    @property
    def middleware_rate(self) -> float:
        """Events per second through the middleware (median)."""
        return _median(self.middleware_rates)

    @property
    def ratio(self) -> float:
        """The middleware's rate over the bare endpoint's."""
        return self.middleware_rate / self.bare_rate if self.bare_rate else math.nan

    @property
    def bare_cpu_per_event(self) -> float:
        """Server CPU seconds per event, bare endpoint (median; nan when not measured)."""
        return _median(self.bare_cpu)

    @property
    def middleware_cpu_per_event(self) -> float:
        """Server CPU seconds per event, through the middleware (median)."""
        return _median(self.middleware_cpu)

    @property
    def cpu_ratio(self) -> float:
        """The bare endpoint's server CPU per event over the middleware's: the throughput
        ratio of a server saturated by forwarding (nan when not measured)."""
        if not self.bare_cpu or not self.middleware_cpu:
            return math.nan
        return self.bare_cpu_per_event / self.middleware_cpu_per_event

    @property
    def in_process_cpu_per_event(self) -> float:
        """ws_mode's own CPU seconds per event, with no socket (median)."""
        return _median(self.in_process_cpu)


def _event_loop_runner() -> Callable[[Coroutine[Any, Any, _T]], _T]:
    """``uvloop.run`` when uvloop is installed (uvicorn then serves on it too), else
    ``asyncio.run``."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    run: Callable[[Coroutine[Any, Any, _T]], _T] = uvloop.run
    return run


async def _receive_stream(url: str, frames: int) -> float:
    """Open a socket, ask for one response, read ``frames`` frames; the seconds from sending
    the request to the last frame."""
    from websockets.asyncio.client import connect

    request = json.dumps({"type": "response.create", "model": "forward", "input": []})
    async with connect(url, max_size=None, compression=None) as socket:
        started = time.perf_counter()
        await socket.send(request)
        last: str | bytes = ""
        for _ in range(frames):
            last = await socket.recv()
        elapsed = time.perf_counter() - started
    text = last if isinstance(last, str) else last.decode()
    if '"response.completed"' not in text:
        raise ForwardError(
            f"the forwarding stream did not end with response.completed: {text[:200]}"
        )
    return elapsed


def run_forward(
    base_url: str,
    *,
    events: int,
    repeat: int,
    batch: int = 1,
    control: StatsControl | None = None,
    warmup: bool = True,
) -> ForwardResult:
    """Measure event forwarding against a running :mod:`ws_mode.bench_server` started with
    ``forward_events=events`` (and ``forward_batch=batch``): the bare endpoint and the
    middleware alternate, ``repeat`` times each. With ``control``, the server's CPU time per
    event is measured too."""
    socket_base = "ws://" + base_url.removeprefix("http://")
    targets = {"bare": socket_base + BARE_PATH, "middleware": socket_base + FORWARD_PATH}
    result = ForwardResult(events=events, batch=batch)
    frames = events + 2  # response.created, the deltas, response.completed
    if warmup:
        for url in targets.values():
            asyncio.run(_receive_stream(url, frames))
    order = list(targets)
    for repetition in range(repeat):
        for name in order[repetition % 2 :] + order[: repetition % 2]:
            before = control.reset() if control is not None else None
            if control is not None:
                control.start_profile(f"forward-{name}")
            try:
                elapsed = asyncio.run(_receive_stream(targets[name], frames))
            finally:
                if control is not None:
                    control.stop_profile()
            rates = result.bare_rates if name == "bare" else result.middleware_rates
            rates.append(events / elapsed)
            if control is not None and before is not None:
                cpu = control.read()["cpu_seconds"] - before["cpu_seconds"]
                (result.bare_cpu if name == "bare" else result.middleware_cpu).append(cpu / events)
    return result


_SCOPE: dict[str, Any] = {
    "type": "websocket",
    "asgi": {"version": "3.0"},
    "http_version": "1.1",
    "scheme": "ws",
    "path": FORWARD_PATH,
    "raw_path": FORWARD_PATH.encode(),
    "root_path": "",
    "query_string": b"",
    "headers": [(b"host", b"127.0.0.1")],
    "client": ("127.0.0.1", 50000),
    "server": ("127.0.0.1", 8000),
    "subprotocols": [],
    "extensions": {},
}


async def _one_stream_in_process(app: WebSocketModeMiddleware, events: int) -> float:
    """One response streamed through ``app`` to a stand-in server whose ``send`` does
    nothing; the CPU seconds it took."""
    request = orjson.dumps({"type": "response.create", "model": "forward", "input": []})
    incoming: list[Message] = [
        {"type": "websocket.connect"},
        {"type": "websocket.receive", "text": request.decode()},
    ]
    done = asyncio.Event()
    frames = 0
    wanted = events + 2

    async def receive() -> Message:
        if incoming:
            return incoming.pop(0)
        await done.wait()
        return {"type": "websocket.disconnect", "code": 1000}

    async def send(message: Message) -> None:
        nonlocal frames
        if message["type"] == "websocket.send":
            frames += 1
            if frames == wanted:
                done.set()

    started = time.process_time()
    task = asyncio.create_task(app(dict(_SCOPE), receive, send))
    await done.wait()
    elapsed = time.process_time() - started
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return elapsed


def forwarding_cost_in_process(events: int, *, batch: int = 1, repeat: int = 5) -> list[float]:
    """ws_mode's own CPU seconds per forwarded event, one value per repetition (after one
    warm-up): the middleware in front of the forwarding handler, no socket. Measured with
    process CPU time, so other processes on the machine do not count."""
    handler = ForwardHandler(events, batch)
    app = WebSocketModeMiddleware(handler, path=FORWARD_PATH)

    async def measure() -> list[float]:
        await _one_stream_in_process(app, events)
        return [await _one_stream_in_process(app, events) / events for _ in range(repeat)]

    return _event_loop_runner()(measure())
