"""What a response's events say about it, read the same way on the socket and stateful HTTP
(`ws_mode._tap.ResponseTap`): an event is named by its data's own `type`; the events that carry
the response object get `previous_response_id` echoed; finished output items are remembered,
in order, and fill a terminal event that omitted its output; the terminal event says how the
response ended."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest

from ws_mode._tap import ResponseTap


def message(item_id: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "role": "assistant", "content": []}


def item_done(item: dict[str, Any], index: int | None) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "response.output_item.done", "item": item}
    if index is not None:
        event["output_index"] = index
    return event


# --- decode --------------------------------------------------------------------------------


def test_the_datas_own_type_names_the_event_and_the_event_line_only_stands_in() -> None:
    named = ResponseTap.decode("message", b'{"type":"response.created","response":{}}')
    assert named == {"type": "response.created", "response": {}}
    untyped = ResponseTap.decode("response.completed", b'{"response":{"id":"r"}}')
    assert untyped == {"type": "response.completed", "response": {"id": "r"}}
    assert ResponseTap.decode(None, b'{"delta":"x"}') == {"delta": "x"}


@pytest.mark.parametrize("data", [b"not json", b"[1,2]", b'"text"', b"3", b"", b"null"])
def test_data_that_is_no_json_object_decodes_to_none(data: bytes) -> None:
    assert ResponseTap.decode("response.created", data) is None


# --- see: the echo ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind",
    [
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.completed",
        "response.incomplete",
        "response.failed",
    ],
)
def test_every_event_carrying_the_response_gets_previous_response_id_echoed(kind: str) -> None:
    tap = ResponseTap("resp_parent")
    event: dict[str, Any] = {
        "type": kind,
        "response": {"id": "resp_1", "previous_response_id": None},
    }
    assert tap.see(event)  # it changed the response object
    assert event["response"]["previous_response_id"] == "resp_parent"
    assert tap.response_id == "resp_1"


def test_the_echo_says_whether_it_changed_the_response() -> None:
    tap = ResponseTap("resp_parent")
    assert not tap.see(
        {"type": "response.in_progress", "response": {"previous_response_id": "resp_parent"}}
    )
    # A handler that says another parent is corrected: the client continued this one.
    wrong: dict[str, Any] = {
        "type": "response.in_progress",
        "response": {"previous_response_id": "resp_x"},
    }
    assert tap.see(wrong)
    assert wrong["response"]["previous_response_id"] == "resp_parent"


def test_a_fresh_response_gets_previous_response_id_null_even_when_it_omitted_it() -> None:
    tap = ResponseTap(None)
    omitted: dict[str, Any] = {"type": "response.created", "response": {"id": "r"}}
    assert tap.see(omitted)  # the field was added
    assert omitted["response"]["previous_response_id"] is None
    assert not tap.see({"type": "response.in_progress", "response": {"previous_response_id": None}})


def test_events_without_a_response_object_are_left_alone() -> None:
    tap = ResponseTap("resp_parent")
    delta = {"type": "response.output_text.delta", "delta": "x"}
    assert not tap.see(delta)
    assert not tap.see({"type": "response.created", "response": "not an object"})
    assert delta == {"type": "response.output_text.delta", "delta": "x"}
    assert tap.response_id is None
    assert tap.started is None
    assert not tap.finished


def test_started_is_the_response_as_its_first_event_had_it() -> None:
    tap = ResponseTap(None)
    first = {"id": "resp_1", "status": "in_progress"}
    tap.see({"type": "response.created", "response": first})
    tap.see({"type": "response.in_progress", "response": {"id": "resp_1", "status": "later"}})
    assert tap.started is first


# --- see: finished items -------------------------------------------------------------------


def test_finished_items_are_kept_in_output_order_whatever_order_they_finish_in() -> None:
    tap = ResponseTap(None)
    first, second, third = message("m0"), message("m1"), message("m2")
    for item, index in ((third, 2), (first, 0), (second, 1)):
        assert not tap.see(item_done(item, index))
    assert tap.items_so_far() == [first, second, third]
    assert not tap.client_calls  # messages ask nothing of the client


def test_an_item_without_an_index_is_kept_after_those_before_it() -> None:
    tap = ResponseTap(None)
    tap.see(item_done(message("m0"), None))
    tap.see(item_done(message("m1"), None))
    assert [item["id"] for item in tap.items_so_far()] == ["m0", "m1"]
    tap.see({"type": "response.output_item.done", "item": "not an item"})
    assert len(tap.items_so_far()) == 2


def test_a_finished_call_the_client_must_answer_is_noticed() -> None:
    tap = ResponseTap(None)
    call = {"type": "function_call", "id": "fc", "call_id": "c", "name": "f", "arguments": "{}"}
    tap.see(item_done(call, 0))
    assert tap.client_calls


# --- see: how the response ended -------------------------------------------------------------


def test_a_completed_response_is_kept_with_its_own_output() -> None:
    tap = ResponseTap("resp_parent")
    own = [message("final"), "not an item"]
    completed = {"type": "response.completed", "response": {"id": "resp_1", "output": own}}
    tap.see(completed)
    assert tap.finished
    assert tap.succeeded
    assert tap.failure is None
    assert tap.response is completed["response"]
    assert tap.response["previous_response_id"] == "resp_parent"
    assert tap.output == [message("final")]  # its own, without what is no item


def test_the_streamed_items_win_over_a_terminal_output_that_disagrees() -> None:
    # A custom tool call streamed, the same call as a function call in the terminal's list:
    # the client built its history from the streamed one, and so does the cache.
    custom = {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_1", "name": "patch",
              "input": "*** Begin Patch"}  # fmt: skip
    function = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "patch",
                "arguments": "{}"}  # fmt: skip
    tap = ResponseTap(None)
    tap.see(item_done(custom, 0))
    tap.see({"type": "response.completed", "response": {"id": "resp_1", "output": [function]}})
    assert tap.output == [custom]


def test_a_terminal_output_that_agrees_with_the_streamed_items_is_kept_as_it_is() -> None:
    tap = ResponseTap(None)
    tap.see(item_done(message("m0"), 0))
    own = [message("m0")]
    tap.see({"type": "response.completed", "response": {"id": "resp_1", "output": own}})
    assert tap.output is own  # shared, not copied


@pytest.mark.parametrize("output", ["omitted", [], None])
def test_a_terminal_event_without_output_gets_the_finished_items(output: Any) -> None:
    tap = ResponseTap(None)
    first, second = message("m0"), message("m1")
    tap.see(item_done(second, 1))
    tap.see(item_done(first, 0))
    response: dict[str, Any] = {"id": "resp_1"}
    if output != "omitted":
        response["output"] = output
    tap.see({"type": "response.incomplete", "response": response})
    assert tap.succeeded
    assert tap.output == [first, second]


def test_an_empty_output_with_nothing_finished_stays_empty() -> None:
    tap = ResponseTap(None)
    tap.see({"type": "response.completed", "response": {"id": "resp_1", "output": []}})
    assert tap.succeeded
    assert tap.output == []


def test_a_terminal_event_without_a_response_id_ends_the_response_unkept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tap = ResponseTap(None)
    with caplog.at_level(logging.WARNING, logger="ws_mode._tap"):
        tap.see({"type": "response.completed", "response": {"output": []}})
    assert tap.finished
    assert not tap.succeeded
    assert tap.response is None
    assert tap.output is None
    assert "no response id" in caplog.text


@pytest.mark.parametrize(
    ("event", "code"),
    [
        (
            {"type": "error", "error": {"code": "rate_limit_exceeded", "message": "m"}},
            "rate_limit_exceeded",
        ),
        ({"type": "error", "error": {"message": "no code"}}, "response_failed"),
        ({"type": "error", "code": "flat", "message": "not nested"}, "response_failed"),
        (
            {"type": "response.failed", "response": {"id": "r", "error": {"code": "server_error"}}},
            "server_error",
        ),
        ({"type": "response.failed", "response": {"id": "r", "error": None}}, "response_failed"),
    ],
)
def test_a_failed_response_says_its_code(event: dict[str, Any], code: str) -> None:
    tap = ResponseTap(None)
    tap.see(event)
    assert tap.finished
    assert not tap.succeeded
    assert tap.failure == code
    assert tap.response is None


def test_a_whole_stream_read_off_the_wire() -> None:
    """The events of one response as SSE carries them, decoded and seen in order."""
    tap = ResponseTap("resp_0")
    item = message("m0")
    wire: list[tuple[str | None, dict[str, Any]]] = [
        ("response.created", {"type": "response.created", "response": {"id": "resp_1"}}),
        (None, {"type": "response.output_text.delta", "delta": "hi"}),
        (None, item_done(item, 0)),
        ("response.completed", {"response": {"id": "resp_1", "output": []}}),  # untyped data
    ]
    echoed = []
    for event_type, data in wire:
        event = ResponseTap.decode(event_type, orjson.dumps(data))
        assert event is not None
        echoed.append(tap.see(event))
    assert echoed == [True, False, False, True]
    assert tap.response_id == "resp_1"
    assert tap.succeeded
    assert tap.output == [item]
    assert tap.response is not None
    assert tap.response["previous_response_id"] == "resp_0"
