"""Compaction in the reference server: the ``compaction`` item, how a context holding one is
read, and the answer to ``POST /v1/responses/compact``.

A compaction item stands for the whole context before it. OpenAI's ``encrypted_content`` is
opaque to clients; the reference keeps no state, so it carries what the scripted model needs of
that context: its folded digest state, the tool calls since the last user message and the calls
still unanswered, as base64 of canonical JSON. A context is read from its latest compaction
item on (OpenAI: "the latest compaction item carries the necessary context"): the items before
it are neither folded nor rendered, so a compacted context gives the model exactly the answer
the full one gives, from fewer tokens.

Two things make compaction items: ``POST /v1/responses/compact`` (OpenAI's
``response.compaction`` object, :func:`compaction_response`: the user messages of the input,
then one compaction item) and ``context_management`` on ``POST /v1/responses`` (a compaction
item first in the output once the input reaches the threshold). The compact answer used as
``input`` of a new response, without ``previous_response_id``, starts a new chain whose context
the model reads exactly as the context that was compacted. The server keeps nothing: a
``previous_response_id`` on a compact request never resolves
(:func:`refuse_compact_request`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from ._json import canonical_json
from .model import count_tool_calls, fold_items, output_tokens
from .request import Parsed, RequestError
from .response import usage

__all__ = [
    "COMPACTION",
    "EMPTY",
    "Folded",
    "advance",
    "compacted_output",
    "compaction_item",
    "compaction_response",
    "decode",
    "last_compaction",
    "open_calls",
    "refuse_compact_request",
]

COMPACTION: Final = "compaction"
"""The ``type`` of a compaction item."""
_FORMAT: Final = 1  # bumped whenever the payload changes


@dataclass(frozen=True, slots=True)
class Folded:
    """What the model needs of a context: its digest state
    (:func:`~ws_mode.toolkit.reference.model.fold_items`), its tool calls since the last user
    message, and the call ids of its ``function_call`` items no output answers yet (in order)."""

    digest_state: bytes
    tool_calls: int
    open_calls: tuple[str, ...]


EMPTY: Final = Folded(b"", 0, ())
"""The empty context's values."""


def open_calls(calls: Iterable[str], items: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    """``calls`` (unanswered so far) after ``items``: a call adds its id, an output removes
    it."""
    pending = dict.fromkeys(calls)
    for item in items:
        kind = item.get("type")
        if kind == "function_call":
            call_id = item.get("call_id")
            if isinstance(call_id, str):
                pending[call_id] = None
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if isinstance(call_id, str):
                pending.pop(call_id, None)
    return tuple(pending)


def last_compaction(items: Sequence[dict[str, Any]]) -> int | None:
    """The index of the last compaction item of ``items``, or None."""
    for index in range(len(items) - 1, -1, -1):
        if items[index].get("type") == COMPACTION:
            return index
    return None


def advance(start: Folded, items: Sequence[dict[str, Any]]) -> tuple[Folded, int | None]:
    """The values of a context ``start`` describes, extended by ``items``; and the index of
    the compaction item of ``items`` the context now starts from (None: it still starts where
    ``start``'s did). Raises :class:`RequestError` for a compaction item it cannot read."""
    at = last_compaction(items)
    tail: Sequence[dict[str, Any]] = items
    if at is not None:
        start = decode(items[at], at)
        tail = items[at + 1 :]
    folded = Folded(
        fold_items(start.digest_state, tail),
        count_tool_calls(start.tool_calls, tail),
        open_calls(start.open_calls, tail),
    )
    return folded, at


def encode(folded: Folded) -> str:
    """The ``encrypted_content`` standing for a context with these values."""
    payload = {
        "format": _FORMAT,
        "digest_state": folded.digest_state.hex(),
        "tool_calls": folded.tool_calls,
        "open_calls": list(folded.open_calls),
    }
    return base64.b64encode(canonical_json(payload)).decode()


def decode(item: dict[str, Any], index: int) -> Folded:
    """The values a compaction item (``input[index]``) stands for; :class:`RequestError` when
    its ``encrypted_content`` is not one the reference made."""
    content = item.get("encrypted_content")
    try:
        if not isinstance(content, str):
            raise ValueError(content)
        payload = orjson.loads(base64.b64decode(content, validate=True))
        state, calls, pending = (
            payload["digest_state"],
            payload["tool_calls"],
            payload["open_calls"],
        )
        if payload["format"] != _FORMAT or not isinstance(state, str):
            raise ValueError(payload)
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
            raise ValueError(calls)
        if not isinstance(pending, list) or not all(isinstance(c, str) for c in pending):
            raise ValueError(pending)
        return Folded(bytes.fromhex(state), calls, tuple(pending))
    except (ValueError, TypeError, KeyError, binascii.Error, orjson.JSONDecodeError):
        name = item.get("id") if isinstance(item.get("id"), str) else f"input[{index}]"
        raise RequestError(
            f"The encrypted content for item {name} could not be verified.",
            code="invalid_encrypted_content",
            param=f"input[{index}].encrypted_content",
        ) from None


def compaction_item(folded: Folded) -> dict[str, Any]:
    """The compaction item standing for a context with these values; its id is derived from
    its content, so equal contexts give equal items."""
    content = encode(folded)
    digest = hashlib.sha256(content.encode()).hexdigest()[:32]
    return {"type": COMPACTION, "id": f"cmp_{digest}", "encrypted_content": content}


def _is_user_message(item: dict[str, Any]) -> bool:
    return item.get("role") == "user" and item.get("type", "message") == "message"


def _user_message(item: dict[str, Any]) -> dict[str, Any]:
    """A user message of the input as an output item: an id, a status, content parts."""
    content = item.get("content")
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
    digest = hashlib.sha256(canonical_json(item)).hexdigest()[:32]
    return {
        "type": "message",
        "id": item["id"] if isinstance(item.get("id"), str) else f"msg_{digest}",
        "status": "completed",
        "role": "user",
        "content": parts if isinstance(parts, list) else [],
    }


def compacted_output(items: Sequence[dict[str, Any]], folded: Folded) -> list[dict[str, Any]]:
    """What ``/responses/compact`` answers for a context (``items``, whose values are
    ``folded``): every user message of it, then one compaction item standing for all of it."""
    users = [_user_message(item) for item in items if _is_user_message(item)]
    return [*users, compaction_item(folded)]


def refuse_compact_request(parsed: Parsed) -> None:
    """Raise :class:`RequestError` for a compact request OpenAI refuses before its context is
    read: no ``model``, or a ``previous_response_id`` (the server keeps nothing, and it never
    resolves one over plain HTTP)."""
    if parsed.body.get("model") is None:
        raise RequestError(
            "Missing required parameter: 'model'.",
            code="missing_required_parameter",
            param="model",
        )
    if parsed.previous_response_id is not None:
        raise RequestError(
            f"Previous response with id '{parsed.previous_response_id}' not found.",
            code="previous_response_not_found",
            param="previous_response_id",
        )


def compaction_response(
    items: Sequence[dict[str, Any]], folded: Folded, input_tokens: int
) -> dict[str, Any]:
    """OpenAI's ``response.compaction`` object for a context (``items``, whose values are
    ``folded`` and which reads as ``input_tokens`` tokens): :func:`compacted_output`, a new id
    and the usage."""
    output = compacted_output(items, folded)
    return {
        "id": f"resp_{secrets.token_hex(16)}",
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": output,
        "usage": usage(input_tokens, output_tokens(output[-1])),
    }
