"""Conversation items as the kit handles them: a request's input as items, the tool calls left
unanswered, and independent copies."""

from __future__ import annotations

from typing import Any

import orjson

Item = dict[str, Any]


def as_items(value: Any) -> Any:
    """A request's input as items: a string is one user message, absent is empty (docs/protocol.md,
    "response.create")."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if value is None:
        return []
    return value


def pending_calls(items: list[Item]) -> list[str]:
    """The call ids of the `function_call` items no `function_call_output` answers, in order."""
    answered = {item.get("call_id") for item in items if item.get("type") == "function_call_output"}
    pending: list[str] = []
    for item in items:
        call_id = item.get("call_id")
        if (
            item.get("type") == "function_call"
            and isinstance(call_id, str)
            and call_id not in answered
            and call_id not in pending
        ):
            pending.append(call_id)
    return pending


def copy_json(value: Any) -> Any:
    """A deep copy of a JSON value, through its encoding (what the wire would carry)."""
    return orjson.loads(orjson.dumps(value))
