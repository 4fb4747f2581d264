"""What a client's frames make the server hold, measured as RSS.

A real uvicorn server with ws_mode's `BatchingWebSocketProtocol` runs in a child process (so
only its own memory counts), and real `websockets` clients negotiate permessage-deflate with it:
a 36 MiB create is about 36 KiB on the wire. The rule of docs/limits.md: for every shape, the
worker's RSS growth stays within 1.5 x `max_memory_bytes` plus the per-socket overhead
(`_budget.CONNECTION_COST`) per socket.

- Refused frames: every socket sends one create too large for the budget, which refuses it
  unread. Before, each socket kept two copies of it while it stayed open: the receive loop's last
  message, and the payload websockets' parser keeps until the next frame.
- A client that stops reading and keeps sending: while the receive loop's answer waits on a
  client that does not read, uvicorn read the next frame, inflated it and queued it (and the
  loop held the frame it answered), for up to `max_send_stall_seconds`. Now the frame is let go
  before its answer is sent, and the next frame stays compressed, unread, until the receive loop
  asks for it.

- Messages left unfinished: every socket sends the first two fragments of a message (frames
  without FIN, 36 MiB each, a few KiB on the wire) and holds back the last. Before, the ASGI
  server's protocol kept every fragment, outside the budget, until the message ended; now the
  fragments are counted as they come, and those the budget cannot hold are let go at once.

The frames are over 32 MiB so that glibc gives each its own mapping, returned to the system when
it is freed: what RSS shows is what is still held.
"""

from __future__ import annotations

import contextlib
import json
import threading
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

from tests.rss_server import (
    RSS,
    SERVE,
    MiB,
    child_server,
    held_rss,
    sending,
    stats,
    unfinished_message,
    wait_for,
)
from ws_mode._budget import CONNECTION_COST

BUDGET = 64 * MiB
SOCKETS = 6
#: One create of this many characters: refused by the budget (16 times it would be reserved to
#: parse it), each copy of it its own mapping.
FRAME_CHARS = 36 * MiB
BOUND = 1.5 * BUDGET + SOCKETS * CONNECTION_COST

SERVER = (
    RSS
    + """
import asyncio, base64, os, sys
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from ws_mode import Limits, WebSocketModeMiddleware
from ws_mode.testing._loopback import ServerThread

MESSAGE_BYTES = 80 * 1024 * 1024  # two of the fragments below, their message unfinished
state = {"deltas": 0}
#: Random text does not deflate: the flood fills the client's buffers.
DELTA = base64.b64encode(os.urandom(48 * 1024)).decode()

async def stats(request):
    if request.query_params.get("reset_peak"):
        reset_peak_rss()
    return JSONResponse({"rss": rss(), "peak": peak_rss(), **state,
                         **middleware.stats.snapshot()})

def sse(event):
    return f"event: {event['type']}\\ndata: {json.dumps(event)}\\n\\n"

async def flood():
    response = {"id": "resp_flood" + os.urandom(8).hex(), "object": "response",
                "status": "in_progress", "model": "flood", "output": []}
    yield sse({"type": "response.created", "sequence_number": 0, "response": response})
    number = 1
    while True:  # until the turn is cancelled
        yield sse({"type": "response.output_text.delta", "sequence_number": number,
                   "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": DELTA})
        number += 1
        state["deltas"] += 1

async def handler(request):
    body = await request.json()
    if body["model"] == "flood":
        return StreamingResponse(flood(), media_type="text/event-stream")
    return JSONResponse({"id": "resp_" + os.urandom(8).hex(), "object": "response",
                         "status": "completed", "model": body["model"], "output": []})

import json
app = Starlette(routes=[Route("/stats", stats), Route("/v1/responses", handler, methods=["POST"])])
limits = Limits(max_memory_bytes=int(sys.argv[1]), max_message_bytes=MESSAGE_BYTES)
middleware = WebSocketModeMiddleware(app, limits=limits)
"""
    + SERVE
)


def _create(**fields: Any) -> str:
    return json.dumps({"type": "response.create", "model": "m", **fields})


def _huge_create() -> str:
    return _create(generate=False, input="x" * FRAME_CHARS)


def _next(socket: ClientConnection) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(socket.recv(timeout=60))
    return event


def _terminal(socket: ClientConnection) -> dict[str, Any]:
    while (event := _next(socket))["type"] not in ("response.completed", "error"):
        pass
    return event


def _open(url: str, count: int, stack: contextlib.ExitStack) -> list[ClientConnection]:
    sockets = [stack.enter_context(connect(url, close_timeout=0.2)) for _ in range(count)]
    extensions = sockets[0].response.headers.get("Sec-WebSocket-Extensions", "")
    assert "permessage-deflate" in extensions
    return sockets


def _baseline(base_url: str, url: str) -> int:
    """The server's RSS once every code path below has run on a small frame."""
    with connect(url) as socket:
        socket.send(_create(input="hi"))
        assert _terminal(socket)["type"] == "response.completed"
    rss: int = wait_for(base_url, lambda s: s["connections_open"] == 0)["rss"]
    return rss


def test_refused_frames_are_not_kept_while_their_sockets_stay_open() -> None:
    with child_server(SERVER, str(BUDGET)) as base_url, contextlib.ExitStack() as stack:
        url = base_url.replace("http", "ws", 1) + "/v1/responses"
        before = _baseline(base_url, url)
        sockets = _open(url, SOCKETS, stack)
        huge = _huge_create()
        for socket in sockets:
            socket.send(huge)
            error = _next(socket)
            assert (error["type"], error["error"]["code"]) == ("error", "server_is_overloaded")
        held = stats(base_url)
        growth = held["rss"] - before
        assert held["memory_refusals"] == SOCKETS
        assert growth <= BOUND, (
            f"RSS grew {growth / MiB:.0f} MiB with {SOCKETS} refused frames of "
            f"{FRAME_CHARS / MiB:.0f} MiB held by open sockets; the rule allows {BOUND / MiB:.0f}"
        )
        for socket in sockets:  # each socket still serves turns
            socket.send(_create(input="again"))
            assert _terminal(socket)["type"] == "response.completed"


def test_a_client_that_stops_reading_cannot_queue_frames() -> None:
    with child_server(SERVER, str(BUDGET)) as base_url, contextlib.ExitStack() as stack:
        url = base_url.replace("http", "ws", 1) + "/v1/responses"
        before = _baseline(base_url, url)
        sockets = _open(url, SOCKETS, stack)
        for socket in sockets:  # a turn whose events the client never reads
            socket.send(_create(model="flood", stream_id="flood", input="go"))
        # The floods stall: the server's writes to every socket wait on its client.
        seen = [-1]
        while seen[-10:] != [seen[-1]] * 10:  # no delta made over ten polls
            seen.append(stats(base_url)["deltas"])
        huge = _huge_create()
        for socket in sockets:  # refused, its answer waiting behind the flood; then one more
            socket.send(huge)
            socket.send(huge)
        held = wait_for(base_url, lambda s: s["memory_refusals"] == SOCKETS)
        for _ in range(25):  # what the server reads meanwhile shows in its RSS
            held = stats(base_url)
            if held["rss"] - before > BOUND:
                break
        growth = held["rss"] - before
        assert held["memory_refusals"] == SOCKETS  # the second frames are not read
        assert growth <= BOUND, (
            f"RSS grew {growth / MiB:.0f} MiB with {SOCKETS} clients not reading, each having "
            f"sent two {FRAME_CHARS / MiB:.0f} MiB frames; the rule allows {BOUND / MiB:.0f}"
        )


#: One fragment of the unfinished messages (the server's message size limit holds two): the
#: budget holds one at a time.
FRAGMENT_CHARS = 36 * MiB


def test_messages_left_unfinished_hold_no_more_than_the_budget() -> None:
    with child_server(SERVER, str(BUDGET)) as base_url, contextlib.ExitStack() as stack:
        url = base_url.replace("http", "ws", 1) + "/v1/responses"
        before = _baseline(base_url, url)
        sockets = _open(url, SOCKETS, stack)
        finishing = threading.Event()
        start = '{"type": "response.create", "model": "m", "generate": false, "input": "'
        with sending(sockets, lambda: unfinished_message(start, FRAGMENT_CHARS, finishing)):
            # Every socket's fragments have reached the server, each message refused at its
            # first fragment or its second; or the rule is broken.
            growth = held_rss(base_url, before, BOUND, SOCKETS)["rss"] - before
            finishing.set()
        assert growth <= BOUND, (
            f"RSS grew {growth / MiB:.0f} MiB with {SOCKETS} messages left unfinished after two "
            f"{FRAGMENT_CHARS / MiB:.0f} MiB fragments each; the rule allows {BOUND / MiB:.0f}"
        )
        for socket in sockets:  # each message refused, each socket still serving turns
            refused = _next(socket)
            assert (refused["type"], refused["error"]["code"]) == (
                "error",
                "server_is_overloaded",
            )
            socket.send(_create(input="again"))
            assert _terminal(socket)["type"] == "response.completed"


#: The messages sent each in one compressed frame: about 60 KiB on the wire, inflated to more
#: than the budget holds (twice it, the bytes and the text decoded from them, is reserved).
INFLATED_CHARS = 60 * MiB


def test_a_frame_is_inflated_within_the_budget() -> None:
    with child_server(SERVER, str(BUDGET)) as base_url, contextlib.ExitStack() as stack:
        url = base_url.replace("http", "ws", 1) + "/v1/responses"
        before = _baseline(base_url, url)
        sockets = _open(url, SOCKETS, stack)
        huge = _create(generate=False, input="x" * INFLATED_CHARS)
        httpx.get(base_url + "/stats", params={"reset_peak": "1"}, timeout=10)  # from here
        # Each client compresses its message as one frame (websockets sends a message whole);
        # the clients send at once.
        with sending(sockets, lambda: huge):
            pass
        held = wait_for(base_url, lambda s: s["memory_refusals"] == SOCKETS)
        growth = held["peak"] - before
        assert growth <= BOUND, (
            f"the peak RSS grew {growth / MiB:.0f} MiB while {SOCKETS} sockets each sent a "
            f"{INFLATED_CHARS / MiB:.0f} MiB message in one compressed frame; the rule allows "
            f"{BOUND / MiB:.0f}"
        )
        for socket in sockets:  # each message refused, each socket still serving turns
            refused = _next(socket)
            assert (refused["type"], refused["error"]["code"]) == (
                "error",
                "server_is_overloaded",
            )
            socket.send(_create(input="again"))
            assert _terminal(socket)["type"] == "response.completed"
