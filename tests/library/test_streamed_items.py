"""Streamed items win: a handler whose terminal event lists its output otherwise than the
`response.output_item.done` events it streamed (a custom tool call streamed, a function call in
`response.completed`) gets, on the next turn, the history the client built from the streamed
items, so the client's tool output is not orphaned. A real server and a real socket client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.servers import serve
from ws_mode import WebSocketModeMiddleware, turn
from ws_mode.testing._client import connect

CUSTOM = {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_1", "name": "apply_patch",
          "input": "*** Begin Patch", "status": "completed"}  # fmt: skip
AS_A_FUNCTION = {"type": "function_call", "id": "fc_1", "call_id": "call_1",
                 "name": "apply_patch", "arguments": "{}", "status": "completed"}  # fmt: skip


def sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def build_app(histories: list[list[Any]]) -> Starlette:
    async def create(request: Request) -> Response:
        await request.json()
        current = turn(request)
        assert current is not None
        histories.append(list(current.history()))  # the whole context, in either mode
        response = {"id": f"resp_{len(histories)}", "object": "response", "status": "completed",
                    "model": "m", "output": []}  # fmt: skip

        async def events() -> AsyncIterator[bytes]:
            yield sse({"type": "response.created", "sequence_number": 0,
                       "response": {**response, "status": "in_progress"}})  # fmt: skip
            if len(histories) == 1:  # the call, streamed as custom, listed as a function
                started = {**CUSTOM, "status": "in_progress"}
                yield sse({"type": "response.output_item.added", "sequence_number": 1,
                           "output_index": 0, "item": started})  # fmt: skip
                yield sse({"type": "response.output_item.done", "sequence_number": 2,
                           "output_index": 0, "item": CUSTOM})  # fmt: skip
                done = {**response, "output": [AS_A_FUNCTION]}
            else:
                done = response
            yield sse({"type": "response.completed", "sequence_number": 3, "response": done})

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/responses", create, methods=["POST"])])


@pytest.mark.parametrize("full_context", ["always", "on_miss"])
def test_the_next_turn_continues_from_the_streamed_items(full_context: str) -> None:
    histories: list[list[Any]] = []
    app = WebSocketModeMiddleware(build_app(histories), full_context=full_context)
    with serve(app) as base, connect(base) as socket:
        socket.send({"type": "response.create", "model": "m", "input": "Patch it."})
        first = socket.receive_turn(timeout=30)
        assert first[-1]["type"] == "response.completed", first[-1]
        output = {"type": "custom_tool_call_output", "call_id": "call_1", "output": "done"}
        socket.send({"type": "response.create", "model": "m", "input": [output],
                     "previous_response_id": first[-1]["response"]["id"]})  # fmt: skip
        second = socket.receive_turn(timeout=30)
    assert second[-1]["type"] == "response.completed", second[-1]
    # The whole context: the question, the call as the client received it, its output.
    assert [item.get("type") for item in histories[1][1:]] == [
        "custom_tool_call", "custom_tool_call_output"]  # fmt: skip
    assert histories[1][1]["input"] == "*** Begin Patch"
