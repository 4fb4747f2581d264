"""The Turn's tool view with the tools Codex sends for Responses Lite models: in an
`additional_tools` input item, top-level `tools` empty. Over a real socket, through the
middleware: `tools()`, `tools_changed`, `tools_digest` and `tool_artifacts` see those tools on
the turn that sends them and on every continuation that inherits them with the context."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from websockets.sync.client import ClientConnection, connect

from tests.servers import serve
from ws_mode import WebSocketModeMiddleware, turn
from ws_mode._turn import tools_digest

EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    "strict": False,
}
FUNCTIONS = {"type": "namespace", "name": "functions", "description": "Tools.", "tools": [EXEC]}
MCP = {"type": "function", "name": "mcp__docs__search", "parameters": {"type": "object"}}


def additional_tools(*tools: dict[str, Any]) -> dict[str, Any]:
    """The item as Codex sends it."""
    return {"type": "additional_tools", "role": "developer", "tools": list(tools)}


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


class Seen:
    def __init__(self) -> None:
        self.turns: list[dict[str, Any]] = []


@pytest.fixture(scope="module")
def lite() -> Iterator[tuple[str, Seen]]:
    seen = Seen()

    async def responses(request: Request) -> JSONResponse:
        current = turn(request)
        assert current is not None
        current.tool_artifacts.setdefault("rendered", secrets.token_hex(4))
        seen.turns.append(
            {
                "tools": current.tools(),
                "changed": current.tools_changed,
                "digest": current.tools_digest,
                "artifacts": current.tool_artifacts["rendered"],
            }
        )
        message = {
            "type": "message",
            "id": "msg_" + secrets.token_hex(8),
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "ok", "annotations": []}],
        }
        return JSONResponse(
            {
                "id": "resp_" + secrets.token_hex(16),
                "object": "response",
                "status": "completed",
                "output": [message],
            }
        )

    app = Starlette(routes=[Route("/v1/responses", responses, methods=["POST"])])
    with serve(WebSocketModeMiddleware(app, full_context="on_miss")) as base_url:
        yield base_url.replace("http", "ws", 1) + "/v1/responses", seen


def _turn(socket: ClientConnection, **fields: Any) -> str:
    create = {"type": "response.create", "model": "gpt-6-sol", "tools": [], **fields}
    socket.send(json.dumps(create))
    while True:
        event = json.loads(socket.recv(timeout=10))
        if event["type"] == "response.completed":
            response_id: str = event["response"]["id"]
            return response_id
        assert event["type"] != "error", event


def test_tools_in_an_additional_tools_item_are_the_turns_tools(lite: tuple[str, Seen]) -> None:
    url, seen = lite
    seen.turns.clear()
    lite_fields = {"parallel_tool_calls": False, "reasoning": {"context": "all_turns"}}
    with connect(url) as socket:
        first = _turn(
            socket, input=[additional_tools(FUNCTIONS), user("List files.")], **lite_fields
        )
        # A continuation sends only its new items: the tools come with the context.
        second = _turn(socket, previous_response_id=first, input=[user("Again.")], **lite_fields)
        # A new item adds a tool (an MCP server connected).
        third = _turn(
            socket,
            previous_response_id=second,
            input=[additional_tools(MCP), user("Search the docs.")],
            **lite_fields,
        )
        # Back to the first response: a fork without the MCP tool.
        _turn(socket, previous_response_id=first, input=[user("Once more.")], **lite_fields)
        assert third
    one, two, three, fork = seen.turns
    assert one["tools"] == two["tools"] == fork["tools"] == [FUNCTIONS]
    assert three["tools"] == [FUNCTIONS, MCP]
    assert (one["changed"], two["changed"], three["changed"], fork["changed"]) == (
        True,
        False,
        True,
        False,
    )
    assert one["digest"] is not None
    assert one["digest"] == two["digest"] == fork["digest"] != three["digest"]
    # What the handler rendered for these exact tools comes back while they stay the same.
    assert one["artifacts"] == two["artifacts"] == fork["artifacts"] != three["artifacts"]


def test_top_level_tools_keep_their_digest(lite: tuple[str, Seen]) -> None:
    url, seen = lite
    seen.turns.clear()
    with connect(url) as socket:
        first = _turn(socket, input=[user("Hi.")], tools=[EXEC])
        _turn(socket, previous_response_id=first, input=[user("Hi.")], tools=[EXEC])
    one, two = seen.turns
    assert one["tools"] == two["tools"] == [EXEC]
    assert one["digest"] == two["digest"] == tools_digest([EXEC])
    assert (one["changed"], two["changed"]) == (True, False)
