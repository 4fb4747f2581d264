"""Protocol validity of what the client receives (`ws_mode.testing._validation`): frames that
are not JSON events, streams out of order, events after the terminal one, lost lanes, wrong
ids and output items the openai SDK rejects each fail the check, naming the turn."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.library.testing.apps import (
    SDK_MESSAGE,
    TWO_TURNS,
    FrameEdit,
    expect_failure,
    handler,
    lifecycle,
)
from ws_mode import WebSocketModeMiddleware
from ws_mode.testing import CompatibilityError, Step, check_conversation
from ws_mode.testing._report import TurnFailed
from ws_mode.testing._validation import check_events, check_type, frame_failure

ON_A_LANE = [Step("fresh", lane="main")]


def extra_after_terminal(event: dict[str, Any]) -> list[Any]:
    if event["type"] == "response.completed":
        return [event, {"type": "response.output_text.delta", "delta": "late"}]
    return [event]


def without_stream_id(event: dict[str, Any]) -> list[Any]:
    if event["type"] == "response.completed":
        event.pop("stream_id", None)
    return [event]


def wrong_previous_id(event: dict[str, Any]) -> list[Any]:
    if event["type"] == "response.completed":
        event["response"]["previous_response_id"] = None
    return [event]


def sse_framing(event: dict[str, Any]) -> list[Any]:
    return [f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"]


def stream_id_on_default_lane(event: dict[str, Any]) -> list[Any]:
    return [{**event, "stream_id": "main"}]


@pytest.mark.parametrize(
    ("edit", "program", "turn", "expected"),
    [
        pytest.param(
            extra_after_terminal,
            TWO_TURNS,
            0,
            ["after the turn's terminal event", '"delta":"late"'],
            id="event-after-the-terminal-one",
        ),
        pytest.param(
            extra_after_terminal,
            [Step("fresh")],
            0,
            ["after the turn's terminal event"],
            id="event-after-the-last-terminal-one",
        ),
        pytest.param(
            without_stream_id,
            ON_A_LANE,
            0,
            ["does not carry its lane's stream_id", "expected 'main', got None"],
            id="loses-the-stream-id",
        ),
        pytest.param(
            stream_id_on_default_lane,
            [Step("fresh")],
            0,
            ["carries a stream_id on the default lane"],
            id="stream-id-on-the-default-lane",
        ),
        pytest.param(
            wrong_previous_id,
            TWO_TURNS,
            1,
            ["does not echo the client's previous_response_id", "the response says None"],
            id="wrong-previous-response-id",
        ),
        pytest.param(
            sse_framing,
            [Step("fresh")],
            0,
            ["SSE framing leaked onto the socket"],
            id="sse-framing",
        ),
    ],
)
def test_a_middleware_that_breaks_the_stream_fails(
    edit: Callable[[dict[str, Any]], list[Any]],
    program: list[Step],
    turn: int,
    expected: list[str],
) -> None:
    expect_failure(
        lambda app: FrameEdit(WebSocketModeMiddleware(app), edit), program, turn, expected
    )


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        pytest.param(
            lambda body, n: lifecycle([SDK_MESSAGE], numbers=(3, 2)),
            "sequence numbers do not increase",
            id="sequence-numbers-go-back",
        ),
        pytest.param(
            lambda body, n: lifecycle([SDK_MESSAGE], response_id="resp_same"),
            "the response id is not new",
            id="reuses-a-response-id",
        ),
        pytest.param(
            lambda body, n: lifecycle([{**SDK_MESSAGE, "id": None, "status": "done"}]),
            "does not validate with the openai SDK's ResponseOutputMessage",
            id="output-item-the-sdk-rejects",
        ),
        pytest.param(
            lambda body, n: lifecycle([SDK_MESSAGE])[1:],
            "does not start with response.created",
            id="no-response-created",
        ),
        pytest.param(
            lambda body, n: [
                {"type": "error", "code": "server_error", "message": "the model is down"}
            ],
            "the turn ended with error",
            id="answers-with-an-error",
        ),
    ],
)
def test_a_broken_handler_fails(
    answer: Callable[[dict[str, Any], int], list[dict[str, Any]]], expected: str
) -> None:
    program = [Step("fresh"), Step("continue")]
    with pytest.raises(CompatibilityError, match=expected):
        check_conversation(handler(answer), program)


def test_validation_and_errors_can_be_relaxed() -> None:
    invalid = handler(lambda body, n: lifecycle([{"type": "message", "role": "assistant"}]))
    program = [Step("fresh"), Step("continue")]
    check_conversation(invalid, program, validate_output=False)
    failing = handler(lambda body, n: [{"type": "error", "code": "x", "message": "down"}])
    report = check_conversation(failing, program, allow_errors=True)
    assert [turn.terminal for turn in report.turns] == ["error", "error"]
    # Nothing succeeded, so the second step had nothing to continue.
    assert "previous_response_id" not in report.turns[1].request


# Without a server.


@pytest.mark.parametrize(
    ("kind", "frame", "expected"),
    [
        ("binary_frame", b"{}", "binary frame"),
        ("not_json", "data: {}", "SSE framing leaked"),
        ("not_json", "{", "not JSON"),
        ("not_object", "[1]", "not a JSON object"),
    ],
)
def test_a_frame_that_holds_no_event_is_named(kind: str, frame: str | bytes, expected: str) -> None:
    assert expected in frame_failure(kind, frame).problem


def test_an_event_needs_a_string_type() -> None:
    with pytest.raises(TurnFailed, match="no string 'type'"):
        check_type({"type": 1})
    assert check_type({"type": "x"}) == {"type": "x"}


def check(events: list[dict[str, Any]], **options: Any) -> tuple[Any, list[Any]]:
    settings: dict[str, Any] = {"earlier": {}, "allow_errors": False, "validate_output": True}
    return check_events(Step(), {"type": "response.create"}, events, **(settings | options))


def test_check_events_returns_the_response_and_its_output() -> None:
    events = lifecycle([SDK_MESSAGE], response_id="resp_1")
    response, output = check(events)
    assert response["id"] == "resp_1"
    assert output == [SDK_MESSAGE]
    assert output[0] is not SDK_MESSAGE  # a copy
    with pytest.raises(TurnFailed, match="the response id is not new") as caught:
        check(events, earlier={"resp_1": 3})
    assert caught.value.details == "'resp_1' was already returned by turn 3"


def test_check_events_takes_the_output_from_the_finished_items() -> None:
    created, completed = lifecycle([], response_id="resp_1", numbers=(0, 2))
    done = {"type": "response.output_item.done", "output_index": 0, "item": SDK_MESSAGE}
    done["sequence_number"] = 1
    assert check([created, done, completed])[1] == [SDK_MESSAGE]


def test_check_events_checks_the_status_and_the_error_envelope() -> None:
    created, completed = lifecycle([SDK_MESSAGE])
    completed["response"]["status"] = "incomplete"
    with pytest.raises(TurnFailed, match=r"response\.completed carries a response whose status"):
        check([created, completed])
    flat = {"type": "error", "code": "x", "message": "down"}
    with pytest.raises(TurnFailed, match="HTTP-like 'status'"):
        check([flat], allow_errors=True)
    nested = {"type": "error", "status": 500, "error": {"type": "server_error", "message": "x"}}
    assert check([nested], allow_errors=True) == (None, [])
