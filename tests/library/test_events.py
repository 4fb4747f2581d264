"""Tests of ResponseStream: forwarding, stream_id splicing, echoes and how a response ends."""

from __future__ import annotations

import asyncio
import json
import typing
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses.responses_server_event import ResponsesServerEvent, ResponseWsError
from pydantic import BaseModel

from ws_mode._events import ResponseStream, lifecycle_events
from ws_mode._protocol import server_error
from ws_mode._tap import ResponseTap

# The SDK's socket event union, each model picked by its type (the union has no discriminator).
SERVER_EVENTS: dict[str, type[BaseModel]] = {
    typing.get_args(model.model_fields["type"].annotation)[0]: model
    for model in typing.get_args(typing.get_args(ResponsesServerEvent)[0])
}


class Recorder:
    """A ResponseStream with everything it does recorded: the recorder is its socket and its
    owner."""

    def __init__(self, stream_id: str | None = "lane", previous: str | None = "resp_0") -> None:
        self.frames: list[str] = []
        self.finished: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
        self.failed = 0
        self.failed_responses: list[dict[str, Any] | None] = []
        self.stream = ResponseStream(
            self,  # as the socket: it only sends text
            self,
            stream_id=stream_id,
            previous_response_id=previous,
        )

    async def send_text(self, text: str) -> None:
        self.frames.append(text)

    def response_finished(
        self, response: dict[str, Any], output: list[dict[str, Any]], size: int
    ) -> None:
        # The cache must advance before the client hears the response finished.
        assert not any('"response.completed"' in frame for frame in self.frames)
        self.finished.append((response, output))

    def response_failed(self, response: dict[str, Any] | None) -> None:
        self.failed += 1
        self.failed_responses.append(response)

    @property
    def decoded(self) -> list[dict[str, Any]]:
        return [orjson.loads(frame) for frame in self.frames]

    async def sse(self, event_type: str | None, payload: Any) -> None:
        data = payload if isinstance(payload, bytes) else orjson.dumps(payload)
        await self.sse_event(event_type, data)

    async def sse_event(self, event_type: str | None, data: bytes) -> None:
        """Hand the stream one event of a handler's SSE stream, as `HandlerCall` does."""
        if self.stream.finished:
            return
        framed = self.stream.frame(event_type, data)
        if isinstance(framed, str):
            await self.stream.send_text(framed)
        else:
            await self.stream.event(framed, from_handler=True)


def response(id: str = "resp_1", status: str = "completed", **fields: Any) -> dict[str, Any]:
    return {
        "id": id,
        "object": "response",
        "created_at": 1,
        "status": status,
        "model": "m",
        "output": [],
        "previous_response_id": None,
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        **fields,
    }


MESSAGE = {
    "type": "message",
    "id": "msg_1",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_text", "text": "hi", "annotations": []}],
}
CALL = {
    "type": "function_call",
    "id": "fc_1",
    "call_id": "call_1",
    "name": "f",
    "arguments": "{}",
    "status": "completed",
}
REASONING = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"}


def delta(sequence_number: int = 3, text: str = "hi") -> dict[str, Any]:
    return {
        "type": "response.output_text.delta",
        "sequence_number": sequence_number,
        "item_id": "msg_1",
        "output_index": 0,
        "content_index": 0,
        "delta": text,
        "logprobs": [],
    }


# --- splicing ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_default_lane_events_are_forwarded_unchanged() -> None:
    recorder = Recorder(stream_id=None)
    data = orjson.dumps(delta())
    await recorder.sse_event("response.output_text.delta", data)
    assert recorder.frames == [data.decode()]


@pytest.mark.anyio
async def test_stream_id_is_spliced_into_encoded_events() -> None:
    recorder = Recorder(stream_id="lane-1")
    await recorder.sse("response.output_text.delta", delta())
    (event,) = recorder.decoded
    assert event == {**delta(), "stream_id": "lane-1"}
    SERVER_EVENTS[event["type"]].model_validate(event)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"{}", {}),
        (b"{ }", {}),
        (b'  {"a": 1}\t ', {"a": 1}),
        (b'{\n  "a" : [1, {"b": "}"}]\n}', {"a": [1, {"b": "}"}]}),
        (b'{"text":"caf\xc3\xa9 \\u2603"}', {"text": "caf\u00e9 \u2603"}),
    ],
)
async def test_splicing_keeps_the_rest(data: bytes, expected: dict[str, Any]) -> None:
    recorder = Recorder(stream_id="s")
    await recorder.sse_event("response.custom", data)
    assert recorder.decoded == [{"stream_id": "s", **expected}]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=10,
)
event_types = st.sampled_from(
    [
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.reasoning_summary_text.delta",
        "response.content_part.added",
        "response.custom_event",
    ]
)


@settings(max_examples=150)
@given(
    payload=st.dictionaries(
        st.text(max_size=8).filter(lambda key: key != "stream_id"), json_values, max_size=5
    ),
    event_type=event_types,
    stream_id=st.none() | st.from_regex(r"[A-Za-z0-9_.\-]{1,20}", fullmatch=True),
    indent=st.booleans(),
)
def test_splicing_changes_nothing_else(
    payload: dict[str, Any], event_type: str, stream_id: str | None, indent: bool
) -> None:
    data = json.dumps(payload, indent=2 if indent else None, ensure_ascii=False).encode()
    recorder = Recorder(stream_id=stream_id)
    asyncio.run(recorder.sse_event(event_type, data))
    (event,) = recorder.decoded
    expected = payload if stream_id is None else {**payload, "stream_id": stream_id}
    assert event == expected
    if stream_id is None:
        assert recorder.frames == [data.decode().strip()]
    assert not recorder.stream.finished
    assert recorder.failed == 0


# --- previous_response_id and the response object --------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    "event_type", ["response.created", "response.in_progress", "response.queued"]
)
@pytest.mark.parametrize("announced", [True, False])
async def test_previous_response_id_is_echoed(event_type: str, announced: bool) -> None:
    recorder = Recorder(previous="resp_parent")
    started = response(status="in_progress")
    sent = {"type": event_type, "sequence_number": 0, "response": started}
    await recorder.sse(event_type if announced else None, sent)
    (event,) = recorder.decoded
    assert event["response"]["previous_response_id"] == "resp_parent"
    assert event["stream_id"] == "lane"
    assert event == {
        **sent,
        "response": {**started, "previous_response_id": "resp_parent"},
        "stream_id": "lane",
    }
    SERVER_EVENTS[event_type].model_validate(event)
    assert recorder.stream.response_id == "resp_1"
    assert not recorder.stream.finished


@pytest.mark.anyio
async def test_fresh_chain_clears_a_handler_previous_response_id() -> None:
    recorder = Recorder(stream_id=None, previous=None)
    sent = {"type": "response.created", "response": response(previous_response_id="resp_internal")}
    await recorder.sse("response.created", sent)
    assert recorder.decoded[0]["response"]["previous_response_id"] is None
    assert "stream_id" not in recorder.decoded[0]


@pytest.mark.anyio
@pytest.mark.parametrize("stream_id", [None, "lane"])
async def test_an_event_the_echo_leaves_as_it_is_goes_out_as_encoded(stream_id: str | None) -> None:
    """A response object that already says the client's `previous_response_id` is not
    re-encoded (the handler's own spacing survives), yet the tap reads it and a terminal one
    still tells the owner first; one the echo changes is re-encoded with the echo."""
    recorder = Recorder(stream_id=stream_id, previous="resp_parent")
    spliced = b'{"stream_id":"lane",' if stream_id else b"{"
    echoed = response(status="in_progress", previous_response_id="resp_parent")
    created = json.dumps({"type": "response.created", "response": echoed}).encode()
    await recorder.sse_event("response.created", created)
    assert recorder.frames == [(spliced + created[1:]).decode()]
    assert recorder.stream.response_id == "resp_1"
    done = response(previous_response_id="resp_parent", output=[CALL])
    completed = json.dumps({"type": "response.completed", "response": done}).encode()
    await recorder.sse_event("response.completed", completed)
    assert recorder.frames[-1] == (spliced + completed[1:]).decode()
    assert recorder.finished == [(done, [CALL])]
    assert recorder.stream.finished

    other = Recorder(stream_id=stream_id, previous="resp_parent")
    stale = json.dumps({"type": "response.created", "response": response()}).encode()
    await other.sse_event("response.created", stale)
    assert other.frames[0] != (spliced + stale[1:]).decode()
    assert other.decoded[0]["response"]["previous_response_id"] == "resp_parent"


# --- terminal events ------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("event_type", ["response.completed", "response.incomplete"])
async def test_terminal_success_tells_the_owner_with_the_output(event_type: str) -> None:
    recorder = Recorder()
    done = response(status=event_type.split(".")[1], output=[REASONING, CALL, MESSAGE])
    await recorder.sse(
        "response.created", {"type": "response.created", "response": response(status="in_progress")}
    )
    await recorder.sse("response.output_text.delta", delta())
    await recorder.sse(event_type, {"type": event_type, "sequence_number": 9, "response": done})
    ((finished_response, output),) = recorder.finished
    assert finished_response["id"] == "resp_1"
    assert finished_response["previous_response_id"] == "resp_0"
    assert output == [REASONING, CALL, MESSAGE]
    assert recorder.stream.finished
    assert recorder.stream.succeeded
    assert recorder.failed == 0
    last = recorder.decoded[-1]
    assert last["type"] == event_type
    assert last["stream_id"] == "lane"
    SERVER_EVENTS[event_type].model_validate(last)


@pytest.mark.anyio
async def test_terminal_with_empty_output_uses_the_finished_items() -> None:
    recorder = Recorder()
    for index, item in [(1, CALL), (0, REASONING), (2, MESSAGE)]:
        done = {
            "type": "response.output_item.done",
            "sequence_number": index,
            "output_index": index,
            "item": item,
        }
        await recorder.sse("response.output_item.done", done)
    await recorder.sse(
        "response.completed", {"type": "response.completed", "response": response(output=[])}
    )
    ((_, output),) = recorder.finished
    assert output == [REASONING, CALL, MESSAGE]
    # The finished items were forwarded with the stream_id, otherwise unchanged.
    assert [event["item"] for event in recorder.decoded[:3]] == [CALL, REASONING, MESSAGE]
    assert all(event["stream_id"] == "lane" for event in recorder.decoded)


@pytest.mark.anyio
async def test_terminal_without_output_uses_the_finished_items() -> None:
    recorder = Recorder(stream_id=None)
    await recorder.sse(
        None, {"type": "response.output_item.done", "output_index": 0, "item": MESSAGE}
    )
    finished = response()
    del finished["output"]
    await recorder.sse(None, {"type": "response.completed", "response": finished})
    assert recorder.finished[0][1] == [MESSAGE]


@pytest.mark.anyio
async def test_terminal_output_wins_over_the_finished_items() -> None:
    recorder = Recorder()
    await recorder.sse(
        "response.output_item.done",
        {"type": "response.output_item.done", "output_index": 0, "item": CALL},
    )
    await recorder.sse(
        "response.completed",
        {"type": "response.completed", "response": response(output=[MESSAGE, "junk"])},
    )
    assert recorder.finished[0][1] == [MESSAGE]


@pytest.mark.anyio
async def test_terminal_without_a_response_id_is_not_cached() -> None:
    recorder = Recorder()
    await recorder.sse(
        "response.completed", {"type": "response.completed", "response": {"status": "completed"}}
    )
    assert recorder.finished == []
    assert recorder.stream.finished
    assert not recorder.stream.succeeded
    assert len(recorder.frames) == 1


@pytest.mark.anyio
async def test_response_failed_tells_the_owner() -> None:
    recorder = Recorder()
    failed = response(status="failed", error={"code": "server_error", "message": "boom"})
    await recorder.sse(
        "response.failed", {"type": "response.failed", "sequence_number": 2, "response": failed}
    )
    assert recorder.failed == 1
    assert recorder.finished == []
    assert recorder.stream.finished
    assert not recorder.stream.succeeded
    (event,) = recorder.decoded
    assert event["response"]["previous_response_id"] == "resp_0"
    SERVER_EVENTS["response.failed"].model_validate(event)
    # The owner gets the failed response object (`on_response` sees it, usage and all).
    assert recorder.failed_responses == [event["response"]]


@pytest.mark.anyio
async def test_flat_sse_error_becomes_the_nested_envelope() -> None:
    recorder = Recorder()
    flat = {
        "type": "error",
        "sequence_number": 4,
        "code": "rate_limit_exceeded",
        "message": "Slow down.",
        "param": None,
    }
    await recorder.sse("error", flat)
    (event,) = recorder.decoded
    assert event == {
        "type": "error",
        "status": 500,
        "error": {
            "type": "server_error",
            "code": "rate_limit_exceeded",
            "message": "Slow down.",
            "param": None,
        },
        "sequence_number": 4,
        "stream_id": "lane",
    }
    ResponseWsError.model_validate(event)
    assert recorder.failed == 1
    assert recorder.failed_responses == [None]  # an error carries no response object
    assert recorder.stream.finished


@pytest.mark.anyio
async def test_flat_error_with_a_status_and_missing_message() -> None:
    recorder = Recorder(stream_id=None)
    await recorder.sse(None, {"type": "error", "status": 429, "code": "slow", "message": ["odd"]})
    (event,) = recorder.decoded
    assert event["status"] == 429
    assert event["error"]["message"] == "The handler reported an error."
    assert event["error"]["code"] == "slow"
    assert "stream_id" not in event
    ResponseWsError.model_validate(event)


@pytest.mark.anyio
async def test_flat_error_with_non_string_code_and_param_fits_the_envelope() -> None:
    recorder = Recorder(stream_id=None)
    await recorder.sse("error", {"type": "error", "code": 429, "message": "m", "param": ["input"]})
    (event,) = recorder.decoded
    assert event["error"]["code"] == "server_error"  # always a string
    assert event["error"]["param"] is None
    ResponseWsError.model_validate(event)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("error", "status"),
    [
        ({"type": "invalid_request_error", "code": "x", "message": "m", "param": "p"}, 400),
        ({"type": "server_error", "code": None, "message": "m", "param": None}, 500),
        ({"code": "x"}, 500),
    ],
)
async def test_nested_sse_error_is_kept(error: dict[str, Any], status: int) -> None:
    recorder = Recorder()
    await recorder.sse("error", {"type": "error", "error": dict(error)})
    (event,) = recorder.decoded
    assert event["status"] == status
    assert event["error"]["type"] == error.get("type", "server_error")
    assert event["error"]["code"] == error["code"] or event["error"]["type"]
    assert event["stream_id"] == "lane"
    ResponseWsError.model_validate(event)
    assert recorder.failed == 1


@pytest.mark.anyio
async def test_events_after_the_terminal_one_are_dropped() -> None:
    recorder = Recorder()
    await recorder.sse("response.completed", {"type": "response.completed", "response": response()})
    await recorder.sse(
        "response.failed", {"type": "response.failed", "response": response(status="failed")}
    )
    await recorder.sse("error", {"type": "error", "message": "late"})
    await recorder.stream.event(server_error("late"))
    await recorder.sse(None, {"type": "response.completed", "response": response(id="resp_2")})
    assert [event["type"] for event in recorder.decoded] == ["response.completed"]
    assert len(recorder.finished) == 1
    assert recorder.failed == 0


@pytest.mark.anyio
async def test_encoded_events_after_the_terminal_one_are_dropped() -> None:
    recorder = Recorder()
    await recorder.sse("response.completed", {"type": "response.completed", "response": response()})
    await recorder.sse("response.output_text.delta", delta(text="late"))
    await recorder.sse(
        "response.output_item.done",
        {"type": "response.output_item.done", "output_index": 0, "item": MESSAGE},
    )
    assert [event["type"] for event in recorder.decoded] == ["response.completed"]


# --- garbage ----------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("event_type", "data"),
    [
        ("response.created", b"not json"),
        ("response.completed", b"[1, 2]"),
        (None, b"[DONE]"),
        ("error", b'"boom"'),
        ("response.output_item.done", b"{"),
        ("response.output_text.delta", b"not json"),
        ("response.output_text.delta", b"[1]"),
        ("response.output_text.delta", b""),
    ],
)
async def test_garbage_data_is_a_server_error(event_type: str | None, data: bytes) -> None:
    recorder = Recorder()
    await recorder.sse_event(event_type, data)
    (event,) = recorder.decoded
    assert event["type"] == "error"
    assert event["status"] == 500
    assert event["error"]["type"] == "server_error"
    assert event["stream_id"] == "lane"
    ResponseWsError.model_validate(event)
    assert recorder.failed == 1
    assert recorder.stream.finished
    assert recorder.finished == []


@pytest.mark.anyio
async def test_event_objects_get_the_stream_id() -> None:
    recorder = Recorder(stream_id="x")
    await recorder.stream.event(delta())
    assert recorder.decoded == [{**delta(), "stream_id": "x"}]
    recorder = Recorder(stream_id=None)
    await recorder.stream.event(delta())
    assert recorder.decoded == [delta()]


@pytest.mark.parametrize(
    ("status", "terminal"),
    [
        ("completed", "response.completed"),
        (None, "response.completed"),
        ("incomplete", "response.incomplete"),
        ("failed", "response.failed"),
        ("cancelled", "response.failed"),
    ],
)
def test_lifecycle_terminal_event_by_status(status: str | None, terminal: str) -> None:
    events = list(lifecycle_events({"id": "r", "status": status, "output": []}))
    assert [event["type"] for event in events] == [
        "response.created",
        "response.in_progress",
        terminal,
    ]


@pytest.mark.parametrize("status", ["in_progress", "queued", "weird"])
def test_lifecycle_of_an_unfinished_response_is_an_error(status: str) -> None:
    (event,) = lifecycle_events({"id": "r", "status": status, "output": []})
    assert event["type"] == "error"
    assert event["status"] == 500
    assert status in event["error"]["message"]


def test_lifecycle_skips_items_that_are_not_objects() -> None:
    events = list(lifecycle_events({"id": "r", "output": ["junk", {"type": "x", "id": "1"}]}))
    assert [event["type"] for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[2]["output_index"] == 1


def test_lifecycle_of_a_warm_up_leaves_out_in_progress() -> None:
    response = {"id": "r", "status": "completed", "output": [], "usage": None}
    events = list(lifecycle_events(response, in_progress=False))
    assert [event["type"] for event in events] == ["response.created", "response.completed"]
    assert events[0]["response"]["status"] == "in_progress"
    assert [event["sequence_number"] for event in events] == [0, 1]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "data",
    [b"{not json}", b"{", b"[1, 2]", b'"text"', b"", b'{"a": 1} trailing', b"\xff\xfe"],
)
async def test_an_event_that_is_not_a_json_object_never_reaches_the_client(data: bytes) -> None:
    """Whatever the event type, even one forwarded without re-encoding, the client gets
    JSON objects only: garbage from the handler becomes an error event for the turn."""
    recorder = Recorder()
    await recorder.sse("response.output_text.delta", {"type": "response.output_text.delta"})
    await recorder.sse_event("response.output_text.delta", data)
    first, error = recorder.decoded  # every frame parses as JSON
    assert first["type"] == "response.output_text.delta"
    assert error["type"] == "error"
    assert error["status"] == 500
    assert error["error"]["code"] == "server_error"
    assert error["stream_id"] == "lane"
    assert recorder.failed == 1


@pytest.mark.anyio
async def test_an_error_made_mid_stream_is_numbered_after_the_events_before_it() -> None:
    recorder = Recorder()
    for number in range(3):
        delta = {"type": "response.output_text.delta", "sequence_number": number}
        await recorder.sse("response.output_text.delta", delta)
    await recorder.stream.event(server_error("The handler failed."))
    assert recorder.decoded[-1]["sequence_number"] == 3


@pytest.mark.anyio
async def test_a_handler_error_keeps_its_own_sequence_number() -> None:
    recorder = Recorder()
    await recorder.sse(
        "error", {"type": "error", "sequence_number": 7, "code": "x", "message": "m"}
    )
    (event,) = recorder.decoded
    assert event["sequence_number"] == 7


def test_the_tap_reads_the_datas_type_echoes_and_fills_an_omitted_output() -> None:
    """The tap both paths share: the data's `type` wins over the `event:` line; the echo says
    whether it changed the response object; a terminal event without output gets the
    finished items."""
    tap = ResponseTap("resp_parent")
    created = tap.decode("message", b'{"type":"response.created","response":{"id":"r"}}')
    assert created is not None
    assert created["type"] == "response.created"
    assert tap.see(created)  # the echo added the parent
    assert not tap.see({"type": "response.in_progress", "response": {**created["response"]}})
    item = {"type": "message", "id": "m", "content": []}
    done = tap.decode(None, orjson.dumps({"type": "response.output_item.done", "item": item}))
    assert done is not None
    assert not tap.see(done)
    untyped = tap.decode("response.completed", b'{"response":{"id":"r","output":[]}}')
    assert untyped is not None
    tap.see(untyped)
    assert tap.finished
    assert tap.succeeded
    assert tap.response is untyped["response"]
    assert tap.response["previous_response_id"] == "resp_parent"
    assert tap.output == [item]
    assert tap.decode(None, b"[1]") is None


# --- events handed as objects (Turn.send_event) -------------------------------------------------


async def hand(recorder: Recorder, event: dict[str, Any] | bytes) -> None:
    """Hand the stream one event as an object, as `HandlerCall.hand_event` does."""
    framed = recorder.stream.frame_object(event)
    if isinstance(framed, str):
        await recorder.stream.send_text(framed)
    else:
        await recorder.stream.event(framed, from_handler=True)


def a_response_stream() -> list[dict[str, Any]]:
    item_done = {"type": "response.output_item.done", "output_index": 0, "item": MESSAGE}
    return [
        {
            "type": "response.created",
            "sequence_number": 0,
            "response": response(status="in_progress"),
        },
        delta(1),
        {**item_done, "sequence_number": 2},
        {
            "type": "response.completed",
            "sequence_number": 3,
            "response": response(output=[MESSAGE]),
        },
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("stream_id", [None, "lane-1"])
async def test_events_handed_as_objects_go_out_as_their_sse_would(stream_id: str | None) -> None:
    through_sse, as_objects = Recorder(stream_id=stream_id), Recorder(stream_id=stream_id)
    events = a_response_stream()
    handed = orjson.loads(orjson.dumps(events))
    for event in events:
        await through_sse.sse(event["type"], event)
    for number, event in enumerate(handed):
        # Encoded JSON is handed as it is; objects are encoded once.
        await hand(as_objects, orjson.dumps(event) if number == 1 else event)
    assert as_objects.frames == through_sse.frames
    assert as_objects.finished == through_sse.finished
    # The stream kept copies: the handler's objects are as it made them.
    assert handed == events


@pytest.mark.anyio
@pytest.mark.parametrize("event", [[1, 2], {"type": "x", "value": {1, 2}}, {1: "not a str key"}])
async def test_an_object_that_is_no_json_object_is_a_server_error(event: Any) -> None:
    recorder = Recorder()
    await hand(recorder, event)
    (error,) = recorder.decoded
    assert error["type"] == "error"
    assert error["error"]["code"] == "server_error"
    assert recorder.failed == 1


_RESPONSE: dict[str, Any] = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1,
    "model": "m",
    "status": "completed",
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
}
_EVERY_KIND: list[dict[str, Any]] = [
    {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "Think."}],
        "content": [{"type": "reasoning_text", "text": "Thinking."}],
    },
    {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [
            {"type": "output_text", "text": "Hi.", "annotations": []},
            {"type": "refusal", "refusal": "No."},
        ],
    },
    {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "lookup",
        "arguments": "{}",
        "status": "completed",
    },
    {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_2", "name": "x", "input": "ls"},
    {"type": "compaction", "id": "cmp_1", "encrypted_content": "opaque"},
]


def test_lifecycle_events_of_every_item_kind_are_the_sdks_server_events() -> None:
    """A JSON answer's synthesized events: each validates as the SDK's server-event union
    types it and has every field it requires; each item's content has its events."""
    server_events = pytest.importorskip("openai.types.responses.responses_server_event")
    from pydantic import TypeAdapter

    from ws_mode.testing._validation import require_sdk_fields

    union: TypeAdapter[Any] = TypeAdapter(server_events.ResponsesServerEvent)
    events = list(lifecycle_events({**_RESPONSE, "output": _EVERY_KIND}))
    for number, event in enumerate(events):
        assert event["sequence_number"] == number
        require_sdk_fields(f"event {number}", event)
        assert union.validate_python(event).type == event["type"]
    kinds = [event["type"] for event in events]
    for expected in (
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.reasoning_text.done",
        "response.refusal.delta",
        "response.refusal.done",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.compaction.compacting",
    ):
        assert expected in kinds, expected
    refusal = next(e for e in events if e["type"] == "response.refusal.done")
    assert (refusal["refusal"], refusal["content_index"]) == ("No.", 1)
    (custom,) = [e for e in events if e["type"] == "response.custom_tool_call_input.done"]
    assert (custom["input"], custom["output_index"]) == ("ls", 3)


def test_arguments_done_names_the_function_only_when_the_item_does() -> None:
    nameless = {**_EVERY_KIND[2], "name": None}
    for item, name in ((_EVERY_KIND[2], {"name": "lookup"}), (nameless, {})):
        events = lifecycle_events({**_RESPONSE, "output": [item]})
        (done,) = [e for e in events if e["type"] == "response.function_call_arguments.done"]
        assert {key: done[key] for key in done if key == "name"} == name
