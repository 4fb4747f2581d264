"""The event-forwarding microbenchmark of ``ws-mode bench``: its handler, its client, its result.

A handler (:class:`ForwardHandler`) streams ``events`` small ``response.output_text.delta`` SSE
events through the middleware to a websockets client; a bare Starlette WebSocket endpoint sends
the same frames (:func:`forward_frames`), already encoded, to the same client (both served by
:mod:`ws_mode.toolkit.bench.server`). The benchmark reports events/s for both, their ratio, and the
server's CPU time per event.

:func:`forwarding_cost_in_process` isolates ws_mode's own share: the middleware in front of the
same handler, driven by a stand-in ASGI server whose ``send`` does nothing (no socket, no
framing), so the CPU time it measures is the handler's ASGI sends plus ws_mode's work. Its
per-turn counterpart is :func:`ws_mode.toolkit.bench.turns.turn_cost_in_process`, whose figures
`ws-mode bench` keeps on the same :class:`ForwardResult`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeVar

import orjson
from starlette.types import Message, Receive, Scope, Send

from ws_mode._middleware import WebSocketModeMiddleware
from ws_mode._turn import Turn, turn
from ws_mode.testing._client import FrameError, connect_async, decode_event

from ..measure import median
from .in_process import event_loop_runner, socket_scope

__all__ = [
    "BARE_PATH",
    "FORWARD_HANDLER_PATH",
    "FORWARD_PATH",
    "OBJECTS_HANDLER_PATH",
    "OBJECTS_PATH",
    "ForwardError",
    "ForwardHandler",
    "ForwardResult",
    "StatsControl",
    "forward_frames",
    "forwarding_cost_in_process",
    "run_forward",
]

_T = TypeVar("_T")

FORWARD_PATH: Final = "/forward/v1/responses"
FORWARD_HANDLER_PATH: Final = "/forward/handler"
#: The same stream, its handler handing the events as objects (`Turn.send_event`).
OBJECTS_PATH: Final = "/forward/objects/v1/responses"
OBJECTS_HANDLER_PATH: Final = "/forward/objects/handler"
BARE_PATH: Final = "/forward/bare"
_DELTA_TEXT: Final = "tok "
_FORWARD_ITEM_ID: Final = "msg_forward"
_SSE_HEADERS: Final = [(b"content-type", b"text/event-stream")]


class ForwardError(Exception):
    """The forwarding stream was not what the benchmark expects."""


class StatsControl(Protocol):
    """The benchmark server's stats and profile routes, as :func:`run_forward` uses them."""

    def reset(self) -> dict[str, Any]: ...

    def read(self) -> dict[str, Any]: ...

    def start_profile(self, name: str) -> None: ...

    def stop_profile(self) -> None: ...


# ----------------------------------------------------------------------------- the handler


def _forward_response(response_id: str, status: str) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": 0,
        "status": status,
        "model": "forward",
        "output": [],
        "usage": None,
    }


def _delta(sequence_number: int) -> dict[str, Any]:
    return {
        "type": "response.output_text.delta",
        "item_id": _FORWARD_ITEM_ID,
        "output_index": 0,
        "content_index": 0,
        "delta": _DELTA_TEXT,
        "logprobs": [],
        "sequence_number": sequence_number,
    }


def _created(response_id: str) -> dict[str, Any]:
    return {
        "type": "response.created",
        "sequence_number": 0,
        "response": _forward_response(response_id, "in_progress"),
    }


def _completed(response_id: str, events: int) -> dict[str, Any]:
    return {
        "type": "response.completed",
        "sequence_number": events + 1,
        "response": _forward_response(response_id, "completed"),
    }


def forward_frames(events: int, response_id: str = "resp_forward") -> list[str]:
    """The frames of one forwarding response: ``response.created``, ``events`` deltas,
    ``response.completed``: exactly what the middleware sends for the handler's stream."""
    deltas = [_delta(number) for number in range(1, events + 1)]
    frames = (_created(response_id), *deltas, _completed(response_id, events))
    return [orjson.dumps(event).decode() for event in frames]


def _sse(event: dict[str, Any]) -> bytes:
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


class ForwardHandler:
    """A raw ASGI ``POST`` handler streaming ``events`` pre-encoded deltas as SSE, ``batch``
    events per body chunk, between a ``response.created`` and a ``response.completed``.

    With ``objects``, a turn of ws_mode's gets the same events handed as objects instead
    (:meth:`ws_mode.Turn.send_event`, the deltas built beforehand), and its answer is empty.

    It does no work per event beyond handing the chunk (or the object) on: what it costs is
    the middleware's forwarding, not the handler."""

    def __init__(self, events: int, batch: int, *, objects: bool = False) -> None:
        deltas = [_sse(_delta(number)) for number in range(1, events + 1)]
        size = max(1, batch)
        self.chunks = [b"".join(deltas[i : i + size]) for i in range(0, len(deltas), size)]
        self.events = events
        self.objects = objects
        self.delta_objects = [_delta(number) for number in range(1, events + 1)] if objects else []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:  # read the request body
            message = await receive()
            more = message.get("more_body", False)
        response_id = "resp_" + secrets.token_hex(8)
        current = turn(scope) if self.objects else None
        if current is not None:
            await current.send_event(_created(response_id))
            for delta in self.delta_objects:
                await current.send_event(delta)
            await current.send_event(_completed(response_id, self.events))
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            await send({"type": "http.response.body", "body": b""})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": _SSE_HEADERS,
            }
        )
        created = _sse(_created(response_id))
        await send({"type": "http.response.body", "body": created, "more_body": True})
        for chunk in self.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        completed = _sse(_completed(response_id, self.events))
        await send({"type": "http.response.body", "body": completed, "more_body": False})


# ----------------------------------------------------------------------------- the client


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
    #: The same through the middleware, the handler handing its events as objects.
    objects_rates: list[float] = field(default_factory=list)
    objects_cpu: list[float] = field(default_factory=list)
    in_process_objects_cpu: list[float] = field(default_factory=list)
    #: ws_mode's own CPU seconds per socket turn, in-process (:mod:`ws_mode.toolkit.bench.turns`),
    #: drop-in (``full_context="always"``) and cache-aware (``"on_miss"``).
    in_process_turn_cpu: list[float] = field(default_factory=list)
    in_process_cache_aware_turn_cpu: list[float] = field(default_factory=list)

    @property
    def bare_rate(self) -> float:
        """Events per second from the bare endpoint (median)."""
        return median(self.bare_rates)

    @property
    def middleware_rate(self) -> float:
        """Events per second through the middleware (median)."""
        return median(self.middleware_rates)

    @property
    def ratio(self) -> float:
        """The middleware's rate over the bare endpoint's."""
        return self.middleware_rate / self.bare_rate if self.bare_rate else math.nan

    @property
    def bare_cpu_per_event(self) -> float:
        """Server CPU seconds per event, bare endpoint (median; nan when not measured)."""
        return median(self.bare_cpu)

    @property
    def middleware_cpu_per_event(self) -> float:
        """Server CPU seconds per event, through the middleware (median)."""
        return median(self.middleware_cpu)

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
        return median(self.in_process_cpu)

    @property
    def objects_rate(self) -> float:
        """Events per second through the middleware, handed as objects (median)."""
        return median(self.objects_rates)

    @property
    def objects_cpu_per_event(self) -> float:
        """Server CPU seconds per event, handed as objects (median; nan when not measured)."""
        return median(self.objects_cpu)

    @property
    def objects_cpu_ratio(self) -> float:
        """The bare endpoint's server CPU per event over the middleware's with events handed
        as objects (nan when not measured)."""
        if not self.bare_cpu or not self.objects_cpu:
            return math.nan
        return self.bare_cpu_per_event / self.objects_cpu_per_event

    @property
    def in_process_objects_cpu_per_event(self) -> float:
        """ws_mode's own CPU seconds per event handed as an object, with no socket (median)."""
        return median(self.in_process_objects_cpu)

    @property
    def in_process_cpu_per_turn(self) -> float:
        """ws_mode's own CPU seconds per socket turn, drop-in, with no socket (median)."""
        return median(self.in_process_turn_cpu)

    @property
    def in_process_cache_aware_cpu_per_turn(self) -> float:
        """ws_mode's own CPU seconds per socket turn, cache-aware, with no socket (median)."""
        return median(self.in_process_cache_aware_turn_cpu)


async def _receive_stream(base_url: str, path: str, frames: int, compression: bool) -> float:
    """Open a socket, ask for one response, read ``frames`` frames; the seconds from sending
    the request to the last frame. The frames are counted, not decoded, but the last one."""
    request = {"type": "response.create", "model": "forward", "input": []}
    async with await connect_async(base_url, path, compression=compression) as socket:
        started = time.perf_counter()
        await socket.send(request)
        last: str | bytes = ""
        for _ in range(frames):
            last = await socket.receive_frame()
        elapsed = time.perf_counter() - started
    try:
        kind = decode_event(last).get("type")
    except FrameError:
        kind = None
    if kind != "response.completed":
        raise ForwardError(
            f"the forwarding stream did not end with response.completed: {last[:200]!r}"
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
    compression: bool = False,
) -> ForwardResult:
    """Measure event forwarding against a running :mod:`ws_mode.toolkit.bench.server` started with
    ``forward_events=events`` (and ``forward_batch=batch``): the bare endpoint, the
    middleware and the middleware with events handed as objects take turns, ``repeat`` times
    each. With ``control``, the server's CPU time per
    event is measured too; with ``compression``, the sockets ask for permessage-deflate."""
    targets = {"bare": BARE_PATH, "middleware": FORWARD_PATH, "objects": OBJECTS_PATH}
    result = ForwardResult(events=events, batch=batch)
    rates = {"bare": result.bare_rates, "middleware": result.middleware_rates}
    rates["objects"] = result.objects_rates
    cpus = {"bare": result.bare_cpu, "middleware": result.middleware_cpu}
    cpus["objects"] = result.objects_cpu
    frames = events + 2  # response.created, the deltas, response.completed
    if warmup:
        for path in targets.values():
            asyncio.run(_receive_stream(base_url, path, frames, compression))
    order = list(targets)
    for repetition in range(repeat):
        shift = repetition % len(order)
        for name in order[shift:] + order[:shift]:
            before = control.reset() if control is not None else None
            if control is not None:
                control.start_profile(f"forward-{name}")
            try:
                elapsed = asyncio.run(_receive_stream(base_url, targets[name], frames, compression))
            finally:
                if control is not None:
                    control.stop_profile()
            rates[name].append(events / elapsed)
            if control is not None and before is not None:
                cpu = control.read()["cpu_seconds"] - before["cpu_seconds"]
                cpus[name].append(cpu / events)
    return result


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
    task = asyncio.create_task(app(socket_scope(FORWARD_PATH), receive, send))
    await done.wait()
    elapsed = time.process_time() - started
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return elapsed


async def _handler_alone(handler: ForwardHandler, events: int) -> float:
    """The CPU seconds the forwarding handler takes by itself, its sends (and the events it
    hands a Turn) doing nothing."""

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        return None

    async def hand(event: dict[str, Any] | bytes) -> None:
        return None

    scope: dict[str, Any] = {"type": "http"}
    if handler.objects:
        stand_in = Turn(previous=None, new_input=[])
        stand_in.bind_events(hand)
        scope["extensions"] = {"ws_mode": stand_in}
    started = time.process_time()
    await handler(scope, receive, send)
    return time.process_time() - started


def forwarding_cost_in_process(
    events: int, *, batch: int = 1, repeat: int = 5, objects: bool = False
) -> list[float]:
    """ws_mode's own CPU seconds per forwarded event, one value per repetition (after one
    warm-up): the middleware in front of the forwarding handler, to a server `send` that does
    nothing, no socket, less what the handler takes by itself (measured right after, with
    sends that do nothing). Process CPU time, so other processes on the machine do not count.
    With ``objects``, the handler hands its events as objects (``Turn.send_event``) instead
    of SSE."""
    handler = ForwardHandler(events, batch, objects=objects)
    app = WebSocketModeMiddleware(handler, path=FORWARD_PATH)

    async def measure() -> list[float]:
        await _one_stream_in_process(app, events)
        await _handler_alone(handler, events)
        costs = []
        for _ in range(repeat):
            through = await _one_stream_in_process(app, events)
            alone = await _handler_alone(handler, events)
            costs.append(max(through - alone, 0.0) / events)
        return costs

    return event_loop_runner()(measure())
