"""The per-turn microbenchmark of ``ws-mode bench``: ws_mode's own CPU per socket turn.

:func:`forwarding_cost_in_process` (:mod:`ws_mode.toolkit.bench.forward`) measures what one
event costs; this measures what a whole turn costs beyond its events' share: the client event
parsed and validated, the lane, the turn runner, the in-process handler call and its scope, the
SSE decoding, the response cached, the records, the budget, the tasks. A raw ASGI handler
(:class:`TurnHandler`) answers each turn with a 13-event tool-call stream in one body chunk, as a
fast server writes it; the middleware in front of it is driven in-process by a stand-in server
(no socket, no framing) through short chains (a fresh conversation every
:data:`CHAIN_TURNS` turns), one turn after the other, each request sent once the previous turn
has wound down (as over a network, where the next request comes a round trip later). What the
handler takes by itself on the same requests is measured right after and subtracted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Final, Literal

import orjson
from starlette.types import Message, Receive, Scope, Send

from ws_mode._middleware import WebSocketModeMiddleware

from .in_process import event_loop_runner, socket_scope

__all__ = [
    "CHAIN_TURNS",
    "TURN_EVENTS",
    "TURN_PATH",
    "TurnBenchError",
    "TurnHandler",
    "drive_turns",
    "turn_cost_in_process",
]

TURN_PATH: Final = "/turns/v1/responses"
#: Turns per conversation: then a fresh one starts (short chains, as the load test runs).
CHAIN_TURNS: Final = 5
#: The events of each turn's answer.
TURN_EVENTS: Final = 13
#: Passes of the event loop the client lets go by after a turn's terminal event before it
#: sends the next request: enough for the turn's tasks to end, as they have over a network.
_SETTLE_PASSES: Final = 4
_SSE_HEADERS: Final = [(b"content-type", b"text/event-stream")]
_OUTPUT: Final = "x" * 1024


class TurnBenchError(Exception):
    """A turn of the benchmark did not end with ``response.completed``."""


def _answer(number: int, previous_response_id: str | None) -> bytes:
    """The SSE answer of turn `number`: a function call, its arguments in 7 deltas."""
    response_id = f"resp_{number:032x}"
    item = {
        "type": "function_call",
        "id": f"fc_{number:032x}",
        "call_id": f"call_{number:024x}",
        "name": "lookup",
        "arguments": "",
        "status": "in_progress",
    }
    response: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "status": "in_progress",
        "model": "turns",
        "output": [],
        # A stateless server echoes what it was sent (None when sent the whole context).
        "previous_response_id": previous_response_id,
        "created_at": 0,
    }
    arguments = f'{{"query":"item {number}"}}'
    done = {**item, "arguments": arguments, "status": "completed"}
    where = {"item_id": item["id"], "output_index": 0}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response},
        {"type": "response.in_progress", "response": response},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        *(
            {"type": "response.function_call_arguments.delta", **where, "delta": delta}
            for delta in ('{"', "query", '":"', "item", " ", str(number), '"}')
        ),
        {"type": "response.function_call_arguments.done", **where, "arguments": arguments},
        {"type": "response.output_item.done", "output_index": 0, "item": done},
        {
            "type": "response.completed",
            "response": {**response, "status": "completed", "output": [done]},
        },
    ]
    chunks = []
    for sequence_number, event in enumerate(events):
        event["sequence_number"] = sequence_number
        kind: str = event["type"]
        chunks.append(b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n")
    return b"".join(chunks)


class TurnHandler:
    """A raw ASGI ``POST`` handler answering every request with one tool call
    (:data:`TURN_EVENTS` SSE events in one body chunk). It reads the request as a server
    would (decodes it) and keeps each body it was sent (``bodies``), so that what it takes by
    itself can be measured on the same requests."""

    def __init__(self) -> None:
        self.turns = 0
        self.bodies: list[bytes] = []
        #: The id of the last response it answered.
        self.last_id = ""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.bodies.append(body)
        request = orjson.loads(body)
        self.turns += 1
        self.last_id = f"resp_{self.turns:032x}"
        answer = _answer(self.turns, request.get("previous_response_id"))
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        await send({"type": "http.response.body", "body": answer, "more_body": False})


def _create(turn: int, previous: str | None, call_id: str) -> str:
    """The client's frame for `turn`: a fresh conversation every `CHAIN_TURNS` turns, else
    the tool's output continuing `previous`."""
    event: dict[str, Any] = {"type": "response.create", "model": "turns"}
    if previous is None or turn % CHAIN_TURNS == 0:
        event["input"] = [{"type": "message", "role": "user", "content": "look it up"}]
    else:
        event["previous_response_id"] = previous
        event["input"] = [{"type": "function_call_output", "call_id": call_id, "output": _OUTPUT}]
    return orjson.dumps(event).decode()


async def _settle() -> None:
    for _ in range(_SETTLE_PASSES):
        await asyncio.sleep(0)


async def drive_turns(app: WebSocketModeMiddleware, handler: TurnHandler, turns: int) -> float:
    """`turns` turns on one socket through `app` (in front of `handler`), from a stand-in
    server whose `send` only watches for each turn's terminal event; the process CPU seconds
    the turns took (the socket's opening and closing left out). Raises `TurnBenchError` when
    a turn fails."""
    loop = asyncio.get_running_loop()
    incoming: asyncio.Queue[Message] = asyncio.Queue()
    ended: list[asyncio.Future[str]] = []

    async def receive() -> Message:
        return await incoming.get()

    async def send(message: Message) -> None:
        if message["type"] != "websocket.send":
            return
        head = message.get("text", "")[:48]
        if '"response.completed"' in head:
            ended[0].set_result("")
        elif '"error"' in head or '"response.failed"' in head or '"response.incomplete"' in head:
            ended[0].set_exception(TurnBenchError(f"a turn failed: {message['text'][:300]}"))

    incoming.put_nowait({"type": "websocket.connect"})
    task = asyncio.create_task(app(socket_scope(TURN_PATH), receive, send))
    previous: str | None = None
    started = time.process_time()
    try:
        for number in range(turns):
            ended[:] = [loop.create_future()]
            call_id = f"call_{handler.turns:024x}"
            incoming.put_nowait(
                {"type": "websocket.receive", "text": _create(number, previous, call_id)}
            )
            await ended[0]
            previous = handler.last_id
            await _settle()
        return time.process_time() - started
    finally:
        incoming.put_nowait({"type": "websocket.disconnect", "code": 1000})
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _handler_alone(handler: TurnHandler, bodies: list[bytes]) -> float:
    """The CPU seconds `handler` takes by itself on `bodies` (its sends doing nothing), each
    request followed by the same passes of the event loop as through the middleware."""

    async def send(message: Message) -> None:
        return None

    scope: dict[str, Any] = {"type": "http"}
    started = time.process_time()
    for body in bodies:

        async def receive(body: bytes = body) -> Message:
            return {"type": "http.request", "body": body, "more_body": False}

        await handler(scope, receive, send)
        await _settle()
    return time.process_time() - started


def turn_cost_in_process(
    turns: int,
    *,
    repeat: int = 5,
    full_context: Literal["always", "on_miss"] = "always",
) -> list[float]:
    """ws_mode's own CPU seconds per socket turn, one value per repetition (after one warm-up):
    `turns` turns through the middleware (``full_context`` as the middleware's: ``always``,
    drop-in; ``on_miss``, cache-aware) in front of :class:`TurnHandler`, no socket, less what
    the handler takes by itself on the same requests. On uvloop when it is installed (as the
    servers run), like the per-event figure. Process CPU time, so other processes on the
    machine do not count; the stand-in client's own small share (queueing each request,
    spotting each terminal event) is counted in."""
    handler = TurnHandler()
    app = WebSocketModeMiddleware(handler, path=TURN_PATH, full_context=full_context)

    async def measure() -> list[float]:
        await drive_turns(app, handler, min(turns, 100))
        costs = []
        for _ in range(repeat):
            handler.bodies.clear()
            through = await drive_turns(app, handler, turns)
            alone = await _handler_alone(TurnHandler(), list(handler.bodies))
            costs.append(max(through - alone, 0.0) / turns)
        return costs

    return event_loop_runner()(measure())
