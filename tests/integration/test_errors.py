"""Errors as the SDK sees them (`ResponseWsError`), and what they do to the cache."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import Response
from openai.types.responses.responses_server_event import ResponseWsError

from tests.integration.apps import TOOL
from tests.integration.clients import (
    Server,
    call_output,
    completed_response,
    create,
    sdk_until_terminal,
)

FAILING_MODELS = ["error-4xx", "error-500", "raise-before", "raise-during", "no-terminal", "failed"]


def expect_error(
    event: Any,
    status: int,
    code: str | None,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    stream_id: str | None = None,
) -> ResponseWsError:
    assert isinstance(event, ResponseWsError), event
    assert event.type == "error"
    assert event.status == status
    assert event.error.type == type
    assert event.error.code == code
    assert event.error.param == param
    assert isinstance(event.error.message, str)
    assert event.error.message
    assert event.stream_id == stream_id
    return event


def turn(conn: Any, tag: str, **fields: Any) -> list[Any]:
    fields.setdefault("model", "scripted")
    meta = {"tag": tag, **fields.pop("meta", {})}
    conn.response.create(metadata=meta, **fields)
    return sdk_until_terminal(conn)


def still_works(conn: Any, tag: str, **lane: Any) -> None:
    events = turn(conn, tag, input="Still there?", meta={"k": "0"}, **lane)
    assert events[-1].type == "response.completed", events[-1]


def test_previous_response_not_found_leaves_the_socket_usable(server: Server, tag: str) -> None:
    with server.connect() as conn:
        for lane in ({}, {"stream_id": "nf"}):
            events = turn(conn, tag, input="Hi", previous_response_id="resp_missing", **lane)
            assert len(events) == 1
            error = expect_error(
                events[0],
                400,
                "previous_response_not_found",
                param="previous_response_id",
                stream_id=lane.get("stream_id"),
            )
            assert "resp_missing" in error.error.message
            still_works(conn, tag, **lane)
    # The handler never saw the failed creates.
    assert [call.body["input"] for call in server.recorder.for_tag(tag)] == ["Still there?"] * 2


def test_state_never_crosses_connections(server: Server, tag: str) -> None:
    with server.connect() as first:
        response = completed_response(turn(first, tag, input="Hi", meta={"k": "0"}))
        with server.connect() as second:
            events = turn(second, tag, input="More", previous_response_id=response.id)
            expect_error(
                events[0], 400, "previous_response_not_found", param="previous_response_id"
            )
        # It still resolves on its own connection.
        events = turn(first, tag, input="More", previous_response_id=response.id, meta={"k": "0"})
        assert completed_response(events).previous_response_id == response.id
    with server.connect() as third:
        events = turn(third, tag, input="More", previous_response_id=response.id)
        expect_error(events[0], 400, "previous_response_not_found", param="previous_response_id")


@pytest.mark.parametrize("model", FAILING_MODELS)
@pytest.mark.parametrize("stream_id", [None, "lane"])
def test_failed_continuation_on_the_same_lane_evicts_its_parent(
    server: Server, tag: str, model: str, stream_id: str | None
) -> None:
    lane = {"stream_id": stream_id} if stream_id else {}
    with server.connect() as conn:
        parent = completed_response(turn(conn, tag, input="Start.", tools=[TOOL], **lane))
        cont = {"previous_response_id": parent.id, "input": [call_output(parent.output[0])]}
        events = turn(conn, tag, model=model, **cont, **lane)
        assert events[-1].type in ("error", "response.failed")
        assert all(event.stream_id == stream_id for event in events)
        events = turn(conn, tag, **cont, **lane)
        expect_error(
            events[-1],
            400,
            "previous_response_not_found",
            param="previous_response_id",
            stream_id=stream_id,
        )
        still_works(conn, tag, **lane)


@pytest.mark.parametrize("model", ["error-4xx", "raise-before", "failed"])
@pytest.mark.parametrize(("parent_lane", "fork_lane"), [("main", "side"), (None, "side")])
def test_failed_cross_lane_fork_keeps_its_parent(
    server: Server, tag: str, model: str, parent_lane: str | None, fork_lane: str
) -> None:
    home = {"stream_id": parent_lane} if parent_lane else {}
    with server.connect() as conn:
        parent = completed_response(turn(conn, tag, input="Start.", tools=[TOOL], **home))
        cont = {"previous_response_id": parent.id, "input": [call_output(parent.output[0])]}
        events = turn(conn, tag, model=model, stream_id=fork_lane, **cont)
        assert events[-1].type in ("error", "response.failed")
        assert all(event.stream_id == fork_lane for event in events)
        events = turn(conn, tag, meta={"k": "1"}, **cont, **home)
        assert completed_response(events).output_text == "Done: received 3 items."


@pytest.mark.parametrize("status", [400, 403, 422, 429])
def test_handler_4xx_passes_status_and_error_body_through(
    server: Server, tag: str, status: int
) -> None:
    with server.connect() as conn:
        for lane in ({}, {"stream_id": "e"}):
            events = turn(
                conn, tag, model="error-4xx", input="Hi", meta={"status": str(status)}, **lane
            )
            assert len(events) == 1
            error = expect_error(
                events[0], status, "handler_says_no", param="input", stream_id=lane.get("stream_id")
            )
            assert error.error.message == "The handler refused this request."
            still_works(conn, tag, **lane)


@pytest.mark.parametrize("prefix", ["", "/onmiss"])
def test_handler_500_non_json(server: Server, tag: str, prefix: str) -> None:
    with server.connect(prefix) as conn:
        events = turn(conn, tag, model="error-500", input="Hi", stream_id="x")
        assert len(events) == 1
        error = expect_error(events[0], 500, "server_error", type="server_error", stream_id="x")
        assert "upstream exploded" in error.error.message
        still_works(conn, tag)


# "" has the middleware inside FastAPI's ServerErrorMiddleware (the exception reaches ws_mode
# directly); "/onmiss" wraps the whole app (ServerErrorMiddleware answers 500, then re-raises).
@pytest.mark.parametrize("prefix", ["", "/onmiss"])
@pytest.mark.parametrize("stream_id", [None, "boom"])
def test_handler_exception_before_answering(
    server: Server, tag: str, prefix: str, stream_id: str | None
) -> None:
    lane = {"stream_id": stream_id} if stream_id else {}
    with server.connect(prefix) as conn:
        events = turn(conn, tag, model="raise-before", input="Hi", **lane)
        assert len(events) == 1
        expect_error(events[0], 500, "server_error", type="server_error", stream_id=stream_id)
        still_works(conn, tag, **lane)


@pytest.mark.parametrize("prefix", ["", "/onmiss"])
@pytest.mark.parametrize("stream_id", [None, "boom"])
def test_handler_exception_mid_stream(
    server: Server, tag: str, prefix: str, stream_id: str | None
) -> None:
    lane = {"stream_id": stream_id} if stream_id else {}
    with server.connect(prefix) as conn:
        events = turn(conn, tag, model="raise-during", input="Hi", **lane)
        assert [event.type for event in events] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "error",
        ]
        assert all(event.stream_id == stream_id for event in events)
        expect_error(events[-1], 500, "server_error", type="server_error", stream_id=stream_id)
        still_works(conn, tag, **lane)


def test_stream_without_terminal_event(server: Server, tag: str) -> None:
    with server.connect() as conn:
        events = turn(conn, tag, model="no-terminal", input="Hi", stream_id="cut")
        assert events[0].type == "response.created"
        assert events[-2].type == "response.output_item.done"
        expect_error(events[-1], 500, "server_error", type="server_error", stream_id="cut")
        still_works(conn, tag, stream_id="cut")


def test_response_failed_is_forwarded(server: Server, tag: str) -> None:
    with server.connect() as conn:
        events = turn(conn, tag, model="failed", input="Hi", stream_id="f")
        assert events[-1].type == "response.failed"
        assert events[-1].response.status == "failed"
        assert events[-1].response.error.message == "The model failed."
        assert events[-1].response.previous_response_id is None
        still_works(conn, tag, stream_id="f")


def test_response_incomplete_is_cached_like_a_success(server: Server, tag: str) -> None:
    with server.connect() as conn:
        events = turn(conn, tag, model="incomplete", input="Hi", stream_id="i")
        assert events[-1].type == "response.incomplete"
        assert events[-1].stream_id == "i"
        response = events[-1].response
        assert response.incomplete_details.reason == "max_output_tokens"
        events = turn(conn, tag, input="Go on.", previous_response_id=response.id, meta={"k": "0"})
        assert completed_response(events).output_text == "Done: received 3 items."


def test_sse_error_event_arrives_in_the_nested_envelope(server: Server, tag: str) -> None:
    with server.raw() as ws:
        ws.send(create(tag, "sse-error", input="Hi", stream_id="z"))
        events = ws.until_terminal()
        error = events[-1]
        assert error["type"] == "error"
        assert error["stream_id"] == "z"
        assert isinstance(error["status"], int)
        assert error["error"]["code"] == "rate_limit_exceeded"
        assert error["error"]["message"] == "Slow down."
        assert "code" not in error  # nested, not flat
        ws.send(create(tag, input="Again", meta={"k": "0"}, stream_id="z"))
        assert completed_response(ws.until_terminal())


def test_json_handler_gets_lifecycle_events_synthesized(server: Server, tag: str) -> None:
    with server.connect() as conn:
        first = turn(conn, tag, input="Hi")  # a tool call, streamed
        parent = completed_response(first)
        events = turn(
            conn,
            tag,
            model="json",
            previous_response_id=parent.id,
            input=[call_output(parent.output[0])],
            stream_id="j",
        )
        assert [event.type for event in events] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
        assert [event.sequence_number for event in events] == list(range(len(events)))
        assert all(event.stream_id == "j" for event in events)
        assert events[0].response.status == "in_progress"
        assert events[0].response.previous_response_id == parent.id
        final = Response.model_validate(events[-1].response.to_dict())
        assert final.previous_response_id == parent.id
        assert final.output_text == "Done: received 3 items."
        assert events[4].delta == final.output_text
        # The synthesized response was cached like a streamed one.
        events = turn(conn, tag, previous_response_id=final.id, input="More.", meta={"k": "0"})
        assert completed_response(events).output_text == "Done: received 5 items."


def test_response_processed_gets_no_answer_and_the_socket_goes_on(server: Server, tag: str) -> None:
    """Codex acknowledges responses with `response.processed`; an error in reply would fail
    its next turn."""
    with server.raw() as ws:
        ws.send({"type": "response.processed", "response_id": "resp_any"})
        ws.expect_silence(0.2)
        ws.send(create(tag, input="Hi"))
        assert ws.recv()["type"] == "response.created"


def test_raw_error_envelope_is_nested(server: Server, tag: str) -> None:
    with server.raw() as ws:
        ws.send(create(tag, input="Hi", previous_response_id="resp_nope", stream_id="main"))
        error = ws.recv()
        assert error == {
            "type": "error",
            "sequence_number": 0,
            "status": 400,
            "stream_id": "main",
            "error": {
                "type": "invalid_request_error",
                "code": "previous_response_not_found",
                "message": "Previous response with id 'resp_nope' not found.",
                "param": "previous_response_id",
            },
        }
        ws.expect_silence(0.1)


def test_tiny_cache_keeps_children_whole(server: Server, tag: str) -> None:
    """With two cache entries, old ids stop resolving but the live chain keeps its context."""
    with server.connect("/tiny") as conn:
        ids = []
        previous: dict[str, Any] = {}
        for number in range(4):
            events = turn(conn, tag, input=f"Turn {number}.", meta={"k": "0"}, **previous)
            ids.append(completed_response(events).id)
            previous = {"previous_response_id": ids[-1]}
        events = turn(conn, tag, input="Last.", meta={"k": "0"}, **previous)
        assert completed_response(events).output_text == "Done: received 9 items."
        events = turn(conn, tag, input="Old.", previous_response_id=ids[0])
        expect_error(events[0], 400, "previous_response_not_found", param="previous_response_id")


@pytest.mark.parametrize("model", ["raise-during", "no-terminal", "failed", "sse-error"])
def test_a_half_streamed_response_is_never_cached(server: Server, tag: str, model: str) -> None:
    with server.raw() as ws:
        ws.send(create(tag, model, input="Hi"))
        events = ws.until_terminal()
        assert events[0]["type"] == "response.created"
        assert events[-1]["type"] in ("error", "response.failed")
        started = events[0]["response"]["id"]
        ws.send(create(tag, input="More.", previous_response_id=started))
        error = ws.recv()
        assert error["type"] == "error"
        assert error["error"]["code"] == "previous_response_not_found"


def test_handler_200_with_an_error_body_is_not_a_completed_response(
    server: Server, tag: str
) -> None:
    with server.connect() as conn:
        events = turn(conn, tag, model="error-200", input="Hi")
        assert [event.type for event in events] == ["error"]
        assert events[0].error.message == "Upstream failed."
