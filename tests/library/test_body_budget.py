"""The request bodies ws_mode builds for the handler count in the memory budget
(`Limits.max_memory_bytes`): a continuation's full-context body, and what the handler holds of
it (a framework's copy, the JSON decoded), is reserved from the build until the handler call
ends, however it ends; a body that does not fit is refused (`server_is_overloaded`, 503)
before the handler is called, the socket, its cache and its other lanes kept. (RSS:
tests/library/test_memory_bodies.py.)"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from websockets.sync.client import ClientConnection, connect

from tests.redis_server import wait_until
from tests.servers import serve
from ws_mode import Limits, WebSocketModeMiddleware

MiB = 1024 * 1024
#: The conversation's first input: about 0.6 MB of tiny items, about 7 MiB once cached.
ITEMS = [{"role": "user", "content": "x"}] * 20_000


class Handler:
    """The wrapped app: it reads the body as JSON (holding it), then does what `model` says."""

    def __init__(self) -> None:
        self.calls = 0
        self.holding = threading.Event()
        self.let_go = threading.Event()
        self.ended = threading.Event()
        self.body_bytes = 0

    async def respond(self, request: Request) -> Response:
        body = await request.json()
        self.calls += 1
        self.body_bytes = int(request.headers["content-length"])
        self.ended.clear()
        mode = body["model"]
        try:
            if mode == "crash":
                await self._hold()
                raise RuntimeError("the handler fails")
            if mode == "hang":
                self.holding.set()
                await asyncio.sleep(3600)
            if mode == "hold":
                await self._hold()
                refusal = {"error": {"type": "invalid_request_error", "message": "no"}}
                return JSONResponse(refusal, 400)
            if mode == "linger":
                return StreamingResponse(self._linger(body), media_type="text/event-stream")
            return JSONResponse(_response(len(body["input"])))
        finally:
            if mode != "linger":
                self.ended.set()

    async def _hold(self) -> None:
        self.holding.set()
        while not self.let_go.is_set():  # noqa: ASYNC110  (set from the test's thread)
            await asyncio.sleep(0.01)

    async def _linger(self, body: dict[str, Any]) -> AsyncIterator[str]:
        """The terminal event, then the handler goes on (holding its request) a while."""
        completed = {"type": "response.completed", "response": _response(len(body["input"]))}
        yield f"event: response.completed\ndata: {json.dumps(completed)}\n\n"
        try:
            await self._hold()
        finally:
            self.ended.set()


def _response(items: int) -> dict[str, Any]:
    item = {
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": f"{items} items", "annotations": []}],
    }
    return {"id": f"resp_{time.monotonic_ns()}", "object": "response", "status": "completed",
            "output": [item]}  # fmt: skip


def make_app(handler: Handler, **limits: Any) -> WebSocketModeMiddleware:
    app = Starlette(routes=[Route("/v1/responses", handler.respond, methods=["POST"])])
    return WebSocketModeMiddleware(app, limits=Limits(**limits))


def ws(base_url: str) -> str:
    return base_url.replace("http", "ws", 1) + "/v1/responses"


def send(socket: ClientConnection, model: str, **fields: Any) -> None:
    socket.send(json.dumps({"type": "response.create", "model": model, **fields}))


def terminal(socket: ClientConnection) -> dict[str, Any]:
    while True:
        event: dict[str, Any] = json.loads(socket.recv(timeout=30))
        if event["type"] in ("response.completed", "error", "response.failed"):
            return event


def cached_conversation(socket: ClientConnection) -> str:
    """A large conversation cached by a warm-up (no handler, no body), on the default lane."""
    send(socket, "m", generate=False, input=ITEMS)
    event = terminal(socket)
    assert event["type"] == "response.completed", event
    response_id: str = event["response"]["id"]
    return response_id


def held(middleware: WebSocketModeMiddleware) -> int:
    return middleware.settings.budget.held


def test_a_continuation_whose_body_does_not_fit_is_refused_and_the_socket_stays_usable() -> None:
    handler = Handler()
    # The conversation's cache (about 7 MiB) fits; its full-context body, held by the handler
    # as bytes twice and decoded (about 8 MiB more), does not.
    middleware = make_app(handler, max_memory_bytes=12 * MiB)
    with serve(middleware) as base_url, connect(ws(base_url), max_size=None) as socket:
        parent = cached_conversation(socket)
        level = held(middleware)
        send(socket, "ok", stream_id="b", previous_response_id=parent, input="more")
        refused = terminal(socket)
        assert refused["type"] == "error"
        assert (refused["status"], refused["error"]["type"], refused["error"]["code"]) == (
            503,
            "server_error",
            "server_is_overloaded",
        )
        assert refused["stream_id"] == "b"
        assert "this request was refused" in refused["error"]["message"]
        assert handler.calls == 0  # refused before the handler was called
        assert held(middleware) == level  # nothing kept of it
        assert middleware.stats.snapshot()["memory_refusals"] >= 1
        # The socket, its cache and its lanes go on: the parent is still cached, and a small
        # turn runs.
        send(socket, "m", generate=False, stream_id="b", previous_response_id=parent,
             input="warm")  # fmt: skip
        assert terminal(socket)["type"] == "response.completed"
        send(socket, "ok", stream_id="c", input="small")
        assert terminal(socket)["type"] == "response.completed"
        assert handler.calls == 1
    wait_until(lambda: held(middleware) == 0, "the budget given back")


@pytest.mark.parametrize("ending", ["returns", "crashes", "times_out", "client_leaves"])
def test_the_body_is_held_in_the_budget_until_the_handler_call_ends(ending: str) -> None:
    handler = Handler()
    middleware = make_app(handler, max_memory_bytes=64 * MiB, max_turn_seconds=2.0)
    with serve(middleware) as base_url, connect(ws(base_url), max_size=None) as socket:
        parent = cached_conversation(socket)
        level = held(middleware)
        model = {"returns": "hold", "crashes": "crash", "times_out": "hang"}.get(ending, "hold")
        send(socket, model, stream_id="b", previous_response_id=parent, input="more")
        assert handler.holding.wait(30)
        # While the handler holds its request, the budget holds it: the body twice
        # (ws_mode's, the framework's copy) and at least as much again decoded.
        assert held(middleware) - level >= 3 * handler.body_bytes
        if ending == "client_leaves":
            socket.close()
            assert handler.ended.wait(30)
            wait_until(lambda: held(middleware) == 0, "the budget given back")
            return
        handler.let_go.set()
        event = terminal(socket)
        assert event["type"] == "error"
        assert event["status"] == {"returns": 400, "crashes": 500, "times_out": 504}[ending]
        # The response failed, so nothing new is cached: the account is back at its level.
        wait_until(lambda: held(middleware) == level, "the budget given back")
        # And the socket goes on.
        send(socket, "ok", stream_id="b", previous_response_id=parent, input="again")
        assert terminal(socket)["type"] == "response.completed"
    wait_until(lambda: held(middleware) == 0, "the budget given back")


def test_a_handler_running_on_after_its_terminal_event_holds_its_body_until_it_ends() -> None:
    handler = Handler()
    middleware = make_app(handler, max_memory_bytes=64 * MiB)
    with serve(middleware) as base_url, connect(ws(base_url), max_size=None) as socket:
        parent = cached_conversation(socket)
        send(socket, "linger", stream_id="b", previous_response_id=parent, input="more")
        assert terminal(socket)["type"] == "response.completed"
        assert handler.holding.wait(30)
        with_response = held(middleware)  # the new response is cached; the body still held
        handler.let_go.set()
        assert handler.ended.wait(30)
        wait_until(
            lambda: with_response - held(middleware) >= 3 * handler.body_bytes,
            "the budget given back",
        )
    wait_until(lambda: held(middleware) == 0, "the budget given back")
