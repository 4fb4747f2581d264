"""Request parsing and validation for the reference server: the body fields it reads, checked
the way OpenAI's API checks them, and its 400 answers (``invalid_request_error``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson
from starlette.responses import Response

from ws_mode.protocol import error_body

__all__ = ["OVERRIDE_KEY", "Parsed", "RequestError", "parse"]

OVERRIDE_KEY: Final = "reference_tool_calls"
"""The ``metadata`` key whose value overrides ``ReferenceConfig.tool_calls`` for one request."""


class RequestError(Exception):
    """A request the server refuses, with OpenAI's error body."""

    def __init__(self, message: str, *, code: str, param: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param

    def response(self) -> Response:
        """The HTTP 400 answer carrying this error."""
        body = error_body("invalid_request_error", self.code, self.message, self.param)
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
    tools = _optional(body, "tools", list, "an array of tools")
    if tools is not None:
        _require_objects("tools", tools)
    metadata = _optional(body, "metadata", dict, "an object") or {}
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise _invalid_type(f"metadata.{key}", "a string", value)
    tool_calls = _tool_call_override(metadata)
    _optional(body, "model", str, "a string")
    _optional(body, "parallel_tool_calls", bool, "a boolean")
    _optional(body, "store", bool, "a boolean")
    _optional(body, "max_output_tokens", int, "an integer")
    return Parsed(
        body=body,
        input=items,
        previous_response_id=_optional(body, "previous_response_id", str, "a string"),
        instructions=_optional(body, "instructions", str, "a string"),
        tools=tools,
        metadata=metadata,
        tool_calls=tool_calls,
        stream=bool(_optional(body, "stream", bool, "a boolean")),
    )


def _input_items(raw_input: object) -> list[dict[str, Any]]:
    """``input`` as a list of items: absent is none, a string is one user message."""
    if raw_input is None:
        return []
    if isinstance(raw_input, str):
        return [{"role": "user", "content": raw_input}]
    if isinstance(raw_input, list):
        return _require_objects("input", raw_input)
    raise _invalid_type("input", "a string or an array of input items", raw_input)


def _require_objects(param: str, values: list[Any]) -> list[dict[str, Any]]:
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


def _optional(body: dict[str, Any], key: str, kind: type, expected: str) -> Any:
    """``body[key]`` if present and not null (``None`` otherwise), checked to be a ``kind``."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise _invalid_type(key, expected, value)
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
