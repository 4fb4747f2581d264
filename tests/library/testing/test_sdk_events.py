"""The kit knows every server event the installed openai SDK defines for the socket.

`ResponsesServerEvent` is the SDK's union of what a WebSocket-mode server may send (62 types in
openai-python 3.57). The kit's table of event fields (`EVENT_FIELDS`) must name each type with
exactly the fields the SDK's model requires: a newer SDK's new event, or a field it starts to
require, fails here until the kit (and docs/protocol.md) know it.
"""

from __future__ import annotations

import typing
from typing import Any

import pytest

from ws_mode.testing._report import TurnFailed
from ws_mode.testing._validation import (
    EVENT_FIELDS,
    KNOWN_EVENTS,
    WS_MODE_EVENTS,
    require_sdk_fields,
)

server_event = pytest.importorskip("openai.types.responses.responses_server_event")


def _sdk_events() -> dict[str, set[str]]:
    """Each type of the SDK's server-event union, with the fields its model requires (beyond
    `type`, `sequence_number`, and the lane's optional `stream_id`)."""
    union = typing.get_args(server_event.ResponsesServerEvent)[0]
    events: dict[str, set[str]] = {}
    for model in typing.get_args(union):
        fields = model.model_fields
        (kind,) = typing.get_args(fields["type"].annotation)
        events[kind] = {
            name
            for name, field in fields.items()
            if field.is_required() and name not in ("type", "sequence_number")
        }
    return events


def test_the_kit_knows_every_event_of_the_sdks_union_with_its_required_fields() -> None:
    sdk = _sdk_events()
    assert len(sdk) >= 62
    unknown = sorted(set(sdk) - KNOWN_EVENTS)
    assert not unknown, f"events of the SDK's union the kit does not know: {unknown}"
    differ = {
        kind: (sorted(EVENT_FIELDS[kind]), sorted(required))
        for kind, required in sdk.items()
        if kind != "error" and set(EVENT_FIELDS[kind]) != required
    }
    assert not differ, f"required fields differ (kit, SDK): {differ}"
    assert sdk["error"] == {"error"}  # the nested envelope, checked on its own


def test_the_kit_knows_no_event_beyond_the_sdks_but_ws_modes_interrupt_events() -> None:
    assert set(EVENT_FIELDS) - set(_sdk_events()) == WS_MODE_EVENTS


def _sample(kind: str) -> dict[str, Any]:
    event: dict[str, Any] = {"type": kind, "sequence_number": 0}
    event.update(dict.fromkeys(EVENT_FIELDS[kind], "x"))
    if "response" in event:
        event["response"] = dict.fromkeys(
            ("id", "object", "created_at", "model", "output", "parallel_tool_calls"), "x"
        ) | {"tool_choice": "auto", "tools": []}
    return event


@pytest.mark.parametrize(
    ("kind", "missing"),
    [
        ("response.compaction.compacting", "item_id"),
        ("response.custom_tool_call_input.done", "input"),
        ("response.steer.pending", "required_input"),
        ("response.shell_call_command.added", "command_index"),
    ],
)
def test_strict_mode_requires_the_fields_of_every_sdk_event(kind: str, missing: str) -> None:
    event = _sample(kind)
    require_sdk_fields("event 0", event)  # complete: accepted
    del event[missing]
    with pytest.raises(TurnFailed, match=f"lacks fields the SDKs require.*{missing}"):
        require_sdk_fields("event 0", event)


def test_function_call_arguments_done_needs_no_name() -> None:
    # Neither SDK's model has `name`: an event without one is valid, strictly too.
    event = {
        "type": "response.function_call_arguments.done",
        "sequence_number": 3,
        "item_id": "fc_1",
        "output_index": 0,
        "arguments": "{}",
    }
    require_sdk_fields("event 3", event)
    model = server_event.ResponseFunctionCallArgumentsWsDone
    assert model.model_validate(event).arguments == "{}"


def _generated_turn() -> list[dict[str, Any]]:
    response = _sample("response.created")["response"] | {"object": "response", "id": "resp_1"}
    item = {"type": "message", "id": "msg_1", "role": "assistant", "content": []}
    completed = {**response, "status": "completed", "output": [item]}
    return [
        {"type": "response.created", "sequence_number": 0, "response": response},
        {"type": "response.completed", "sequence_number": 1, "response": completed},
    ]


@pytest.mark.parametrize("generate", [None, True])
def test_a_create_with_generate_null_or_true_is_checked_as_a_generated_turn(
    generate: bool | None,
) -> None:
    # The SDKs type `generate` as an optional boolean: null generates, as absent does.
    from ws_mode.testing._conformance import ConformanceOptions, Probe

    request = {"type": "response.create", "input": "Hi", "generate": generate}
    with Probe("http://127.0.0.1:1", ConformanceOptions()) as probe:
        turn = probe.checked(request, _generated_turn())
    assert turn.response is not None
    assert turn.response["status"] == "completed"
