"""A scripted stand-in for a model, and the Responses API objects and events it answers with."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

Item = dict[str, Any]


def text_of(item: Item) -> str:
    """The text of a message item, whether its content is a string or a list of parts."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = (part.get("text", "") for part in content if isinstance(part, dict))
        return " ".join(str(part) for part in parts).strip()
    return ""


def last_question(items: Iterable[Item]) -> str:
    """The text of the last user message, or "" when there is none."""
    question = ""
    for item in items:
        if item.get("type", "message") == "message" and item.get("role") == "user":
            question = text_of(item)
    return question


@dataclass(frozen=True, slots=True)
class Stats:
    """What the model "reads" in a context: how many items and words it holds.

    Counting is the stand-in for the expensive, prefix-only work a real server does per turn
    (tokenizing, validating, classifying); the cache-aware view does it for new items only.
    """

    items: int = 0
    words: int = 0

    @classmethod
    def of(cls, items: Iterable[Item]) -> Stats:
        counted = list(items)
        return cls(len(counted), sum(len(text_of(item).split()) for item in counted))

    def __add__(self, other: Stats) -> Stats:
        return Stats(self.items + other.items, self.words + other.words)


def reply(question: str, context: Stats) -> list[Item]:
    """The output items: one assistant message."""
    text = f"You said {question!r}. Context: {context.items} items, {context.words} words."
    return [
        {
            "type": "message",
            "id": "msg_" + secrets.token_hex(12),
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    ]


def response_object(body: dict[str, Any], output: list[Item]) -> dict[str, Any]:
    """A finished response object, as `POST /v1/responses` returns it."""
    return {
        "id": "resp_" + secrets.token_hex(16),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": body.get("model") or "scripted-django",
        "output": output,
        "previous_response_id": body.get("previous_response_id"),
        "instructions": body.get("instructions"),
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice", "auto"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "store": False,
        "metadata": body.get("metadata") or {},
        "usage": None,
        "error": None,
        "incomplete_details": None,
    }


def events(response: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The streaming events of a finished response made of message items."""
    started = {**response, "status": "in_progress", "output": []}
    yield {"type": "response.created", "response": started}
    yield {"type": "response.in_progress", "response": started}
    for index, item in enumerate(response["output"]):
        text = text_of(item)
        where = {"output_index": index, "item_id": item["id"], "content_index": 0}
        part = {"type": "output_text", "text": "", "annotations": []}
        yield {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {**item, "status": "in_progress", "content": []},
        }
        yield {"type": "response.content_part.added", **where, "part": part}
        for number, word in enumerate(text.split(" ")):
            delta = word if number == 0 else " " + word
            yield {"type": "response.output_text.delta", **where, "delta": delta, "logprobs": []}
        yield {"type": "response.output_text.done", **where, "text": text, "logprobs": []}
        yield {"type": "response.content_part.done", **where, "part": {**part, "text": text}}
        yield {"type": "response.output_item.done", "output_index": index, "item": item}
    yield {"type": "response.completed", "response": response}


async def sse(response: dict[str, Any]) -> AsyncIterator[bytes]:
    """The events as Server-Sent Events, numbered from 0, without `[DONE]`."""
    for number, event in enumerate(events(response)):
        event["sequence_number"] = number
        yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
