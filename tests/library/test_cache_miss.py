"""`on_cache_miss="forward"`: uncached parents are resolved by a handler that stores responses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from websockets.sync.client import ClientConnection, connect

from tests.servers import serve
from ws_mode import WebSocketModeMiddleware
from ws_mode._errors import ConfigError


class StoringHandler:
    """A handler that stores responses and resolves `previous_response_id` itself."""

    def __init__(self) -> None:
        self.stored: dict[str, list[dict[str, Any]]] = {}
        self.bodies: list[dict[str, Any]] = []

    async def handle(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.bodies.append(body)
        items = body.get("input") or []
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items
        previous = body.get("previous_response_id")
        if previous is not None and previous not in self.stored:
            error = {
                "type": "invalid_request_error",
                "code": "previous_response_not_found",
                "message": "not stored",
                "param": "previous_response_id",
            }
            return JSONResponse({"error": error}, status_code=400)
        context = [*self.stored.get(previous, []), *items] if previous else items
        answer = {
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": f"{len(context)} items"}],
        }
        response_id = f"resp_{len(self.stored)}"
        self.stored[response_id] = [*context, answer]
        return JSONResponse(
            {"id": response_id, "object": "response", "status": "completed", "output": [answer]}
        )


@pytest.fixture
def storing() -> Iterator[tuple[StoringHandler, str]]:
    handler = StoringHandler()
    app = Starlette(routes=[Route("/v1/responses", handler.handle, methods=["POST"])])
    with serve(WebSocketModeMiddleware(app, on_cache_miss="forward")) as base_url:
        yield handler, base_url.replace("http", "ws", 1) + "/v1/responses"


def create(socket: ClientConnection, **fields: Any) -> dict[str, Any]:
    socket.send(json.dumps({"type": "response.create", "model": "m", **fields}))
    while True:
        event = json.loads(socket.recv(timeout=10))
        if event["type"] in ("response.completed", "error"):
            return event


def text(event: dict[str, Any]) -> str:
    output: str = event["response"]["output"][0]["content"][0]["text"]
    return output


def test_an_uncached_parent_is_resolved_by_the_handler(
    storing: tuple[StoringHandler, str],
) -> None:
    handler, url = storing
    with connect(url) as socket:
        first = create(socket, input="one")
    # A new connection knows nothing of resp_0; the handler does.
    with connect(url) as socket:
        second = create(socket, input="two", previous_response_id=first["response"]["id"])
        assert second["type"] == "response.completed", second
        assert text(second) == "3 items"
        assert second["response"]["previous_response_id"] == "resp_0"
        # Its continuation goes on through the handler's storage: it cannot be built here.
        third = create(socket, input="three", previous_response_id=second["response"]["id"])
        assert text(third) == "5 items"
    assert handler.bodies[1] == {
        "model": "m",
        "stream": True,
        "previous_response_id": "resp_0",
        "input": "two",
    }
    assert handler.bodies[2]["previous_response_id"] == "resp_1"
    assert handler.bodies[2]["input"] == "three"


def test_cached_chains_still_get_the_whole_context(storing: tuple[StoringHandler, str]) -> None:
    handler, url = storing
    with connect(url) as socket:
        first = create(socket, input="one")
        second = create(socket, input="two", previous_response_id=first["response"]["id"])
        assert text(second) == "3 items"
    assert "previous_response_id" not in handler.bodies[1]
    assert len(handler.bodies[1]["input"]) == 3


def test_the_handler_refusing_an_unknown_id_reaches_the_client(
    storing: tuple[StoringHandler, str],
) -> None:
    _, url = storing
    with connect(url) as socket:
        event = create(socket, input="x", previous_response_id="resp_unknown")
    assert event["type"] == "error"
    assert event["status"] == 400
    assert event["error"]["code"] == "previous_response_not_found"


def test_the_setting_is_checked() -> None:
    with pytest.raises(ConfigError, match="on_cache_miss"):
        WebSocketModeMiddleware(Starlette(), on_cache_miss="hydrate")  # type: ignore[arg-type]
