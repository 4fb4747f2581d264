"""Client events: each text frame parsed and validated into a create or a steer.

Every client frame is one JSON object. `parse_client_event` turns a text frame into a
`CreateEvent` or a `SteerEvent`, or raises `ProtocolError`, which the connection answers with
an error event (docs/protocol.md, "Errors") before reading the next frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, PlainValidator, ValidationError

from ._items import Items
from ._protocol import SOCKET_ONLY_FIELDS, STREAM_ID, error_event


class ProtocolError(Exception):
    """A request the connection refuses; it becomes one error event."""

    def __init__(
        self,
        message: str,
        *,
        code: str,
        param: str | None = None,
        status: int = 400,
        type: str = "invalid_request_error",
        stream_id: str | None = None,
        on_lane: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.status = status
        self.type = type
        self.stream_id = stream_id
        #: The refusal belongs to a create's lane (`stream_id`, None for the default lane) and
        #: is answered in that lane's order.
        self.on_lane = on_lane

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only settings: rebuilt from them, for refusals made in a worker process.
        settings = {key: getattr(self, key) for key in _REFUSAL_SETTINGS}
        return _refusal, (self.message, settings)

    def event(self) -> dict[str, Any]:
        """The error event for this refusal."""
        return error_event(
            self.status,
            self.type,
            self.code,
            self.message,
            param=self.param,
            stream_id=self.stream_id,
        )


# Validation models. They check the types of the fields ws_mode itself reads; every other
# field is forwarded to the handler as the client sent it, and the handler validates it.


def _items(value: Any) -> Any:
    """An array of objects, checked without the copy pydantic would make of each one (a frame
    may hold a million items)."""
    if type(value) is not list or not all(type(item) is dict for item in value):
        raise ValueError("expected an array of objects")
    return value


def _input(value: Any) -> Any:
    return value if value is None or type(value) is str else _items(value)


def _tools(value: Any) -> Any:
    return value if value is None else _items(value)


class _Create(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["response.create"]
    stream_id: str | None = None
    generate: bool | None = None
    background: bool | None = None
    stream: bool | None = None
    previous_response_id: str | None = None
    input: Annotated[Any, PlainValidator(_input)] = None
    instructions: str | None = None
    tools: Annotated[Any, PlainValidator(_tools)] = None
    model: str | None = None


class _Steer(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["response.steer"]
    previous_response_id: str
    input: Any = None


#: The only fields `response.steer` takes.
_STEER_FIELDS = frozenset({"type", "previous_response_id", "input"})

_REFUSAL_SETTINGS = ("code", "param", "status", "type", "stream_id", "on_lane")


def _refusal(message: str, settings: dict[str, Any]) -> ProtocolError:
    return ProtocolError(message, **settings)


@dataclass(slots=True)
class CreateEvent:
    """A validated `response.create`.

    `fields` holds what goes to the handler: every field the client sent except the
    socket-only ones, `input` and `previous_response_id` (the turn decides those).
    `items` holds the client's input as items (a string becomes one user message);
    `input_text` the input when the client sent a string, and `input_sent` whether it sent
    an input at all.
    """

    fields: dict[str, Any]
    items: Items
    input_text: str | None
    input_sent: bool
    previous_response_id: str | None
    stream_id: str | None
    generate: bool
    tools: list[dict[str, Any]] | None
    #: The frame's length, what a waiting request is counted as (`Limits.max_queued_bytes`).
    size: int = 0

    @property
    def new_input(self) -> list[dict[str, Any]]:
        """The client's input as items."""
        return self.items.list

    @property
    def raw_input(self) -> str | list[dict[str, Any]] | None:
        """The input exactly as sent, or None when it was absent."""
        if self.input_text is not None:
            return self.input_text
        return self.items.list if self.input_sent else None


@dataclass(slots=True)
class SteerEvent:
    """A `response.steer`: extra user input for an active response."""

    previous_response_id: str
    input: Any
    #: Fields besides `type`, `previous_response_id` and `input`, which the event does not
    #: accept; refused with `response.steer.failed` (the input goes back to the client).
    unexpected: tuple[str, ...] = ()


@dataclass(slots=True)
class ProcessedEvent:
    """A `response.processed`: the client says it has handled a response (Codex sends it).
    Nothing answers it."""

    response_id: Any


_EVENTS = ("response.create", "response.steer", "response.processed")


def parse_client_event(text: str) -> CreateEvent | SteerEvent | ProcessedEvent:
    """Parse and validate one text frame; raise `ProtocolError` when it is not acceptable."""
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"The message is not valid JSON: {exc}.", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ProtocolError(
            f"Each message must be a JSON object, got {_json_type(data)}.",
            code="invalid_event",
        )
    event_type = data.get("type")
    if event_type == "response.create":
        return _parse_create(data, len(text))
    if event_type == "response.steer":
        return _parse_steer(data)
    if event_type == "response.processed":
        return ProcessedEvent(response_id=data.get("response_id"))
    if event_type is None:
        raise ProtocolError(
            "The message has no 'type'; expected one of: " + ", ".join(_EVENTS) + ".",
            code="missing_required_parameter",
            param="type",
        )
    shown = repr(event_type)[:80] if isinstance(event_type, str) else _json_type(event_type)
    raise ProtocolError(
        f"Unknown event type {shown}; expected one of: " + ", ".join(_EVENTS) + ".",
        code="unknown_event_type",
        param="type",
    )


def _parse_create(data: dict[str, Any], size: int) -> CreateEvent:
    stream_id = data.get("stream_id")
    # The lane is known before anything else is checked, so later errors can carry it.
    if stream_id is not None and not (isinstance(stream_id, str) and STREAM_ID.match(stream_id)):
        raise ProtocolError(
            "Invalid 'stream_id': it must be 1 to 256 characters of letters, digits, "
            "'_', '.' and '-'.",
            code="invalid_stream_id",
            param="stream_id",
        )
    refusal: ProtocolError | None = None
    try:
        create = _Create.model_validate(data)
    except ValidationError as exc:
        refusal = _validation_error(exc, stream_id)
    if refusal is not None:
        # Raised outside the handler: a refusal waiting on its lane must not keep the
        # validation error, which holds the whole frame.
        refusal.on_lane = True
        raise refusal
    problem = store_problem(data.get("store"))
    if problem is not None:
        raise ProtocolError(
            problem, code="invalid_type", param="store", stream_id=stream_id, on_lane=True
        )
    if create.background:
        raise ProtocolError(
            "'background: true' is not supported in WebSocket mode; "
            "use the HTTP API for background responses.",
            code="unsupported_parameter",
            param="background",
            stream_id=stream_id,
            on_lane=True,
        )
    raw_input = data.get("input")
    if isinstance(raw_input, str):
        items = Items(text_input(raw_input))
    else:
        items = Items(raw_input if raw_input is not None else [])
    fields = {
        key: value
        for key, value in data.items()
        if key not in SOCKET_ONLY_FIELDS and key not in ("input", "previous_response_id")
    }
    fields["stream"] = True
    return CreateEvent(
        fields=fields,
        items=items,
        input_text=raw_input if isinstance(raw_input, str) else None,
        input_sent=raw_input is not None,
        previous_response_id=create.previous_response_id,
        stream_id=stream_id,
        generate=create.generate is not False,
        tools=data.get("tools"),
        size=size,
    )


def _parse_steer(data: dict[str, Any]) -> SteerEvent:
    try:
        steer = _Steer.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc, None) from None
    unexpected = tuple(key for key in data if key not in _STEER_FIELDS)
    return SteerEvent(
        previous_response_id=steer.previous_response_id, input=steer.input, unexpected=unexpected
    )


def _validation_error(exc: ValidationError, stream_id: str | None) -> ProtocolError:
    first = exc.errors(include_url=False, include_input=False)[0]
    location = [str(part) for part in first["loc"]]
    # Union members add their own names to the location; keep the field path only.
    param = location[0] if location else None
    if first["type"] == "missing":
        return ProtocolError(
            f"Missing required parameter: '{param}'.",
            code="missing_required_parameter",
            param=param,
            stream_id=stream_id,
        )
    expected = {
        "input": "a string or an array of item objects",
        "tools": "an array of tool objects",
    }.get(param or "", _expected_type(first["type"]))
    return ProtocolError(
        f"Invalid type for '{param}': expected {expected}.",
        code="invalid_type",
        param=param,
        stream_id=stream_id,
    )


def _expected_type(error_type: str) -> str:
    for name, words in (
        ("string", "a string"),
        ("bool", "a boolean"),
        ("literal", "one of the allowed values"),
    ):
        if name in error_type:
            return words
    return "a value of another type"


def _json_type(value: object) -> str:
    return {
        list: "an array",
        str: "a string",
        int: "a number",
        float: "a number",
        bool: "a boolean",
        dict: "an object",
        type(None): "null",
    }.get(type(value), "another value")


def store_problem(value: Any) -> str | None:
    """Why `value` is not a valid `store` field, or None: the API takes a boolean or null
    (null and absent mean true); `0` or `"false"` are refused, never read as true. Both the
    socket and stateful HTTP check a request's `store` here."""
    if value is None or type(value) is bool:
        return None
    return f"Invalid type for 'store': expected a boolean, but got {_json_type(value)} instead."


def may_store(requested: Any, response: Any) -> bool:
    """Whether a finished response may be persisted: neither its request's `store` nor the
    response object's own `store` is false."""
    said = response.get("store") if isinstance(response, dict) else None
    return requested is not False and said is not False


def text_input(text: str) -> list[dict[str, Any]]:
    """A string `input` as the items it stands for: one user message."""
    return [{"role": "user", "content": text}]
