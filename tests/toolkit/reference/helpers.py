"""What the reference server's tests share: a conversation, tools, and strict readers of its
answers (SSE framing, event types, error bodies)."""

from __future__ import annotations

import typing
from typing import Any

import orjson
from openai.types.responses import ResponseStreamEvent
from pydantic import BaseModel

STREAM_EVENTS: dict[str, type[BaseModel]] = {
    typing.get_args(model.model_fields["type"].annotation)[0]: model
    for model in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}
USER: dict[str, Any] = {"role": "user", "content": "What is the weather in Paris?"}
TOOLS: list[dict[str, Any]] = [
    {"type": "web_search"},
    {"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
    {"type": "function", "name": "second", "parameters": {"type": "object"}},
]


def call_output(item: dict[str, Any], output: str = "sunny") -> dict[str, Any]:
    """The client's answer to a function_call item."""
    return {"type": "function_call_output", "call_id": item["call_id"], "output": output}


def parse_sse(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    """Split an SSE body into (event name, decoded data) pairs, strictly."""
    assert body.endswith(b"\n\n")
    events = []
    for block in body.decode().split("\n\n")[:-1]:
        lines = block.split("\n")
        assert len(lines) == 2, block
        assert lines[0].startswith("event: ")
        assert lines[1].startswith("data: ")
        events.append((lines[0][len("event: ") :], orjson.loads(lines[1][len("data: ") :])))
    return events


TEXT_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    *["response.output_text.delta"] * 12,
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def check_stream(body: bytes) -> list[dict[str, Any]]:
    """Check the framing and typing of every event; return the decoded events."""
    events = parse_sse(body)
    for sequence_number, (name, data) in enumerate(events):
        assert name == data["type"]
        assert data["sequence_number"] == sequence_number
        STREAM_EVENTS[name].model_validate(data)
    return [data for _, data in events]


def assert_error(reply: Any, code: str | None, param: str | None) -> str:
    """Check a 400 answer with OpenAI's error body; return its message."""
    assert reply.status_code == 400
    assert reply.headers["content-type"] == "application/json"
    error = reply.json()["error"]
    assert set(error) == {"type", "code", "message", "param"}
    assert error["type"] == "invalid_request_error"
    assert error["code"] == code
    assert error["param"] == param
    assert error["message"]
    message: str = error["message"]
    return message
