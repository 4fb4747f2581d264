"""`find_middlewares` finds the middleware without starting the app: `add_middleware` still
works afterwards, and what it returned is the instance that serves."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send
from websockets.sync.client import connect

from tests.servers import serve
from ws_mode import WebSocketModeMiddleware, find_middlewares
from ws_mode.prometheus import register


async def respond(request: Request) -> JSONResponse:
    item = {
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "hi"}],
    }
    return JSONResponse(
        {"id": "resp_1", "object": "response", "status": "completed", "output": [item]}
    )


class Tagged:
    """A middleware added after the lookup: it marks every HTTP answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def tagged(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-tagged", b"1")]
            await send(message)

        await self.app(scope, receive, tagged if scope["type"] == "http" else send)


def one_turn(base_url: str, prefix: str = "") -> None:
    with connect(base_url.replace("http", "ws", 1) + prefix + "/v1/responses") as ws:
        ws.send(json.dumps({"type": "response.create", "model": "m", "input": "hi"}))
        while json.loads(ws.recv(timeout=10))["type"] not in ("response.completed", "error"):
            pass


ROUTES = [Route("/v1/responses", respond, methods=["POST"])]


def shaped(shape: str) -> tuple[Any, str]:
    """An app that has not started, with ws_mode added as `shape` says; the socket's prefix."""
    if shape == "fastapi-add_middleware":
        app = FastAPI(routes=list(ROUTES))
        app.add_middleware(WebSocketModeMiddleware)
        return app, ""
    if shape == "starlette-Middleware":
        return Starlette(routes=ROUTES, middleware=[Middleware(WebSocketModeMiddleware)]), ""
    inner = Starlette(routes=ROUTES)
    inner.add_middleware(WebSocketModeMiddleware)
    return Starlette(routes=[Mount("/api", app=inner)]), "/api"


@pytest.mark.parametrize("shape", ["fastapi-add_middleware", "starlette-Middleware", "mounted"])
def test_find_middlewares_then_add_middleware_and_the_found_instance_serves(shape: str) -> None:
    app, prefix = shaped(shape)
    (found,) = find_middlewares(app)
    assert app.middleware_stack is None  # not built: the app has not started
    registry = CollectorRegistry()
    register(found, registry=registry)  # metrics registered before the app starts
    app.add_middleware(Tagged)  # raised "Cannot add middleware after an application has started"
    assert find_middlewares(app) == [found]  # the same instance when asked again
    with serve(app) as base_url:
        one_turn(base_url, prefix)
        assert find_middlewares(app) == [found]  # and once the app has built its stack
    assert found.stats.turns == 1
    assert found.stats.connections_total == 1
    assert "ws_mode_turns_total 1.0" in generate_latest(registry).decode()
