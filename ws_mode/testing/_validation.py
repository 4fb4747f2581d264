"""Protocol validity of what the client received: each frame one JSON event with a `type`, and
each turn's events a valid response stream (docs/protocol.md, "Server events" and "Errors")."""

from __future__ import annotations

import functools
import re
import typing
from collections.abc import Mapping
from typing import Any

from .._protocol import RESPONSE_EVENTS, TERMINAL_EVENT_BY_STATUS
from ._diff import short
from ._items import Item, copy_json
from ._program import Step
from ._report import TurnFailed


def frame_failure(kind: str, frame: str | bytes) -> TurnFailed:
    """The failure of a frame that holds no event: a `binary_frame`, one `not_json`, or
    `not_object` (the kinds of `ws_mode.testing._client.FrameError`)."""
    if kind == "binary_frame":
        return TurnFailed(
            "the server sent a binary frame; every event must be JSON in a text frame"
        )
    shown = "frame: " + short(frame if isinstance(frame, str) else repr(frame))
    if kind == "not_json":
        leaked = isinstance(frame, str) and frame.startswith(("event:", "data:"))
        hint = " (SSE framing leaked onto the socket)" if leaked else ""
        return TurnFailed("a frame is not JSON" + hint, shown)
    return TurnFailed("a frame is not a JSON object", shown)


def check_type(event: dict[str, Any]) -> dict[str, Any]:
    """Return `event`; raise `TurnFailed` unless its `type` is a string."""
    if not isinstance(event.get("type"), str):
        raise TurnFailed("an event has no string 'type'", "event: " + short(event))
    return event


def check_events(
    step: Step,
    request: Mapping[str, Any],
    events: list[dict[str, Any]],
    *,
    earlier: Mapping[str, int],
    allow_errors: bool,
    validate_output: bool,
    strict: bool = False,
) -> tuple[dict[str, Any] | None, list[Item]]:
    """Check one turn's events, ending with its terminal event; return the final response
    object (None after an `error`) and a copy of its output items.

    `request` is what the client sent, `earlier` the response ids returned by earlier turns
    (with their turn); errors fail the turn unless `allow_errors`, `validate_output` checks
    the items with the openai SDK's models, and `strict` requires every field the SDKs
    require of each event (`require_sdk_fields`)."""
    if strict:
        for number, event in enumerate(events):
            require_sdk_fields(f"event {number} ({event['type']})", event)
    numbered = [isinstance(event.get("sequence_number"), int) for event in events]
    if any(numbered) and not all(numbered):
        number = numbered.index(False)
        raise TurnFailed(
            f"event {number} ({events[number]['type']}) has no sequence_number, while other "
            "events of the turn do (the SDKs require it on every event)",
            "event: " + short(events[number]),
        )
    sent_previous = request.get("previous_response_id")
    last_number: int | None = None
    response_id: str | None = None
    done_items: dict[int, Item] = {}
    for number, event in enumerate(events):
        kind = event["type"]
        where = f"event {number} ({kind})"
        if step.lane is None and "stream_id" in event:
            raise TurnFailed(
                f"{where} carries a stream_id on the default lane",
                f"stream_id: {event['stream_id']!r}",
            )
        if step.lane is not None and event.get("stream_id") != step.lane:
            raise TurnFailed(
                f"{where} does not carry its lane's stream_id",
                f"expected {step.lane!r}, got {event.get('stream_id')!r}",
            )
        sequence = event.get("sequence_number")
        if sequence is not None:
            if not isinstance(sequence, int) or isinstance(sequence, bool):
                raise TurnFailed(f"{where} has a sequence_number that is not an integer")
            if last_number is not None and sequence <= last_number:
                raise TurnFailed(
                    f"{where}: sequence numbers do not increase",
                    f"{sequence} follows {last_number}",
                )
            last_number = sequence
        if kind == "response.created" and number != 0:
            raise TurnFailed(f"{where}: response.created is not the first event of the turn")
        if kind == "error":
            _check_error(where, event)
        if kind in RESPONSE_EVENTS:
            response = event.get("response")
            if not isinstance(response, dict) or not isinstance(response.get("id"), str):
                raise TurnFailed(f"{where} has no response object with an id")
            if response_id is None:
                response_id = response["id"]
            elif response["id"] != response_id:
                raise TurnFailed(
                    f"{where}: the response id changed within the turn",
                    f"{response['id']!r} after {response_id!r}",
                )
            if response.get("object", "response") != "response":
                raise TurnFailed(f"{where}: the response object's 'object' is not 'response'")
            if response.get("previous_response_id") != sent_previous:
                raise TurnFailed(
                    f"{where}: the response object does not echo the client's previous_response_id",
                    f"sent {sent_previous!r}, the response says "
                    f"{response.get('previous_response_id')!r}",
                )
        if kind == "response.output_item.done" and isinstance(event.get("item"), dict):
            index = event.get("output_index")
            done_items[index if isinstance(index, int) else len(done_items)] = event["item"]
    first, last = events[0]["type"], events[-1]["type"]
    if first != "response.created" and not (first == "error" and len(events) == 1):
        raise TurnFailed(
            "the turn does not start with response.created",
            "a turn is response.created ... terminal event, or one error event",
        )
    if last == "error" or last == "response.failed":
        if not allow_errors:
            raise TurnFailed(
                f"the turn ended with {last} (pass allow_errors=True to accept errors)",
                "terminal event: " + short(events[-1], 600),
            )
        if last == "response.failed":
            failed: dict[str, Any] = events[-1]["response"]
            if failed.get("status") != "failed":
                raise TurnFailed(f"response.failed carries status {failed.get('status')!r}")
            return failed, []
        return None, []
    response = events[-1]["response"]
    if response_id is not None and response_id in earlier:
        raise TurnFailed(
            "the response id is not new",
            f"{response_id!r} was already returned by turn {earlier[response_id]}",
        )
    status = response.get("status")
    if not isinstance(status, str) or TERMINAL_EVENT_BY_STATUS.get(status) != last:
        raise TurnFailed(
            f"{last} carries a response whose status is {status!r}",
            f"expected {last.removeprefix('response.')!r}",
        )
    output = response.get("output")
    if not isinstance(output, list) or (not output and done_items):
        # A terminal event may omit the output; the finished items hold it.
        output = [done_items[index] for index in sorted(done_items)]
    if not all(isinstance(item, dict) for item in output):
        raise TurnFailed("the response's output holds something that is not an item object")
    if not step.generate:
        if last != "response.completed" or output:
            raise TurnFailed(
                "a warm-up (generate: false) must end with response.completed and no output",
                f"{last} with {len(output)} output item(s)",
            )
    elif validate_output:
        validate_items(output)
    return response, copy_json(output)


def _check_error(where: str, event: dict[str, Any]) -> None:
    """An error event is in the nested envelope, with an HTTP-like status."""
    status, error = event.get("status"), event.get("error")
    if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 599:
        raise TurnFailed(f"{where}: the error event has no HTTP-like 'status'", short(event))
    if not (
        isinstance(error, dict)
        and isinstance(error.get("type"), str)
        and isinstance(error.get("message"), str)
    ):
        raise TurnFailed(
            f"{where}: the error is not in the nested envelope "
            '{"type": "error", "status": ..., "error": {"type", "code", "message", "param"}}',
            short(event),
        )


def error_code(event: dict[str, Any]) -> Any:
    """The `code` of an error event's nested error, if any."""
    error = event.get("error")
    return error.get("code") if isinstance(error, dict) else None


def validate_items(output: list[Item]) -> None:
    """Each output item validates with the openai SDK's model of its type (when the SDK is
    installed)."""
    models = _sdk_item_models()
    if models is None:
        return
    from pydantic import ValidationError

    for number, item in enumerate(output):
        model = models.get(item.get("type", "message"))
        if model is None:
            raise TurnFailed(
                f"output item {number} has a type the openai SDK does not know: "
                f"{item.get('type')!r}",
                short(item),
            )
        try:
            model.model_validate(item)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            shown = [
                ".".join(str(part) for part in error["loc"]) + ": " + error["msg"]
                for error in errors[:4]
            ]
            raise TurnFailed(
                f"output item {number} does not validate with the openai SDK's "
                f"{model.__name__} (pass validate_output=False to skip this check)",
                "\n".join([*shown, "item: " + short(item)]),
            ) from None


@functools.cache
def _sdk_item_models() -> dict[str, Any] | None:
    """The openai SDK's output item models by their `type`, or None without the SDK."""
    try:
        from openai.types.responses import ResponseOutputItem
    except ImportError:
        return None
    union = typing.get_args(ResponseOutputItem)[0]
    models: dict[str, Any] = {}
    for member in typing.get_args(union):
        field = getattr(member, "model_fields", {}).get("type")
        for literal in typing.get_args(field.annotation) if field is not None else ():
            if isinstance(literal, str):
                models[literal] = member
    return models


# Strict mode: the fields the SDKs require. Kept apart from the checks above, and independent of
# the openai SDK: the table is the openai SDK's stream event and Response models' required fields.

#: The fields the openai SDK's Response model requires.
RESPONSE_FIELDS = (
    "id",
    "object",
    "created_at",
    "model",
    "output",
    "parallel_tool_calls",
    "tool_choice",
    "tools",
)
_WHERE = ("item_id", "output_index")
_PART = (*_WHERE, "content_index")
_COMMAND = ("command_index", "output_index")
#: The fields (beyond `type` and `sequence_number`) the openai SDK's model of each server event
#: requires: every type of the socket's server-event union (`ResponsesServerEvent`, 62 types in
#: openai-python 3.57 and openai-node 7.59; `error` is checked on its own, in the nested
#: envelope), the steering answers among them, and ws_mode's interrupt events, which no SDK types
#: yet. tests/library/testing/test_sdk_events.py reads the installed SDK's union and checks this
#: table names every type with the same fields, so a newer SDK's event shows up there.
EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(RESPONSE_EVENTS, ("response",)),
    "response.output_item.added": ("item", "output_index"),
    "response.output_item.done": ("item", "output_index"),
    "response.content_part.added": (*_PART, "part"),
    "response.content_part.done": (*_PART, "part"),
    "response.output_text.delta": (*_PART, "delta", "logprobs"),
    "response.output_text.done": (*_PART, "text", "logprobs"),
    "response.output_text.annotation.added": (*_PART, "annotation_index"),
    "response.refusal.delta": (*_PART, "delta"),
    "response.refusal.done": (*_PART, "refusal"),
    # No `name`: neither SDK's model has one (ws_mode's JSON answers add it when they know it).
    "response.function_call_arguments.delta": (*_WHERE, "delta"),
    "response.function_call_arguments.done": (*_WHERE, "arguments"),
    "response.custom_tool_call_input.delta": (*_WHERE, "delta"),
    "response.custom_tool_call_input.done": (*_WHERE, "input"),
    "response.reasoning_summary_part.added": (*_WHERE, "summary_index", "part"),
    "response.reasoning_summary_part.done": (*_WHERE, "summary_index", "part"),
    "response.reasoning_summary_text.delta": (*_WHERE, "summary_index", "delta"),
    "response.reasoning_summary_text.done": (*_WHERE, "summary_index", "text"),
    "response.reasoning_text.delta": (*_PART, "delta"),
    "response.reasoning_text.done": (*_PART, "text"),
    "response.compaction.compacting": _WHERE,
    "response.audio.delta": ("delta",),
    "response.audio.done": (),
    "response.audio.transcript.delta": ("delta",),
    "response.audio.transcript.done": (),
    "response.code_interpreter_call_code.delta": (*_WHERE, "delta"),
    "response.code_interpreter_call_code.done": (*_WHERE, "code"),
    "response.code_interpreter_call.in_progress": _WHERE,
    "response.code_interpreter_call.interpreting": _WHERE,
    "response.code_interpreter_call.completed": _WHERE,
    "response.file_search_call.in_progress": _WHERE,
    "response.file_search_call.searching": _WHERE,
    "response.file_search_call.completed": _WHERE,
    "response.web_search_call.in_progress": _WHERE,
    "response.web_search_call.searching": _WHERE,
    "response.web_search_call.completed": _WHERE,
    "response.image_generation_call.in_progress": _WHERE,
    "response.image_generation_call.generating": _WHERE,
    "response.image_generation_call.partial_image": (
        *_WHERE,
        "partial_image_b64",
        "partial_image_index",
    ),
    "response.image_generation_call.completed": _WHERE,
    "response.mcp_call_arguments.delta": (*_WHERE, "delta"),
    "response.mcp_call_arguments.done": (*_WHERE, "arguments"),
    "response.mcp_call.in_progress": _WHERE,
    "response.mcp_call.completed": _WHERE,
    "response.mcp_call.failed": _WHERE,
    "response.mcp_list_tools.in_progress": _WHERE,
    "response.mcp_list_tools.completed": _WHERE,
    "response.mcp_list_tools.failed": _WHERE,
    "response.shell_call_command.added": (*_COMMAND, "command"),
    "response.shell_call_command.delta": (*_COMMAND, "delta"),
    "response.shell_call_command.done": (*_COMMAND, "command"),
    "response.shell_call_output_content.delta": (*_COMMAND, "item_id", "delta"),
    "response.shell_call_output_content.done": (*_COMMAND, "item_id", "output"),
    # The answers to `response.steer` (not part of any response's stream).
    "response.steer.accepted": ("steer",),
    "response.steer.pending": ("reason", "required_input", "steer"),
    "response.steer.failed": ("error", "steer"),
    # ws_mode's answers to `response.interrupt` (docs/protocol.md): no SDK types them yet.
    "response.interrupt.accepted": ("response_id",),
    "response.interrupt.failed": ("response_id", "error"),
    "response.output_item.interrupted": ("response_id", "item_id", "output_index"),
}
#: The interrupt events of :data:`EVENT_FIELDS`: ws_mode's, not (yet) in the SDKs' union.
WS_MODE_EVENTS: frozenset[str] = frozenset(
    {"response.interrupt.accepted", "response.interrupt.failed", "response.output_item.interrupted"}
)
#: Every server event type the kit knows: :data:`EVENT_FIELDS` and `error`.
KNOWN_EVENTS: frozenset[str] = frozenset({*EVENT_FIELDS, "error"})
#: The fields of an error event's nested error (WebSocket mode's envelope).
ERROR_FIELDS = ("type", "code", "message", "param")


def require_sdk_fields(where: str, event: dict[str, Any]) -> None:
    """Raise `TurnFailed` unless `event` has an integer `sequence_number` and every field the
    SDKs require of its type (its response object's too); an error event needs `status` and
    the nested error's `type`, `code`, `message` and `param` (null allowed)."""
    sequence = event.get("sequence_number")
    if not isinstance(sequence, int) or isinstance(sequence, bool):
        raise TurnFailed(
            f"{where} has no integer sequence_number (strict: the SDKs require one on every event)",
            "event: " + short(event),
        )
    kind = event["type"]
    if kind == "error":
        error = event.get("error")
        missing = [
            name for name in ERROR_FIELDS if not isinstance(error, dict) or name not in error
        ]
        missing = (["status"] if "status" not in event else []) + [f"error.{m}" for m in missing]
    else:
        missing = [name for name in EVENT_FIELDS.get(kind, ()) if name not in event]
        response = event.get("response")
        if kind in RESPONSE_EVENTS and isinstance(response, dict):
            missing += [f"response.{name}" for name in RESPONSE_FIELDS if name not in response]
    if missing:
        raise TurnFailed(
            f"{where} lacks fields the SDKs require (strict): {', '.join(missing)}",
            "event: " + short(event),
        )


def sdk_models_available() -> bool:
    """Whether the openai SDK's models are there to validate output items."""
    return _sdk_item_models() is not None


def envelope_problems(event: Mapping[str, Any], lane: str | None) -> list[str]:
    """What an `error` event lacks of the envelope clients parse (docs/protocol.md, "Errors"):
    an integer `status` and `sequence_number`, a nested error with a string `type`, `code`
    and `message`, and the lane's `stream_id` (none on the default lane)."""
    problems = []
    for name in ("status", "sequence_number"):
        value = event.get(name)
        if not isinstance(value, int) or isinstance(value, bool):
            problems.append(f"no integer {name!r}")
    error = event.get("error")
    if not isinstance(error, dict):
        return [*problems, "no nested 'error' object"]
    for name in ("type", "code", "message"):
        if not isinstance(error.get(name), str):
            problems.append(f"no string error.{name}")
    if lane is not None and event.get("stream_id") != lane:
        problems.append(f"stream_id {event.get('stream_id')!r} instead of {lane!r}")
    if lane is None and "stream_id" in event:
        problems.append("a stream_id on the default lane")
    return problems


#: A steer id as OpenAI's: `steer_` and 32 hex digits.
STEER_ID = re.compile(r"steer_[0-9a-f]{32}\Z")


def steer_accepted_problems(event: Mapping[str, Any], target: str, lane: str | None) -> list[str]:
    """What a `response.steer.accepted` lacks: an integer `sequence_number`, `steer.id` of
    :data:`STEER_ID`'s form, `steer.previous_response_id` the steered response, and the
    target's lane."""
    problems = []
    sequence = event.get("sequence_number")
    if not isinstance(sequence, int) or isinstance(sequence, bool):
        problems.append("no integer 'sequence_number'")
    steer = event.get("steer")
    if not isinstance(steer, dict):
        return [*problems, "no 'steer' object"]
    if not isinstance(steer.get("id"), str) or not STEER_ID.match(steer["id"]):
        problems.append(f"steer.id {steer.get('id')!r} is not steer_ and 32 hex digits")
    if steer.get("previous_response_id") != target:
        problems.append(
            f"steer.previous_response_id {steer.get('previous_response_id')!r}, not {target!r}"
        )
    if event.get("stream_id") != lane:
        problems.append(f"stream_id {event.get('stream_id')!r} instead of {lane!r}")
    return problems


def steer_event_problems(event: Mapping[str, Any]) -> list[str]:
    """What a steering answer (`response.steer.accepted`, `.pending`, `.failed`) lacks of its
    SDK model: an integer `sequence_number`, the fields of :data:`EVENT_FIELDS`, a `steer`
    naming the steered response; on a failure, `error.type` `invalid_request_error` (the SDKs'
    only value) and a string `error.code` and `error.message`."""
    problems = []
    sequence = event.get("sequence_number")
    if not isinstance(sequence, int) or isinstance(sequence, bool):
        problems.append("no integer 'sequence_number'")
    problems += [
        f"no {name!r}" for name in EVENT_FIELDS.get(str(event["type"]), ()) if name not in event
    ]
    steer = event.get("steer")
    if isinstance(steer, dict) and not isinstance(steer.get("previous_response_id"), str):
        problems.append("no string steer.previous_response_id")
    error = event.get("error")
    if event["type"] == "response.steer.failed" and isinstance(error, dict):
        if error.get("type") != "invalid_request_error":
            problems.append(f"error.type {error.get('type')!r}, not 'invalid_request_error'")
        problems += [
            f"no string error.{name}"
            for name in ("code", "message")
            if not isinstance(error.get(name), str)
        ]
    return problems
