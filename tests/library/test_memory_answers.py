"""A handler's answers read whole within the memory budget, measured as RSS.

A JSON answer (or an error) is read whole and turned into events that each carry the response;
a client that does not read keeps them. A real uvicorn server under ws_mode's protocol
(`ws_mode.server.BatchingWebSocketProtocol`) runs in a child process, so only its own memory
counts; real `websockets` clients (permessage-deflate) open several lanes each, every lane's
handler answers a large JSON response object, and the clients read nothing. Before answers
were counted, every lane held its answer, decoded, and a frame of it outside the budget: RSS
grew several times `max_memory_bytes`. Now the worker's growth stays within 1.5 x
`max_memory_bytes` plus the per-socket overhead, and the answers past the budget fail their
turns with `server_is_overloaded` (503). Stateful HTTP's echo of a JSON answer is held to the
same rule for clients that do not read their answers.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from websockets.sync.client import ClientConnection, connect

from tests.rss_server import RSS, SERVE, MiB, child_server, stats, wait_for

BUDGET = 64 * MiB
SOCKETS = 4
LANES = 16  # per socket
ANSWER = 8 * MiB
#: What an idle socket costs (docs/limits.md, `max_memory_bytes`).
SOCKET_OVERHEAD = 64 * 1024
#: Stateful HTTP: clients that each post one request and read nothing of the answer.
HTTP_CLIENTS = 16
#: How long a client that read nothing waits for the server's close frame (stuck behind what
#: it did not read).
CLOSE = 0.5

SERVER = (
    RSS
    + """
import random, sys
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from ws_mode import Limits, MemoryStore, WebSocketModeMiddleware
from ws_mode.testing._loopback import ServerThread

size, budget = int(sys.argv[1]), int(sys.argv[2])
# Text that compresses as prose does (permessage-deflate keeps about a third of it).
words = ["".join(random.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6))
         for _ in range(2000)]
text = " ".join(random.choice(words) for _ in range(size // 7))[:size]
item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}]}
tail = JSONResponse({"object": "response", "status": "completed", "model": "m",
                     "output": [item]}).body  # `{"object":...}`: the id goes before it
del text, item
state = {"answered": 0}

async def stats(request):
    snapshot = middleware.stats.snapshot()
    return JSONResponse({"rss": rss(), "answered": state["answered"], **snapshot})

async def handler(request):
    body = await request.json()
    state["answered"] += 1
    number = state["answered"]
    if body["model"] == "quick":
        return JSONResponse({"id": f"resp_q{number}", "object": "response",
                             "status": "completed", "output": []})
    return Response(b'{"id":"resp_%d",' % number + tail[1:], media_type="application/json")

app = Starlette(routes=[Route("/stats", stats), Route("/v1/responses", handler, methods=["POST"])])
middleware = WebSocketModeMiddleware(app, limits=Limits(max_memory_bytes=budget),
                                     stateful_http=True, store=MemoryStore(), shared_store=True)
"""
    + SERVE
)


@pytest.fixture
def server() -> Iterator[str]:
    with child_server(SERVER, str(ANSWER), str(BUDGET)) as base_url:
        yield base_url


def _terminal(client: ClientConnection) -> dict[str, Any]:
    while True:
        event: dict[str, Any] = json.loads(client.recv(timeout=60))
        if event["type"] in ("response.completed", "response.failed", "error"):
            return event


def _unread(url: str) -> ClientConnection:
    """A client that reads nothing it is not asked to (one message queued at most)."""
    return connect(url, max_size=None, max_queue=1, close_timeout=CLOSE)


def _growth(server: str, before: dict[str, Any], answered: int) -> tuple[int, dict[str, Any]]:
    """Once every handler answered, the most the worker grew over a few polls, and the last
    poll (every lane's answer is then held, sent, or refused: no lane has work left but its
    sends)."""
    wait_for(server, lambda s: s["answered"] >= answered)
    polls = [stats(server) for _ in range(5)]
    print(
        "GROWTH",
        [(p["rss"] - before["rss"]) // MiB for p in polls],
        polls[-1]["memory_refusals"],
        polls[-1]["memory_bytes"] // MiB,
    )
    return max(p["rss"] for p in polls) - before["rss"], polls[-1]


def test_answers_to_clients_that_do_not_read_stay_within_the_budget(server: str) -> None:
    url = server.replace("http", "ws", 1) + "/v1/responses"
    with connect(url) as first:  # the code paths warm: the baseline holds them
        first.send(json.dumps({"type": "response.create", "model": "quick", "input": "hi"}))
        assert _terminal(first)["type"] == "response.completed"
    before = stats(server)
    opened = contextlib.ExitStack()
    clients = [opened.enter_context(_unread(url)) for _ in range(SOCKETS)]
    try:
        extensions = clients[0].response.headers.get("Sec-WebSocket-Extensions", "")
        assert "permessage-deflate" in extensions
        for client in clients:
            for lane in range(LANES):
                client.send(json.dumps({"type": "response.create", "model": "m",
                                        "stream_id": f"lane{lane}", "input": "hi"}))  # fmt: skip
        # Nobody reads: each lane's answer is held by its turn, or refused.
        growth, during = _growth(server, before, before["answered"] + SOCKETS * LANES)
        bound = 1.5 * BUDGET + SOCKETS * SOCKET_OVERHEAD
        assert growth <= bound, (
            f"RSS grew {growth / MiB:.0f} MiB with {SOCKETS * LANES} answers of "
            f"{ANSWER / MiB:.0f} MiB unread, {during['memory_refusals']} refused; "
            f"the rule allows {bound / MiB:.0f} MiB"
        )
        assert during["memory_bytes"] <= BUDGET
        assert during["memory_refusals"] > 0
    finally:
        opened.close()
    after = wait_for(server, lambda s: s["connections_open"] == 0 and s["memory_bytes"] == 0)
    assert after["errors"].get("server_is_overloaded", 0) > 0


def test_a_refused_answer_keeps_the_conversation(server: str) -> None:
    """A continuation whose answer the budget cannot hold fails with server_is_overloaded,
    and the response it continued stays cached: continuing it again works, on the same lane."""
    url = server.replace("http", "ws", 1) + "/v1/responses"
    with connect(url, max_size=None) as client:
        client.send(json.dumps({"type": "response.create", "model": "quick", "input": "hi"}))
        parent = _terminal(client)
        assert parent["type"] == "response.completed"
        # The budget is held by lanes of other sockets that do not read.
        with contextlib.ExitStack() as idle:
            others = [idle.enter_context(_unread(url)) for _ in range(SOCKETS)]
            answered = stats(server)["answered"]
            for other in others:
                for lane in range(LANES):
                    other.send(json.dumps({"type": "response.create", "model": "m",
                                           "stream_id": f"lane{lane}", "input": "hi"}))  # fmt: skip
            wait_for(server, lambda s: s["answered"] >= answered + SOCKETS * LANES)
            create = {"type": "response.create", "model": "m", "input": "more",
                      "previous_response_id": parent["response"]["id"]}  # fmt: skip
            client.send(json.dumps(create))
            refused = _terminal(client)
            assert refused["type"] == "error", refused["type"]
            assert (refused["status"], refused["error"]["code"]) == (503, "server_is_overloaded")
        client.send(json.dumps({**create, "model": "quick"}))
        assert _terminal(client)["type"] == "response.completed"


def _post_unread(address: tuple[str, int], body: bytes) -> socket.socket:
    """A stateful HTTP `POST /v1/responses` whose answer the client never reads."""
    client = socket.create_connection(address)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.sendall(
        b"POST /v1/responses HTTP/1.1\r\nhost: ws-mode\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    return client


def test_stateful_http_answers_to_clients_that_do_not_read_stay_within_the_budget(
    server: str,
) -> None:
    """Stateful HTTP holds a JSON answer whole to echo `previous_response_id`: each is counted
    while it is held, and while its client does not read it."""
    parts = urlsplit(server)
    address = (parts.hostname or "127.0.0.1", parts.port or 80)
    quick = _post_unread(address, b'{"model":"quick","input":"hi"}')
    wait_for(server, lambda s: s["answered"] >= 1)
    quick.close()
    before = stats(server)
    # Not stored: what the store keeps of a response is the store's.
    body = json.dumps({"model": "m", "input": "hi", "store": False}).encode()
    clients = [_post_unread(address, body) for _ in range(HTTP_CLIENTS)]
    try:
        growth, during = _growth(server, before, before["answered"] + HTTP_CLIENTS)
        bound = 1.5 * BUDGET
        assert growth <= bound, (
            f"RSS grew {growth / MiB:.0f} MiB with {HTTP_CLIENTS} answers of "
            f"{ANSWER / MiB:.0f} MiB unread, {during['memory_refusals']} refused; "
            f"the rule allows {bound / MiB:.0f} MiB"
        )
        assert during["memory_bytes"] <= BUDGET
        assert during["memory_refusals"] > 0
    finally:
        for client in clients:
            client.close()
    wait_for(server, lambda s: s["memory_bytes"] == 0)
