"""The scripted, deterministic model behind the reference server.

Everything here is pure: the same context, instructions, tools and configuration always give
the same output items, and any change to any of them changes the output (through a digest of
their canonical JSON encoding). That makes the model usable as an oracle in tests: a response
produced over WebSocket mode from cached state must equal the one produced over plain HTTP from
the full history.
"""

from __future__ import annotations

import hashlib
import math
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import orjson

from ._json import canonical_json
from .tokenizer import default_tokenizer

__all__ = [
    "DEFAULT_TOOL_NAME",
    "ReferenceConfig",
    "argument_chunks",
    "context_digest",
    "count_tool_calls",
    "delta_tokens",
    "finish_digest",
    "first_function",
    "fold_items",
    "output_tokens",
    "script",
    "script_from_state",
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
        tokens_per_second: simulated generation speed in output tokens (counted with the
            reference tokenizer) per second; 0 means no delay at all.
        answer_tokens: words in the final answer (at least 1).
        argument_padding: extra filler characters in each tool call's arguments.
        time_to_first_token: seconds slept before the first delta (0 = none).
        rate_limited_model: a model name the server answers with 429 and OpenAI's rate-limit
            headers (``retry-after``, ``x-ratelimit-*``), for testing how clients see rate
            limits; None: no model is.
    """

    tool_calls: int = 3
    tokens_per_second: float = 0.0
    answer_tokens: int = 40
    argument_padding: int = 0
    time_to_first_token: float = 0.0
    rate_limited_model: str | None = None

    def __post_init__(self) -> None:
        """Reject values the model cannot honour, with a message naming the field."""
        _require_int("tool_calls", self.tool_calls, 0)
        _require_int("answer_tokens", self.answer_tokens, 1)
        _require_int("argument_padding", self.argument_padding, 0)
        _require_delay("tokens_per_second", self.tokens_per_second)
        _require_delay("time_to_first_token", self.time_to_first_token)
        if self.rate_limited_model is not None and not isinstance(self.rate_limited_model, str):
            raise TypeError(
                f"rate_limited_model must be a string or None, got {self.rate_limited_model!r}"
            )


def _require_delay(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"ReferenceConfig.{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(
            f"ReferenceConfig.{name} must be finite and >= 0 (0 = no delay), got {value!r}"
        )


def fold_items(state: bytes, items: Iterable[dict[str, Any]]) -> bytes:
    """Fold items into a context digest state: for each item,
    ``state = sha256(state + canonical_json(item)).digest()``. The empty context's state is
    ``b""``, and ``fold_items(fold_items(s, a), b) == fold_items(s, [*a, *b])``: a server that
    kept the state of a context digests a longer one by folding only the new items."""
    for item in items:
        state = hashlib.sha256(state + canonical_json(item)).digest()
    return state


def finish_digest(
    state: bytes, instructions: str | None, tools: list[dict[str, Any]] | None
) -> str:
    """The model's digest of a context given its folded ``state``: the first 16 hex chars of
    ``sha256(state + canonical_json({"instructions": ..., "tools": ...}))``."""
    settings = canonical_json({"instructions": instructions, "tools": tools})
    return hashlib.sha256(state + settings).hexdigest()[:16]


def context_digest(
    context: list[dict[str, Any]],
    instructions: str | None,
    tools: list[dict[str, Any]] | None,
) -> str:
    """A short hex digest of the whole context, the instructions and the tools:
    :func:`finish_digest` of :func:`fold_items` over the context from ``b""``."""
    return finish_digest(fold_items(b"", context), instructions, tools)


def _is_user_message(item: dict[str, Any]) -> bool:
    return item.get("role") == "user" and item.get("type", "message") == "message"


def tool_calls_since_user(context: list[dict[str, Any]]) -> int:
    """The number of ``function_call_output`` items after the last user-role message
    (in the whole context when it holds no user message), found by scanning back from the end."""
    count = 0
    for item in reversed(context):
        if _is_user_message(item):
            break
        if item.get("type") == "function_call_output":
            count += 1
    return count


def count_tool_calls(count: int, items: Iterable[dict[str, Any]]) -> int:
    """:func:`tool_calls_since_user` of a context extended by ``items``, given ``count``,
    its value for the context before them: a user message resets it, an output adds one."""
    for item in items:
        if _is_user_message(item):
            count = 0
        elif item.get("type") == "function_call_output":
            count += 1
    return count


#: A function the model calls: its name, and the namespace it is declared in (None: none).
Function = tuple[str, str | None]


def first_function(tools: Iterable[Any] | None) -> Function | None:
    """The first ``"function"`` tool of ``tools``, looking into ``"namespace"`` tools (whose
    calls name their namespace) in order; None when there is none."""
    for tool in tools or ():
        if not isinstance(tool, dict):
            continue
        kind, name = tool.get("type"), tool.get("name")
        if kind == "function" and isinstance(name, str) and name:
            return name, None
        inner = tool.get("tools")
        if kind == "namespace" and isinstance(name, str) and name and isinstance(inner, list):
            found = first_function(tool for tool in inner if tool.get("type") == "function")
            if found is not None:
                return found[0], name
    return None


def context_function(
    items: Iterable[dict[str, Any]], found: Function | None = None
) -> Function | None:
    """``found``, else the first function declared by an ``additional_tools`` item of
    ``items`` (the tools a request made available in its input, as Codex sends them for
    Responses Lite models), else None."""
    if found is not None:
        return found
    for item in items:
        if item.get("type") == "additional_tools" and isinstance(item.get("tools"), list):
            found = first_function(item["tools"])
            if found is not None:
                return found
    return None


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
    message, the model asks for one more call of the first ``"function"`` tool (inside a
    ``"namespace"`` tool too; then the call names the namespace), of ``tools`` or else of the
    context's ``additional_tools`` items (``"lookup"`` if there is none), with arguments
    ``{"step": k, "context_digest": d}`` (k counts from 1) plus a ``"padding"`` string of
    ``config.argument_padding`` characters when that is non-zero.
    Otherwise it answers with one assistant message of ``config.answer_tokens`` words that
    starts with ``[d]`` and says how many tool calls happened.

    ``d`` is :func:`context_digest` of the whole input; item ids are derived from it, so two
    calls give equal output exactly when their context, instructions and tools are equal.
    """
    state = fold_items(b"", context)
    calls = tool_calls_since_user(context)
    declared = context_function(context)
    return script_from_state(state, calls, instructions, tools, config, declared=declared)


def script_from_state(
    state: bytes,
    tool_calls: int,
    instructions: str | None,
    tools: list[dict[str, Any]] | None,
    config: ReferenceConfig,
    *,
    declared: Function | None = None,
) -> list[dict[str, Any]]:
    """:func:`script` of a context known only by its folded digest ``state``
    (:func:`fold_items`) and its :func:`tool_calls_since_user` count ``tool_calls``;
    ``declared`` is its :func:`context_function`."""
    digest = finish_digest(state, instructions, tools)
    if tool_calls < config.tool_calls:
        arguments: dict[str, Any] = {"step": tool_calls + 1, "context_digest": digest}
        if config.argument_padding:
            arguments["padding"] = _padding(config.argument_padding)
        name, namespace = first_function(tools) or declared or (DEFAULT_TOOL_NAME, None)
        call = {
            "type": "function_call",
            "id": f"fc_{digest}",
            "call_id": f"call_{digest}",
            "name": name,
            "arguments": orjson.dumps(arguments).decode(),
            "status": "completed",
        }
        if namespace is not None:
            call["namespace"] = namespace
        return [call]
    text = _answer_text(digest, tool_calls, config.answer_tokens)
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


def delta_tokens(deltas: list[str]) -> list[int]:
    """The output tokens each streamed delta carries: the reference tokenizer's tokens of the
    deltas' whole text, each counted in the delta that holds its last character. They add up
    to the token count of the text."""
    counts = [0] * len(deltas)
    if not counts:
        return counts
    bounds: list[int] = []
    end = 0
    for delta in deltas:
        end += len(delta)
        bounds.append(end)
    last = len(counts) - 1
    for token_end in default_tokenizer().token_ends("".join(deltas)):
        counts[min(bisect_right(bounds, max(token_end - 1, 0)), last)] += 1
    return counts


def output_tokens(item: dict[str, Any]) -> int:
    """Output tokens of one output item: the reference tokenizer's tokens of its arguments
    (a function call), of its id (a compaction item, whose content is opaque) or of its
    content parts' text."""
    tokenizer = default_tokenizer()
    if item.get("type") == "function_call":
        return len(tokenizer.encode(item["arguments"]))
    if item.get("type") == "compaction":
        return len(tokenizer.encode(item["id"]))
    return sum(len(tokenizer.encode(part["text"])) for part in item.get("content", ()))
