"""The scripted, deterministic model behind the reference server.

Everything here is pure: the same context, instructions, tools and configuration always give
the same output items, and any change to any of them changes the output (through a digest of
their canonical JSON encoding). That makes the model usable as an oracle in tests: a response
produced over WebSocket mode from cached state must equal the one produced over plain HTTP from
the full history.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Final

import orjson

__all__ = [
    "DEFAULT_TOOL_NAME",
    "ReferenceConfig",
    "argument_chunks",
    "argument_tokens",
    "context_digest",
    "count_words",
    "output_tokens",
    "script",
    "text_deltas",
    "tool_calls_since_user",
]

DEFAULT_TOOL_NAME: Final = "lookup"
"""The function name used when the request declares no tool of type ``"function"``."""

_FILLER: Final = (
    "lorem",
    "ipsum",
    "dolor",
    "sit",
    "amet",
    "consectetur",
    "adipiscing",
    "elit",
    "sed",
    "do",
    "eiusmod",
    "tempor",
    "incididunt",
    "ut",
    "labore",
    "magna",
)
_PADDING_ALPHABET: Final = "abcdefghijklmnopqrstuvwxyz0123456789"
_MAX_ARGUMENT_CHUNKS: Final = 4
_CHARS_PER_TOKEN: Final = 4
# Keys of structural (non-text) fields, left out of the word counts used for `usage`.
_STRUCTURAL_KEYS: Final = frozenset({"type", "role", "id", "call_id", "status", "name"})


def _require_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"ReferenceConfig.{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"ReferenceConfig.{name} must be >= {minimum}, got {value}")


@dataclass(frozen=True)
class ReferenceConfig:
    """How the scripted model behaves.

    Attributes:
        tool_calls: how many tool calls the model asks for, counted since the last user
            message, before it answers. A request can override it with
            ``metadata["reference_tool_calls"]`` (a string holding an int).
        tokens_per_second: simulated generation speed; 0 means no delay at all.
        answer_tokens: words in the final answer (at least 1).
        argument_padding: extra filler characters in each tool call's arguments.
    """

    tool_calls: int = 3
    tokens_per_second: float = 0.0
    answer_tokens: int = 40
    argument_padding: int = 0

    def __post_init__(self) -> None:
        """Reject values the model cannot honour, with a message naming the field."""
        _require_int("tool_calls", self.tool_calls, 0)
        _require_int("answer_tokens", self.answer_tokens, 1)
        _require_int("argument_padding", self.argument_padding, 0)
        tps: object = self.tokens_per_second
        if isinstance(tps, bool) or not isinstance(tps, int | float):
            raise ValueError(
                f"ReferenceConfig.tokens_per_second must be a number, got {type(tps).__name__}"
            )
        if not math.isfinite(tps) or tps < 0:
            raise ValueError(
                f"ReferenceConfig.tokens_per_second must be finite and >= 0 (0 = no delay), "
                f"got {tps!r}"
            )


def context_digest(
    context: list[dict[str, Any]],
    instructions: str | None,
    tools: list[dict[str, Any]] | None,
) -> str:
    """A short hex digest (first 16 hex chars of sha256) of the canonical JSON encoding
    (sorted keys, no whitespace) of the whole context, the instructions and the tools."""
    payload = {"context": context, "instructions": instructions, "tools": tools}
    try:
        encoded = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        # orjson refuses integers beyond 64 bits; the standard library does not.
        encoded = json.dumps(
            payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


def _is_user_message(item: dict[str, Any]) -> bool:
    return item.get("role") == "user" and item.get("type", "message") == "message"


def tool_calls_since_user(context: list[dict[str, Any]]) -> int:
    """The number of ``function_call_output`` items after the last user-role message
    (in the whole context when it holds no user message)."""
    count = 0
    for item in reversed(context):
        if _is_user_message(item):
            break
        if item.get("type") == "function_call_output":
            count += 1
    return count


def _tool_name(tools: list[dict[str, Any]] | None) -> str:
    for tool in tools or ():
        name = tool.get("name")
        if tool.get("type") == "function" and isinstance(name, str) and name:
            return name
    return DEFAULT_TOOL_NAME


def _padding(length: int) -> str:
    alphabet = _PADDING_ALPHABET
    repeats = length // len(alphabet) + 1
    return (alphabet * repeats)[:length]


def _answer_text(digest: str, calls: int, words: int) -> str:
    noun = "call" if calls == 1 else "calls"
    base = [f"[{digest}]", "answered", "after", str(calls), "tool", f"{noun}."]
    filler = (_FILLER[i % len(_FILLER)] for i in range(max(0, words - len(base))))
    return " ".join([*base[:words], *filler])


def script(
    context: list[dict[str, Any]],
    instructions: str | None,
    tools: list[dict[str, Any]] | None,
    config: ReferenceConfig,
) -> list[dict[str, Any]]:
    """Run the scripted model: return the output items (status ``"completed"``) for a context.

    While fewer than ``config.tool_calls`` ``function_call_output`` items follow the last user
    message, the model asks for one more call of the first ``"function"`` tool (``"lookup"`` if
    there is none), with arguments ``{"step": k, "context_digest": d}`` (k counts from 1) plus a
    ``"padding"`` string of ``config.argument_padding`` characters when that is non-zero.
    Otherwise it answers with one assistant message of ``config.answer_tokens`` words that
    starts with ``[d]`` and says how many tool calls happened.

    ``d`` is :func:`context_digest` of the whole input; item ids are derived from it, so two
    calls give equal output exactly when their context, instructions and tools are equal.
    """
    digest = context_digest(context, instructions, tools)
    calls = tool_calls_since_user(context)
    if calls < config.tool_calls:
        arguments: dict[str, Any] = {"step": calls + 1, "context_digest": digest}
        if config.argument_padding:
            arguments["padding"] = _padding(config.argument_padding)
        return [
            {
                "type": "function_call",
                "id": f"fc_{digest}",
                "call_id": f"call_{digest}",
                "name": _tool_name(tools),
                "arguments": orjson.dumps(arguments).decode(),
                "status": "completed",
            }
        ]
    text = _answer_text(digest, calls, config.answer_tokens)
    return [
        {
            "type": "message",
            "id": f"msg_{digest}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    ]


def text_deltas(text: str) -> list[str]:
    """Split an answer into its streamed deltas: each word with the space that follows it.

    The deltas concatenate back to ``text`` exactly."""
    words = text.split(" ")
    return [f"{word} " for word in words[:-1]] + [words[-1]]


def argument_chunks(arguments: str) -> list[str]:
    """Split tool-call arguments into a few (at most 4) nearly equal streamed chunks."""
    if not arguments:
        return [""]
    size = math.ceil(len(arguments) / _MAX_ARGUMENT_CHUNKS)
    return [arguments[i : i + size] for i in range(0, len(arguments), size)]


def argument_tokens(chunk: str) -> int:
    """Simulated tokens in a piece of tool-call arguments (about 4 characters per token)."""
    return max(1, math.ceil(len(chunk) / _CHARS_PER_TOKEN))


def count_words(value: Any) -> int:
    """Words (whitespace-separated) in every string of a JSON value, structural fields
    (``type``, ``role``, ``id``, ``call_id``, ``status``, ``name``) excepted."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, dict):
        return sum(count_words(v) for k, v in value.items() if k not in _STRUCTURAL_KEYS)
    if isinstance(value, list):
        return sum(count_words(v) for v in value)
    return 0


def output_tokens(item: dict[str, Any]) -> int:
    """Simulated output tokens of one output item: the answer's words, or the arguments'
    length at about 4 characters per token."""
    if item.get("type") == "function_call":
        return sum(argument_tokens(chunk) for chunk in argument_chunks(item["arguments"]))
    return sum(len(text_deltas(part["text"])) for part in item.get("content", ()))
