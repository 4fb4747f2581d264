"""Frames the SDK would never send, over a raw websockets client; and `response.steer`."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import ResponseSteerFailedEvent

from tests.integration.apps import ODD_TEXT
from tests.integration.clients import (
    RawClient,
    Server,
    completed_response,
    create,
    sdk_recv,
    sdk_until_terminal,
)


def _create(**fields: Any) -> str:
    return json.dumps({"type": "response.create", "model": "scripted", **fields})


# (case id, frame, expected code, expected param, mount prefix)
BAD_FRAMES: list[tuple[str, str | bytes, str, str | None, str]] = [
    ("malformed-json", '{"type": "response.create", ', "invalid_json", None, ""),
    ("empty-text", "", "invalid_json", None, ""),
    ("array", '[{"type": "response.create"}]', "invalid_event", None, ""),
    ("number", "42", "invalid_event", None, ""),
    ("string", '"response.create"', "invalid_event", None, ""),
    ("null", "null", "invalid_event", None, ""),
    ("binary", b'{"type": "response.create", "model": "scripted"}', "unsupported_frame", None, ""),
    ("unknown-type", '{"type": "response.cancel"}', "unknown_event_type", "type", ""),
    ("type-not-string", '{"type": 7}', "unknown_event_type", "type", ""),
    ("no-type", '{"model": "scripted", "input": "Hi"}', "missing_required_parameter", "type", ""),
    ("input-number", _create(input=5), "invalid_type", "input", ""),
    ("input-items-not-objects", _create(input=["hi"]), "invalid_type", "input", ""),
    ("tools-string", _create(input="Hi", tools="lookup"), "invalid_type", "tools", ""),
    ("model-number", _create(input="Hi", model=5), "invalid_type", "model", ""),
    (
        "instructions-list",
        _create(input="Hi", instructions=["x"]),
        "invalid_type",
        "instructions",
        "",
    ),
    (
        "previous-id-number",
        _create(input="Hi", previous_response_id=5),
        "invalid_type",
        "previous_response_id",
        "",
    ),
    ("generate-string", _create(input="Hi", generate="no"), "invalid_type", "generate", ""),
    ("stream-string", _create(input="Hi", stream="yes"), "invalid_type", "stream", ""),
    ("background", _create(input="Hi", background=True), "unsupported_parameter", "background", ""),
    ("oversized", _create(input="x" * 2000), "message_too_large", None, "/small"),
    # 600 characters, 1200 bytes: the limit counts bytes, not characters.
    ("oversized-utf8", _create(input="é" * 600), "message_too_large", None, "/small"),
]


def start_conversation(ws: RawClient, tag: str) -> dict[str, Any]:
    ws.send(create(tag, input="Hi", meta={"k": "0"}))
    return completed_response(ws.until_terminal())


def check_usable(ws: RawClient, tag: str, parent: dict[str, Any]) -> None:
    """The next event after the error is the next create's: one error, and the cache intact."""
    ws.send(create(tag, input="More.", previous_response_id=parent["id"], meta={"k": "0"}))
    events = ws.until_terminal()
    assert events[0]["type"] == "response.created", events[0]
    response = completed_response(events)
    assert response["previous_response_id"] == parent["id"]
    assert response["output"][0]["content"][0]["text"] == "Done: received 3 items."


@pytest.mark.parametrize(
    ("frame", "code", "param", "prefix"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_FRAMES],
)
def test_bad_frame_gets_one_error_and_the_socket_stays_usable(
    server: Server, tag: str, frame: str | bytes, code: str, param: str | None, prefix: str
) -> None:
    with server.raw(prefix) as ws:
        parent = start_conversation(ws, tag)
        if isinstance(frame, bytes):
            ws.send_bytes(frame)
        else:
            ws.send_text(frame)
        error = ws.recv()
        assert set(error) == {"type", "sequence_number", "status", "error"}
        assert error["type"] == "error"
        assert error["status"] == 400
        assert error["error"]["type"] == "invalid_request_error"
        assert error["error"]["code"] == code
        assert error["error"]["param"] == param
        assert isinstance(error["error"]["message"], str)
        assert error["error"]["message"]
        check_usable(ws, tag, parent)
    assert len(server.recorder.for_tag(tag)) == 2


def test_refused_create_on_a_lane_names_the_lane(server: Server, tag: str) -> None:
    with server.raw() as ws:
        parent = start_conversation(ws, tag)
        ws.send(create(tag, input="Hi", background=True, stream_id="bg"))
        error = ws.recv()
        assert error["stream_id"] == "bg"
        assert error["error"]["code"] == "unsupported_parameter"
        ws.send(create(tag, input=5, stream_id="typed"))
        error = ws.recv()
        assert error["stream_id"] == "typed"
        assert error["error"]["param"] == "input"
        check_usable(ws, tag, parent)


def _nested(depth: int) -> Any:
    value: Any = "deep"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("where", ["input", "tools", "metadata"])
def test_nesting_too_deep_to_re_encode_gets_an_error_and_the_lane_goes_on(
    server: Server, tag: str, where: str
) -> None:
    """JSON nested 255 to 1,024 levels deep is read but cannot be written again: the turn gets
    a clear error and the create queued behind it on the lane is answered."""
    deep = _nested(400)
    fields: dict[str, Any] = {
        "input": [{"role": "user", "content": "Hi", "extra": deep}],
        "tools": [{"type": "function", "name": "f", "parameters": {"deep": deep}}],
        "metadata": {"deep": deep},
    }
    with server.raw() as ws:
        bad = create(tag, input="Hi", stream_id="lane")
        bad[where] = fields[where] if where != "metadata" else {"tag": tag, "deep": deep}
        ws.send(bad)
        ws.send(create(tag, input="Hi", stream_id="lane"))
        error = ws.recv()
        assert error["type"] == "error"
        assert error["stream_id"] == "lane"
        assert error["error"]["code"] == "nested_too_deeply"
        assert error["status"] == 400
        completed_response(ws.until_terminal())


@pytest.mark.parametrize("prefix", ["", "/onmiss"])
def test_a_large_frame_parsed_off_the_loop_makes_the_same_conversation(
    server: Server, tag: str, prefix: str
) -> None:
    """A frame past the off-loop threshold is parsed in a helper process: the handler gets the
    same items, and the conversation continues from it as from any other."""
    items = [{"role": "user", "content": f"note {index}"} for index in range(35_000)]
    assert len(json.dumps(items)) > 1 << 20
    with server.raw(prefix) as ws:
        ws.send(create(tag, input=items, meta={"k": "0"}))
        first = completed_response(ws.until_terminal())
        assert text_of(first) == "Done: received 35000 items."
        more = create(tag, input="And one more.", meta={"k": "0"}, previous_response_id=first["id"])
        ws.send(more)
        second = completed_response(ws.until_terminal())
        assert text_of(second) == "Done: received 35002 items."


def text_of(response: dict[str, Any]) -> str:
    text: str = response["output"][-1]["content"][0]["text"]
    return text


def test_message_at_the_size_limit_is_accepted(server: Server, tag: str) -> None:
    event = create(tag, input="", meta={"k": "0"})
    size = len(json.dumps(event).encode())
    event["input"] = "x" * (1000 - size)
    assert len(json.dumps(event).encode()) == 1000
    with server.raw("/small") as ws:
        ws.send(event)
        completed_response(ws.until_terminal())


def test_tolerated_and_forwarded_fields(server: Server, tag: str) -> None:
    """`stream: true` and `background: false` are tolerated; unknown fields reach the handler."""
    extra = {
        "temperature": 0.25,
        "store": False,
        "reasoning": {"effort": "low"},
        "some_future_field": {"nested": [1, 2]},
    }
    with server.raw() as ws:
        ws.send(create(tag, input="Hi", stream=True, background=False, meta={"k": "0"}, **extra))
        completed_response(ws.until_terminal())
    [call] = server.recorder.for_tag(tag)
    for key, value in extra.items():
        assert call.body[key] == value
    assert call.body["stream"] is True
    assert call.body["background"] is False


# response.steer


def test_steer_unknown_response(server: Server, tag: str) -> None:
    with server.connect() as conn:
        conn.response.steer(input="Focus on Paris.", previous_response_id="resp_unknown")
        event = sdk_recv(conn)
        assert isinstance(event, ResponseSteerFailedEvent)
        assert event.error.code == "response_not_found"
        assert event.error.type == "invalid_request_error"
        assert event.steer.previous_response_id == "resp_unknown"
        assert event.steer.input == "Focus on Paris."


def test_steer_finished_response_is_already_completed(server: Server, tag: str) -> None:
    with server.connect() as conn:
        conn.response.create(model="scripted", input="Hi", metadata={"tag": tag, "k": "0"})
        response = completed_response(sdk_until_terminal(conn))
        steer_input = [{"role": "user", "content": [{"type": "input_text", "text": "Shorter."}]}]
        conn.response.steer(input=steer_input, previous_response_id=response.id)
        event = sdk_recv(conn)
        assert isinstance(event, ResponseSteerFailedEvent)
        assert event.error.code == "response_already_completed"
        assert event.steer.previous_response_id == response.id
        # The socket goes on.
        conn.response.create(
            model="scripted",
            input="More.",
            previous_response_id=response.id,
            metadata={"tag": tag, "k": "0"},
        )
        assert completed_response(sdk_until_terminal(conn)).previous_response_id == response.id


def test_steer_active_response_is_accepted_and_the_stream_goes_on(server: Server, tag: str) -> None:
    # The "slow" handler streams one endless message: no output boundary comes, so the input
    # stays queued and the stream goes on as it was (test_steering.py covers the boundary).
    with server.raw() as ws:
        ws.send(create(tag, "slow", input="Hi", stream_id="live"))
        created = ws.recv()
        assert created["type"] == "response.created"
        target = created["response"]["id"]
        ws.send({"type": "response.steer", "previous_response_id": target, "input": "Hurry up."})
        seen = [ws.recv() for _ in range(8)]
        accepted = [e for e in seen if e["type"] == "response.steer.accepted"]
        assert len(accepted) == 1
        assert accepted[0]["steer"]["previous_response_id"] == target
        assert accepted[0]["steer"]["id"].startswith("steer_")
        assert any(e["type"] == "response.output_text.delta" for e in seen)
        assert all(e.get("stream_id") == "live" for e in seen)


@pytest.mark.parametrize(
    "steer_input",
    [
        "",
        [],
        [{"type": "function_call_output", "call_id": "call_1", "output": "x"}],
        [{"role": "assistant", "content": "I said so."}],
        [{"role": "user", "content": "Hi", "id": "msg_1"}],
        [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}],
        42,
    ],
    ids=["empty", "no-items", "tool-output", "assistant", "extra-key", "bad-part", "number"],
)
def test_steer_invalid_input(server: Server, tag: str, steer_input: Any) -> None:
    with server.raw() as ws:
        parent = start_conversation(ws, tag)
        ws.send(
            {"type": "response.steer", "previous_response_id": parent["id"], "input": steer_input}
        )
        event = ws.recv()
        assert event["type"] == "response.steer.failed"
        assert event["error"]["code"] == "invalid_input"
        assert event["steer"] == {"previous_response_id": parent["id"], "input": steer_input}
        ResponseSteerFailedEvent.model_validate(
            {**event, "steer": {**event["steer"], "input": "x"}}
        )
        check_usable(ws, tag, parent)


def test_steer_failed_names_the_lane_of_its_target(server: Server, tag: str) -> None:
    with server.raw() as ws:
        ws.send(create(tag, input="Hi", meta={"k": "0"}, stream_id="steered"))
        response = completed_response(ws.until_terminal())
        ws.send({"type": "response.steer", "previous_response_id": response["id"], "input": "x"})
        event = ws.recv()
        assert event["type"] == "response.steer.failed"
        assert event.get("stream_id") == "steered"


# Unusual but legal handler streams


def test_unusual_sse_from_the_handler_is_decoded(server: Server, tag: str) -> None:
    with server.raw() as ws:
        ws.send(create(tag, "odd-sse", input="Hi", stream_id="odd"))
        events = ws.until_terminal()
        assert all("[DONE]" not in frame for frame in ws.frames)
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert all(e["stream_id"] == "odd" for e in events)
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert text == ODD_TEXT
        response = completed_response(events)
        assert response["output"][0]["content"][0]["text"] == ODD_TEXT
        ws.send(create(tag, input="More.", previous_response_id=response["id"], meta={"k": "0"}))
        completed_response(ws.until_terminal())
        ws.expect_silence(0.1)
    calls = server.recorder.for_tag(tag)
    assert calls[1].body["input"][1] == response["output"][0]


def test_sse_without_event_lines(server: Server, tag: str) -> None:
    with server.connect() as conn:
        conn.response.create(model="data-only", input="Hi", metadata={"tag": tag}, stream_id="d")
        events = sdk_until_terminal(conn)
        assert all(event.stream_id == "d" for event in events)
        first = completed_response(events)
        assert first.output[0].type == "function_call"
        conn.response.create(
            model="data-only",
            input=[
                {"type": "function_call_output", "call_id": first.output[0].call_id, "output": "1"}
            ],
            previous_response_id=first.id,
            metadata={"tag": tag, "k": "1"},
        )
        events = sdk_until_terminal(conn)
        assert completed_response(events).output_text == "Done: received 3 items."
        assert events[0].response.previous_response_id == first.id


def test_large_frames_are_normal(server: Server, tag: str) -> None:
    """A 17 MiB frame (past the 16 MiB default of many stacks) is an ordinary turn."""
    big = "x" * (17 * 1024 * 1024)
    with server.connect() as conn:
        conn.response.create(
            model="scripted",
            input=[{"role": "user", "content": big}],
            metadata={"tag": tag, "k": "0"},
        )
        first = completed_response(sdk_until_terminal(conn, timeout=30))
        conn.response.create(
            model="scripted",
            input="Small.",
            previous_response_id=first.id,
            metadata={"tag": tag, "k": "0"},
        )
        second = completed_response(sdk_until_terminal(conn, timeout=30))
        assert second.output_text == "Done: received 3 items."
    calls = server.recorder.for_tag(tag)
    assert calls[0].body_length > len(big)
    assert calls[1].body["input"][0]["content"] == big
