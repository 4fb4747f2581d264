"""The process-wide memory budget (`Limits.max_memory_bytes`), measured as RSS.

A real uvicorn server runs in a child process (so only its own memory counts) and real
`websockets` clients speak permessage-deflate to it: each frame is a few kilobytes on the wire
and about 10 MiB once its tiny items are decoded. Without a process-wide budget every socket
held what its own bounds allowed; with one, the server's growth stays within a small multiple
of the budget, work past it is refused (`server_is_overloaded`, 503) on a connection that
keeps its cached responses, a socket opened meanwhile is refused before it is accepted, and
the account is back at zero once every socket has closed.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.rss_server import RSS, SERVE, MiB, child_server, stats, wait_for

BUDGET = 64 * MiB
SOCKETS = 8
FRAMES = 6  # per socket: 48 frames of about 11 MiB each once decoded and cached
ITEMS = 30_000  # tiny items per frame: about 0.9 MB of JSON, parsed in place (under 1 MiB)

SERVER = (
    RSS
    + """
import os, sys, threading
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from ws_mode import Limits, WebSocketModeMiddleware
from ws_mode.testing._loopback import ServerThread

async def stats(request):
    return JSONResponse({"rss": rss(), **middleware.stats.snapshot()})

async def handler(request):
    return JSONResponse({"error": {"type": "server_error", "message": "unused"}}, 500)

app = Starlette(routes=[Route("/stats", stats), Route("/v1/responses", handler, methods=["POST"])])
middleware = WebSocketModeMiddleware(app, limits=Limits(max_memory_bytes=int(sys.argv[1])))
"""
    + SERVE
)


@pytest.fixture
def server() -> Iterator[str]:
    with child_server(SERVER, str(BUDGET)) as base_url:
        yield base_url


def _answer(socket: ClientConnection) -> dict[str, Any]:
    """The warm-up's terminal event, or the error that refused it."""
    while True:
        event: dict[str, Any] = json.loads(socket.recv(timeout=30))
        if event["type"] in ("response.completed", "error"):
            return event


def test_the_budget_bounds_what_compressed_sockets_pin(server: str) -> None:
    url = server.replace("http", "ws", 1) + "/v1/responses"
    items = ",".join(['{"role":"user","content":"x"}'] * ITEMS)
    frame = f'{{"type":"response.create","model":"m","generate":false,"input":[{items}]}}'
    with connect(url) as first:  # the code paths warm, so the baseline holds them
        first.send(json.dumps({"type": "response.create", "model": "m", "generate": False,
                               "input": "hi"}))  # fmt: skip
        assert _answer(first)["type"] == "response.completed"
    before = stats(server)["rss"]
    opened = contextlib.ExitStack()  # websockets' connect() is a context manager
    sockets = [opened.enter_context(connect(url, max_size=None)) for _ in range(SOCKETS)]
    try:
        extensions = sockets[0].response.headers.get("Sec-WebSocket-Extensions", "")
        assert "permessage-deflate" in extensions  # a few KB on the wire per frame
        answers: list[dict[str, Any]] = []
        for _ in range(FRAMES):
            for socket in sockets:
                socket.send(frame)
            answers.extend(_answer(socket) for socket in sockets)
        during = stats(server)
        refused = [a for a in answers if a["type"] == "error"]
        kept = [a["response"]["id"] for a in answers if a["type"] == "response.completed"]
        assert refused, "nothing was refused"
        assert {a["error"]["code"] for a in refused} == {"server_is_overloaded"}
        assert {(a["status"], a["error"]["type"]) for a in refused} == {(503, "server_error")}
        # Unbounded, the 48 frames pinned about 500 MiB; the budget holds it near 64 MiB.
        growth = during["rss"] - before
        assert growth < 3 * BUDGET, f"RSS grew {growth / MiB:.0f} MiB, budget {BUDGET / MiB} MiB"
        assert during["memory_bytes"] <= BUDGET
        assert during["memory_refusals"] >= len(refused)
        # With nothing else under way, one more such frame is refused, and so is a new
        # socket, before it is accepted.
        sockets[0].send(frame)
        assert _answer(sockets[0])["error"]["code"] == "server_is_overloaded"
        with pytest.raises(InvalidStatus) as refusal:
            connect(url)
        assert refusal.value.response.status_code == 503
        assert b"server_is_overloaded" in refusal.value.response.body
        # The refused connections kept what they had: once the others let go, a response
        # cached before the refusals is continued.
        ours = next(a for a in answers[::SOCKETS] if a["type"] == "response.completed")
        for socket in sockets[1:]:
            socket.close()
        wait_for(server, lambda stats: stats["connections_open"] == 1)
        sockets[0].send(json.dumps({"type": "response.create", "model": "m", "generate": False,
                                    "previous_response_id": ours["response"]["id"],
                                    "input": "more"}))  # fmt: skip
        assert _answer(sockets[0])["type"] == "response.completed"
        assert kept
    finally:
        opened.close()
    # Every reservation was given back: caches, sockets, frames.
    after = wait_for(server, lambda stats: stats["connections_open"] == 0)
    assert after["memory_bytes"] == 0
    assert after["memory_held_bytes"] == 0
