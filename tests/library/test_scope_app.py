"""Starlette's `request.app` works on socket turns when ws_mode sits in the app's middleware."""

from __future__ import annotations

import json

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from websockets.sync.client import connect

from tests.servers import serve
from ws_mode import WebSocketModeMiddleware


async def handler(request: Request) -> JSONResponse:
    item = {
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": request.app.state.greeting}],
    }
    return JSONResponse(
        {"id": "resp_1", "object": "response", "status": "completed", "output": [item]}
    )


def test_request_app_reaches_the_handler_on_socket_turns() -> None:
    app = Starlette(
        routes=[Route("/v1/responses", handler, methods=["POST"])],
        middleware=[Middleware(WebSocketModeMiddleware)],
    )
    app.state.greeting = "hello from app.state"
    with serve(app) as base_url, connect(base_url.replace("http", "ws", 1) + "/v1/responses") as ws:
        ws.send(json.dumps({"type": "response.create", "model": "m", "input": "hi"}))
        while (event := json.loads(ws.recv(timeout=10)))["type"] not in (
            "response.completed",
            "error",
        ):
            pass
    assert event["type"] == "response.completed", event
    assert event["response"]["output"][0]["content"][0]["text"] == "hello from app.state"
