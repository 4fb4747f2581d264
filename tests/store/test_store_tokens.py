"""A parent hydrated from the store comes with its context's tokens: a renderer's prefix on a
new socket is the whole history rendered, as on the socket that made it."""

from __future__ import annotations

import json
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from websockets.sync.client import connect

from tests.servers import serve
from ws_mode import WebSocketModeMiddleware, turn
from ws_mode._store import MemoryStore


def render(items: list[dict[str, Any]]) -> list[int]:
    return [byte for item in items for byte in orjson.dumps(item, option=orjson.OPT_SORT_KEYS)]


def test_a_hydrated_parent_has_its_contexts_tokens() -> None:
    seen: list[tuple[bool, int]] = []

    async def handler(request: Request) -> JSONResponse:
        current = turn(request)
        assert current is not None
        seen.append((current.tokens() == render(current.history()), len(current.history())))
        number = len(seen)
        part = {"type": "output_text", "text": "ok"}
        item = {"type": "message", "id": f"msg_{number}", "role": "assistant", "content": [part]}
        answer = {"id": f"resp_{number}", "object": "response", "status": "completed"}
        return JSONResponse({**answer, "output": [item]})

    app = WebSocketModeMiddleware(
        Starlette(routes=[Route("/v1/responses", handler, methods=["POST"])]),
        full_context="on_miss",
        renderer=render,
        store=MemoryStore(),
        shared_store=True,  # one client, no credentials
    )
    create = {"type": "response.create", "model": "m", "store": True}

    def terminal(socket: Any) -> dict[str, Any]:
        while True:
            event: dict[str, Any] = json.loads(socket.recv(timeout=10))
            if event["type"] in ("response.completed", "error"):
                return event

    with serve(app) as base_url:
        url = base_url.replace("http", "ws", 1) + "/v1/responses"
        with connect(url) as first:
            first.send(json.dumps({**create, "input": "one"}))
            parent = terminal(first)["response"]["id"]
        with connect(url) as second:  # a new socket: the parent comes from the store
            second.send(json.dumps({**create, "input": "two", "previous_response_id": parent}))
            assert terminal(second)["type"] == "response.completed"
    assert seen == [(True, 1), (True, 3)]
