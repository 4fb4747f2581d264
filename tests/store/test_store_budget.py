"""What the store brings back counts in the memory budget (`Limits.max_memory_bytes`): a
stateful HTTP body rebuilt from the store is reserved until the handler returns (503
`server_is_overloaded` when it does not fit, the handler not called), and a conversation
hydrated on a socket that no cache keeps is reserved by the turn that uses it; lanes that
miss the same id at once share one hydrated copy. (The same for socket bodies:
tests/library/test_body_budget.py.)"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from websockets.sync.client import ClientConnection, connect

from tests.redis_server import wait_until
from ws_mode import Limits, WebSocketModeMiddleware, turn
from ws_mode._store import MemoryStore, StoredResponse
from ws_mode.testing._loopback import ServerThread

MiB = 1024 * 1024
OWNER = "shared"  # shared_store=True: one scope for every caller
#: A large stored conversation: about 0.6 MB of tiny items, about 7 MiB once decoded.
LARGE = orjson.dumps([{"role": "user", "content": "x"}] * 20_000)[1:-1]
SMALL = b'{"role":"user","content":"hi"}'


class Handler:
    """Reads the body as JSON (holding it), records what it saw, does what `model` says."""

    def __init__(self) -> None:
        self.calls = 0
        self.body_bytes = 0
        self.previous: list[Any] = []
        self.holding = threading.Event()
        self.let_go = threading.Event()

    async def respond(self, request: Request) -> Response:
        body = await request.json()
        self.calls += 1
        self.body_bytes = int(request.headers["content-length"])
        current = turn(request)
        if current is not None:
            self.previous.append(current.previous)
        if body["model"] in ("hold", "crash"):
            self.holding.set()
            while not self.let_go.is_set():  # noqa: ASYNC110  (set from the test's thread)
                await asyncio.sleep(0.01)
            if body["model"] == "crash":
                raise RuntimeError("the handler fails")
        item = {
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "ok", "annotations": []}],
        }
        return JSONResponse({"id": f"resp_{time.monotonic_ns()}", "object": "response",
                             "status": "completed", "output": [item]})  # fmt: skip


class SlowStore(MemoryStore):
    """Answers hydrations after a pause, so lanes that miss at once are all waiting."""

    async def get_ancestors(self, owner: str, response_id: str) -> list[StoredResponse]:
        await asyncio.sleep(0.3)
        return await super().get_ancestors(owner, response_id)


def stored(store: MemoryStore, response_id: str, items: bytes) -> None:
    record = StoredResponse(
        id=response_id,
        parent_id=None,
        chain_id=response_id,
        input=items,
        output=b'{"type":"message","role":"assistant","content":"ok"}',
        response=orjson.dumps({"id": response_id, "object": "response", "status": "completed"}),
    )
    asyncio.run(store.put(OWNER, record))


def make_app(handler: Handler, store: MemoryStore, **limits: Any) -> WebSocketModeMiddleware:
    app = Starlette(routes=[Route("/v1/responses", handler.respond, methods=["POST"])])
    return WebSocketModeMiddleware(
        app, store=store, stateful_http=True, shared_store=True, limits=Limits(**limits)
    )


@pytest.fixture
def store() -> MemoryStore:
    store = MemoryStore()
    stored(store, "resp_large", LARGE)
    stored(store, "resp_small", SMALL)
    return store


def held(middleware: WebSocketModeMiddleware) -> int:
    return middleware.settings.budget.held


def post(base_url: str, **body: Any) -> httpx.Response:
    return httpx.post(base_url + "/v1/responses", json={"input": "next", **body}, timeout=30)


# --- stateful HTTP ---------------------------------------------------------------------------


def test_a_stateful_body_that_does_not_fit_is_refused_with_503(store: MemoryStore) -> None:
    handler = Handler()
    middleware = make_app(handler, store, max_memory_bytes=4 * MiB)
    with ServerThread(middleware) as base_url:
        answer = post(base_url, model="ok", previous_response_id="resp_large")
        assert answer.status_code == 503
        error = answer.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "server_is_overloaded")
        assert "Limits.max_memory_bytes" in error["message"]
        assert handler.calls == 0  # refused before the handler was called
        assert held(middleware) == 0
        # What fits still runs.
        assert post(base_url, model="ok", previous_response_id="resp_small").status_code == 200
        assert handler.calls == 1
    assert held(middleware) == 0


@pytest.mark.parametrize("ending", ["returns", "crashes"])
def test_a_stateful_body_is_held_until_the_handler_returns(store: MemoryStore, ending: str) -> None:
    handler = Handler()
    middleware = make_app(handler, store, max_memory_bytes=256 * MiB)
    with ServerThread(middleware) as base_url:
        model = "hold" if ending == "returns" else "crash"
        answers: list[httpx.Response] = []

        def continuation() -> None:
            answers.append(post(base_url, model=model, previous_response_id="resp_large"))

        request = threading.Thread(target=continuation)
        request.start()
        try:
            assert handler.holding.wait(30)
            # The body twice (ws_mode's, the framework's copy) and as much again decoded.
            assert held(middleware) >= 3 * handler.body_bytes
        finally:
            handler.let_go.set()
            request.join(30)
        assert answers[0].status_code == (200 if ending == "returns" else 500)
        wait_until(lambda: held(middleware) == 0, "the budget given back")


# --- hydration on a socket -------------------------------------------------------------------


def ws(base_url: str) -> str:
    return base_url.replace("http", "ws", 1) + "/v1/responses"


def send(socket: ClientConnection, model: str, **fields: Any) -> None:
    socket.send(json.dumps({"type": "response.create", "model": model, "input": "next", **fields}))


def terminal(socket: ClientConnection) -> dict[str, Any]:
    while True:
        event: dict[str, Any] = json.loads(socket.recv(timeout=30))
        if event["type"] in ("response.completed", "error", "response.failed"):
            return event


def test_a_hydrated_conversation_the_budget_cannot_hold_is_refused(store: MemoryStore) -> None:
    handler = Handler()
    middleware = make_app(handler, store, max_memory_bytes=4 * MiB)
    with ServerThread(middleware) as base_url, connect(ws(base_url)) as socket:
        level = held(middleware)
        send(socket, "ok", previous_response_id="resp_large", stream_id="a")
        refused = terminal(socket)
        assert (refused["type"], refused["status"], refused["error"]["code"]) == (
            "error",
            503,
            "server_is_overloaded",
        )
        assert refused["stream_id"] == "a"
        assert handler.calls == 0
        assert held(middleware) == level
        send(socket, "ok", previous_response_id="resp_small", stream_id="a")
        assert terminal(socket)["type"] == "response.completed"
    wait_until(lambda: held(middleware) == 0, "the budget given back")


def test_a_hydrated_conversation_no_cache_keeps_is_held_by_its_turn(store: MemoryStore) -> None:
    handler = Handler()
    # The connection's cache is too small for the conversation: only the turn holds it.
    middleware = make_app(handler, store, max_memory_bytes=256 * MiB, max_cached_bytes=MiB)
    with ServerThread(middleware) as base_url, connect(ws(base_url)) as socket:
        level = held(middleware)
        send(socket, "hold", previous_response_id="resp_large")
        assert handler.holding.wait(30)
        previous = handler.previous[0]
        assert previous is not None
        assert previous.holders == 0  # not cached
        # The chain, as the cache would count it, and the body the handler holds.
        assert held(middleware) - level >= previous.chain_size + 3 * handler.body_bytes
        handler.let_go.set()
        assert terminal(socket)["type"] == "response.completed"
        wait_until(
            lambda: held(middleware) == level, "the budget given back"
        )  # the response is not cached either
    wait_until(lambda: held(middleware) == 0, "the budget given back")


def test_lanes_missing_one_id_at_once_share_one_hydrated_copy() -> None:
    handler = Handler()
    store = SlowStore()
    stored(store, "resp_large", LARGE)
    middleware = make_app(handler, store, max_memory_bytes=256 * MiB)
    with ServerThread(middleware) as base_url, connect(ws(base_url)) as socket:
        for lane in ("a", "b", "c"):
            send(socket, "ok", previous_response_id="resp_large", stream_id=lane)
        assert [terminal(socket)["type"] for _ in range(3)] == ["response.completed"] * 3
        first = handler.previous[0]
        assert all(previous is first for previous in handler.previous)
    wait_until(lambda: held(middleware) == 0, "the budget given back")
