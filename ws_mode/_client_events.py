"""Client events: each text frame parsed and validated into a create, a steer or an interrupt.

Every client frame is one JSON object. `parse_client_event` turns a text frame into a
`CreateEvent`, a `SteerEvent` or an `InterruptEvent`, or raises `ProtocolError`, which the
connection answers with an error event (docs/protocol.md, "Errors") before reading the next
frame.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import orjson

from ._items import Items
from ._protocol import MAX_ID_CHARS, SOCKET_ONLY_FIELDS, STREAM_ID, error_event


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


# The checks of the fields ws_mode itself reads (`stream_id` is checked first, on its own),
# in the order they run: the first that fails is the one reported. Every other field is
# forwarded to the handler as the client sent it, and the handler validates it. Types are
# strict: a number is not a boolean, `"false"` is not false.


def _optional_str(value: Any) -> bool:
    return value is None or type(value) is str


def _optional_bool(value: Any) -> bool:
    return value is None or type(value) is bool


def _items(value: Any) -> bool:
    """An array of objects (a frame may hold a million items: no copy is made)."""
    return type(value) is list and all(type(item) is dict for item in value)


def _optional_input(value: Any) -> bool:
    return value is None or type(value) is str or _items(value)


def _optional_tools(value: Any) -> bool:
    return value is None or _items(value)


#: `response.create`'s checked fields: name, check, what the check expects.
_CREATE_FIELDS: Final = (
    ("generate", _optional_bool, "a boolean"),
    ("background", _optional_bool, "a boolean"),
    ("stream", _optional_bool, "a boolean"),
    ("previous_response_id", _optional_str, "a string"),
    ("input", _optional_input, "a string or an array of item objects"),
    ("instructions", _optional_str, "a string"),
    ("tools", _optional_tools, "an array of tool objects"),
    ("model", _optional_str, "a string"),
)


def _type_problem(
    data: dict[str, Any], fields: tuple[tuple[str, Callable[[Any], bool], str], ...]
) -> tuple[str, str] | None:
    """The first of `fields` whose value in `data` fails its check: its name and what it
    expects; None when all pass."""
    for name, check, expected in fields:
        if not check(data.get(name)):
            return name, expected
    return None


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


#: The one way `response.interrupt` ends a response: the items still open are dropped (each
#: gets `response.output_item.interrupted`), the finished ones kept.
INTERRUPT_MODE: Final = "discard_partial_items"


@dataclass(slots=True)
class InterruptEvent:
    """A `response.interrupt`: stop the response `response_id` now (Codex sends it). Fields
    besides `type`, `response_id` and `mode` are not read."""

    response_id: str


_EVENTS = ("response.create", "response.steer", "response.interrupt", "response.processed")


def parse_client_event(text: str) -> CreateEvent | SteerEvent | InterruptEvent | ProcessedEvent:
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
    if event_type == "response.interrupt":
        return _parse_interrupt(data)
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
    wrong = _type_problem(data, _CREATE_FIELDS)
    if wrong is not None:
        raise _invalid_type(*wrong, stream_id=stream_id, on_lane=True)
    problem = store_problem(data.get("store"))
    if problem is not None:
        raise ProtocolError(
            problem, code="invalid_type", param="store", stream_id=stream_id, on_lane=True
        )
    prewarm = _prewarm(data, stream_id)
    previous_response_id = data.get("previous_response_id")
    if previous_response_id is not None and len(previous_response_id) > MAX_ID_CHARS:
        raise too_long_id("previous_response_id", previous_response_id, stream_id, on_lane=True)
    if data.get("background"):
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
        previous_response_id=previous_response_id,
        stream_id=stream_id,
        generate=data.get("generate") is not False and not prewarm,
        tools=data.get("tools"),
        size=size,
    )


def _prewarm(data: dict[str, Any], stream_id: str | None) -> bool:
    """`prompt_cache_options.prewarm`: true prepares the prompt cache without generating
    output, overriding `generate` to false (as the SDKs document it): a warm-up. Checked
    strictly when present, as every field ws_mode reads."""
    options = data.get("prompt_cache_options")
    prewarm = options.get("prewarm") if isinstance(options, dict) else None
    if not _optional_bool(prewarm):
        raise _invalid_type(
            "prompt_cache_options.prewarm", "a boolean", stream_id=stream_id, on_lane=True
        )
    return prewarm is True


def _required_id(data: dict[str, Any], field: str) -> str:
    """The id `field` of an event that names a response: present, a string, not too long."""
    value = data.get(field)
    if value is None and field not in data:
        raise ProtocolError(
            f"Missing required parameter: '{field}'.",
            code="missing_required_parameter",
            param=field,
        )
    if type(value) is not str:
        raise _invalid_type(field, "a string")
    if len(value) > MAX_ID_CHARS:
        raise too_long_id(field, value)
    return value


def _parse_steer(data: dict[str, Any]) -> SteerEvent:
    previous_response_id = _required_id(data, "previous_response_id")
    unexpected = tuple(key for key in data if key not in _STEER_FIELDS)
    return SteerEvent(
        previous_response_id=previous_response_id, input=data.get("input"), unexpected=unexpected
    )


def _parse_interrupt(data: dict[str, Any]) -> InterruptEvent:
    response_id = _required_id(data, "response_id")
    # Absent, it is the one mode there is. Refused before the response is looked up: an
    # interrupt ws_mode cannot honour as asked stops nothing, and the response runs on.
    mode = data.get("mode", INTERRUPT_MODE)
    if mode != INTERRUPT_MODE:
        shown = repr(mode)[:80] if isinstance(mode, str) else _json_type(mode)
        raise ProtocolError(
            f"Invalid value for 'mode': {shown}; the supported value is '{INTERRUPT_MODE}'. "
            "The response was not interrupted.",
            code="invalid_value",
            param="mode",
        )
    return InterruptEvent(response_id=response_id)


def _invalid_type(
    param: str, expected: str, *, stream_id: str | None = None, on_lane: bool = False
) -> ProtocolError:
    return ProtocolError(
        f"Invalid type for '{param}': expected {expected}.",
        code="invalid_type",
        param=param,
        stream_id=stream_id,
        on_lane=on_lane,
    )


def too_long_id(
    param: str, value: str, stream_id: str | None = None, *, on_lane: bool = False
) -> ProtocolError:
    """The refusal of an id longer than any a server issues (`MAX_ID_CHARS`): refused on
    arrival, before it is looked up, stored or recorded anywhere."""
    return ProtocolError(
        f"Invalid '{param}': string too long. Expected a string with maximum length "
        f"{MAX_ID_CHARS}, but got a string with length {len(value)} instead.",
        code="string_above_max_length",
        param=param,
        stream_id=stream_id,
        on_lane=on_lane,
    )


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
