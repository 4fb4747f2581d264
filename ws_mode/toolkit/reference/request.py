"""Request parsing and validation for the reference server: the body fields it reads, checked
the way OpenAI's API checks them, and its 400 answers (``invalid_request_error``).

The sampling and routing fields a response object echoes (``temperature``, ``top_p``,
``service_tier``, ``prompt_cache_key``, ...) are type-checked here and echoed by
:mod:`ws_mode.toolkit.reference.response`; ``context_management`` gives the compaction threshold."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson
from starlette.responses import Response

from ws_mode._protocol import error_body

__all__ = [
    "DEFAULT_COMPACT_THRESHOLD",
    "OVERRIDE_KEY",
    "Parsed",
    "RequestError",
    "optional",
    "parse",
    "require_objects",
]

OVERRIDE_KEY: Final = "reference_tool_calls"
"""The ``metadata`` key whose value overrides ``ReferenceConfig.tool_calls`` for one request."""
DEFAULT_COMPACT_THRESHOLD: Final = 128_000
"""The compaction threshold of a ``context_management`` entry that names none: the input
tokens at which the reference model's (notional) context window counts as full."""
_NUMBER: Final = (int, float)
# The fields a response echoes, type-checked: (field, expected type, what the error calls it).
_ECHOED: Final[tuple[tuple[str, type | tuple[type, ...], str], ...]] = (
    ("temperature", _NUMBER, "a number"),
    ("top_p", _NUMBER, "a number"),
    ("presence_penalty", _NUMBER, "a number"),
    ("frequency_penalty", _NUMBER, "a number"),
    ("top_logprobs", int, "an integer"),
    ("max_tool_calls", int, "an integer"),
    ("service_tier", str, "a string"),
    ("safety_identifier", str, "a string"),
    ("prompt_cache_key", str, "a string"),
    ("user", str, "a string"),
    ("truncation", str, "a string"),
    ("text", dict, "an object"),
    ("reasoning", dict, "an object"),
    ("tool_choice", (str, dict), "a string or an object"),
)


class RequestError(Exception):
    """A request the server refuses, with OpenAI's error body (``code`` may be None, as in
    OpenAI's answer to a ``function_call_output`` that answers no call)."""

    def __init__(self, message: str, *, code: str | None, param: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param

    def response(self) -> Response:
        """The HTTP 400 answer carrying this error."""
        if self.code is not None:
            body = error_body("invalid_request_error", self.code, self.message, self.param)
        else:
            # `error_body` takes a code; OpenAI sends some refusals with a null one.
            error = {
                "type": "invalid_request_error",
                "code": None,
                "message": self.message,
                "param": self.param,
            }
            body = orjson.dumps({"error": error})
        return Response(body, status_code=400, media_type="application/json")


@dataclass(frozen=True)
class Parsed:
    """The fields of a request body the server uses."""

    body: dict[str, Any]
    input: list[dict[str, Any]]
    previous_response_id: str | None
    instructions: str | None
    tools: list[dict[str, Any]] | None
    metadata: dict[str, str]
    tool_calls: int | None
    stream: bool
    compact_threshold: int | None = None
    """Input tokens from which the response compacts its context (``context_management``);
    None: never."""


def parse(raw: bytes) -> Parsed:
    """Decode and check a request body; raise :class:`RequestError` for what OpenAI refuses."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestError(
            f"We could not parse the JSON body of your request: {exc}.",
            code="invalid_json",
            param=None,
        ) from None
    if not isinstance(body, dict):
        raise RequestError(
            f"The request body must be a JSON object, but got {_json_type(body)}.",
            code="invalid_type",
            param=None,
        )

    # Checked in this order: the first bad field is the one reported.
    items = _input_items(body.get("input"))
    tools = optional(body, "tools", list, "an array of tools")
    if tools is not None:
        require_objects("tools", tools)
    metadata = optional(body, "metadata", dict, "an object") or {}
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise _invalid_type(f"metadata.{key}", "a string", value)
    tool_calls = _tool_call_override(metadata)
    optional(body, "model", str, "a string")
    optional(body, "parallel_tool_calls", bool, "a boolean")
    optional(body, "store", bool, "a boolean")
    optional(body, "max_output_tokens", int, "an integer")
    for key, kind, expected in _ECHOED:
        optional(body, key, kind, expected)
    return Parsed(
        body=body,
        input=items,
        previous_response_id=optional(body, "previous_response_id", str, "a string"),
        instructions=optional(body, "instructions", str, "a string"),
        tools=tools,
        metadata=metadata,
        tool_calls=tool_calls,
        stream=bool(optional(body, "stream", bool, "a boolean")),
        compact_threshold=_compact_threshold(body),
    )


def _compact_threshold(body: dict[str, Any]) -> int | None:
    """The lowest ``compact_threshold`` of the ``context_management`` entries (each of type
    ``compaction``, the only one OpenAI supports), or None without any."""
    entries = optional(body, "context_management", list, "an array of objects")
    if not entries:
        return None
    require_objects("context_management", entries)
    thresholds = []
    for index, entry in enumerate(entries):
        where = f"context_management[{index}]"
        kind = entry.get("type")
        if not isinstance(kind, str):
            raise _invalid_type(f"{where}.type", "a string", kind)
        if kind != "compaction":
            raise RequestError(
                f"Invalid value for '{where}.type': only 'compaction' is supported, got {kind!r}.",
                code="invalid_value",
                param=f"{where}.type",
            )
        threshold = optional(entry, "compact_threshold", int, "an integer", where=where)
        if threshold is not None and threshold < 1:
            raise RequestError(
                f"Invalid value for '{where}.compact_threshold': expected an integer >= 1, "
                f"got {threshold}.",
                code="invalid_value",
                param=f"{where}.compact_threshold",
            )
        thresholds.append(DEFAULT_COMPACT_THRESHOLD if threshold is None else threshold)
    return min(thresholds)


def _input_items(raw_input: object) -> list[dict[str, Any]]:
    """``input`` as a list of items: absent is none, a string is one user message."""
    if raw_input is None:
        return []
    if isinstance(raw_input, str):
        return [{"role": "user", "content": raw_input}]
    if isinstance(raw_input, list):
        items = require_objects("input", raw_input)
        for index, item in enumerate(items):
            if item.get("type") == "additional_tools":
                _check_additional_tools(f"input[{index}]", item)
        return items
    raise _invalid_type("input", "a string or an array of input items", raw_input)


def _check_additional_tools(where: str, item: dict[str, Any]) -> None:
    """An ``additional_tools`` item, as Codex sends its tools for Responses Lite models: role
    ``developer`` and ``tools`` an array of tool objects (a ``namespace`` tool holds more)."""
    role = item.get("role")
    if role != "developer":
        raise RequestError(
            f"Invalid value for '{where}.role': an additional_tools item's role must be "
            f"'developer', got {role!r}.",
            code="invalid_value",
            param=f"{where}.role",
        )
    tools = item.get("tools")
    if not isinstance(tools, list):
        raise _invalid_type(f"{where}.tools", "an array of tools", tools)
    require_objects(f"{where}.tools", tools)


def require_objects(param: str, values: list[Any]) -> list[dict[str, Any]]:
    """``values``, once each of them is checked to be a JSON object."""
    for index, value in enumerate(values):
        if not isinstance(value, dict):
            raise _invalid_type(f"{param}[{index}]", "an object", value)
    return values


def _tool_call_override(metadata: dict[str, str]) -> int | None:
    """The per-request tool-call count in ``metadata``, or None when there is none."""
    if OVERRIDE_KEY not in metadata:
        return None
    try:
        tool_calls = int(metadata[OVERRIDE_KEY])
    except ValueError:
        tool_calls = -1
    if tool_calls < 0:
        raise RequestError(
            f"Invalid value for 'metadata.{OVERRIDE_KEY}': expected a string holding an "
            f"integer >= 0, got {metadata[OVERRIDE_KEY]!r}.",
            code="invalid_value",
            param=f"metadata.{OVERRIDE_KEY}",
        )
    return tool_calls


def optional(
    body: dict[str, Any],
    key: str,
    kind: type | tuple[type, ...],
    expected: str,
    *,
    where: str | None = None,
) -> Any:
    """``body[key]`` if present and not null (``None`` otherwise), checked to be a ``kind``
    (a boolean is no number); ``where`` prefixes the parameter an error names."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise _invalid_type(f"{where}.{key}" if where else key, expected, value)
    return value


def _invalid_type(param: str, expected: str, value: object) -> RequestError:
    return RequestError(
        f"Invalid type for '{param}': expected {expected}, but got {_json_type(value)} instead.",
        code="invalid_type",
        param=param,
    )


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
