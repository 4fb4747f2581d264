"""Full-context request bodies within the memory budget, measured as RSS.

Every continuation of a cached conversation hands its handler a new body of the whole chain
(`full_context="always"`, the default), which the handler holds while it runs, with its own
copy and the JSON decoded. A real uvicorn server runs in a child process (so only its own
memory counts), real `websockets` clients speak permessage-deflate to it, and several sockets
continue one large cached conversation on several lanes at once while the handler holds each
request. Before bodies were reserved, each lane held an uncounted copy of the conversation:
RSS grew several times the budget, which refused nothing. Now the worker's growth stays within
1.5 x `max_memory_bytes` plus the per-socket overhead, and the lanes past the budget are
refused (`server_is_overloaded`, 503) on sockets that keep their caches.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.rss_server import RSS, SERVE, MiB, child_server, stats, wait_for

BUDGET = 48 * MiB
SOCKETS = 4
LANES = 8  # per socket
#: The conversation: 4 frames of 0.5 MB (each parsed in place), one continuing the other.
FRAMES = 4
ITEM = {"role": "user", "content": "hello world " * 8}
ITEMS = 4_000  # per frame: about 0.5 MB of JSON
#: What an idle socket costs (docs/limits.md, `max_memory_bytes`).
SOCKET_OVERHEAD = 64 * 1024

SERVER = (
    RSS
    + """
import asyncio, sys, time
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from ws_mode import Limits, WebSocketModeMiddleware
from ws_mode.testing._loopback import ServerThread

state = {"holding": 0}
release = asyncio.Event()  # set once: every handler held until then goes on

async def stats(request):
    snapshot = middleware.stats.snapshot()
    return JSONResponse({"rss": rss(), "holding": state["holding"], **snapshot})

async def let_go(request):
    release.set()
    return JSONResponse({})

async def handler(request):
    body = await request.json()  # held, decoded, until the test lets go
    if body["model"] != "quick":
        state["holding"] += 1
        try:
            await release.wait()
        finally:
            state["holding"] -= 1
    item = {"type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": str(len(body["input"])),
                         "annotations": []}]}
    return JSONResponse({"id": f"resp_{time.monotonic_ns()}", "object": "response",
                         "status": "completed", "output": [item]})

app = Starlette(routes=[Route("/stats", stats), Route("/release", let_go, methods=["POST"]),
                        Route("/v1/responses", handler, methods=["POST"])])
middleware = WebSocketModeMiddleware(app, limits=Limits(max_memory_bytes=int(sys.argv[1])))
"""
    + SERVE
)


@pytest.fixture
def server() -> Iterator[str]:
    with child_server(SERVER, str(BUDGET)) as base_url:
        yield base_url


def _terminal(socket: ClientConnection) -> dict[str, Any]:
    while True:
        event: dict[str, Any] = json.loads(socket.recv(timeout=60))
        if event["type"] in ("response.completed", "response.failed", "error"):
            return event


def _conversation(socket: ClientConnection) -> str:
    """Cache the large conversation on `socket` (warm-ups: no handler, no body); its last id."""
    previous = None
    for _ in range(FRAMES):
        create = {"type": "response.create", "model": "m", "generate": False,
                  "previous_response_id": previous, "input": [ITEM] * ITEMS}  # fmt: skip
        socket.send(json.dumps(create))
        event = _terminal(socket)
        assert event["type"] == "response.completed", event
        previous = event["response"]["id"]
    assert previous is not None
    return previous


def test_continuations_of_a_cached_conversation_stay_within_the_budget(server: str) -> None:
    url = server.replace("http", "ws", 1) + "/v1/responses"
    with connect(url) as first:  # the code paths warm (a handler call too): the baseline holds them
        first.send(json.dumps({"type": "response.create", "model": "quick", "input": "hi"}))
        assert _terminal(first)["type"] == "response.completed"
    before = stats(server)
    opened = contextlib.ExitStack()
    sockets = [opened.enter_context(connect(url, max_size=None)) for _ in range(SOCKETS)]
    try:
        extensions = sockets[0].response.headers.get("Sec-WebSocket-Extensions", "")
        assert "permessage-deflate" in extensions
        parents = [_conversation(socket) for socket in sockets]
        # Every lane of every socket continues the conversation at once; the handler holds
        # each request until the test lets go.
        refusals = stats(server)["memory_refusals"]
        for socket, parent in zip(sockets, parents, strict=True):
            for lane in range(LANES):
                socket.send(json.dumps({"type": "response.create", "model": "m",
                                        "stream_id": f"lane{lane}", "previous_response_id": parent,
                                        "input": "next"}))  # fmt: skip
        # Each lane is held by the handler or refused (once): the peak is now.
        during = wait_for(
            server,
            lambda s: s["holding"] + s["memory_refusals"] - refusals == SOCKETS * LANES,
        )
        growth = during["rss"] - before["rss"]
        bound = 1.5 * BUDGET + SOCKETS * SOCKET_OVERHEAD
        assert growth <= bound, (
            f"RSS grew {growth / MiB:.0f} MiB with {during['holding']} lanes held, "
            f"{during['memory_refusals'] - refusals} refused; the rule allows {bound / MiB:.0f} MiB"
        )
        assert during["memory_bytes"] <= BUDGET
        httpx.post(server + "/release", timeout=10)
        answers = [_terminal(socket) for socket in sockets for _ in range(LANES)]
        refused = [a for a in answers if a["type"] == "error"]
        assert refused, "nothing was refused"
        assert {(a["status"], a["error"]["code"]) for a in refused} == {
            (503, "server_is_overloaded")
        }
        assert any(a["type"] == "response.completed" for a in answers)
        # The refused sockets kept their caches: each continues its conversation again.
        for socket, parent in zip(sockets, parents, strict=True):
            socket.send(json.dumps({"type": "response.create", "model": "m", "generate": False,
                                    "previous_response_id": parent, "input": "more"}))  # fmt: skip
            assert _terminal(socket)["type"] == "response.completed"
    finally:
        opened.close()
    after = wait_for(server, lambda stats: stats["connections_open"] == 0)
    assert after["memory_bytes"] == 0
