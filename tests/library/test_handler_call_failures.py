"""Tests of the in-process HTTP call when the handler answers with an error or fails."""

from __future__ import annotations

import logging

import orjson
import pytest
from openai.types.responses.responses_server_event import ResponseWsError
from starlette.types import Message, Receive, Scope, Send

from tests.library.handler_call_kit import SSE_HEADERS, Sink, body, json_app, make_call, sse, start
from ws_mode._socket import ClientGone

# --- error answers -----------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("status", [400, 401, 404, 422, 429])
async def test_4xx_json_error_becomes_one_error_event(status: int) -> None:
    error = {
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
        "message": "Too long.",
        "param": "input",
    }
    sink = Sink()
    await make_call(json_app({"error": error}, status=status), sink).run()
    assert sink.events == [
        {"type": "error", "sequence_number": 0, "status": status, "error": error},
    ]
    parsed = ResponseWsError.model_validate(sink.events[0])
    assert parsed.status == status


@pytest.mark.anyio
async def test_4xx_error_body_with_missing_or_odd_fields() -> None:
    sink = Sink()
    payload = {"error": {"message": "Nope.", "code": 42, "param": ["input"]}}
    await make_call(json_app(payload, status=403), sink).run()
    assert sink.events == [
        {
            "type": "error",
            "sequence_number": 0,
            "status": 403,
            "error": {
                "type": "invalid_request_error",
                "code": "invalid_request_error",  # a string always: the type stands in
                "message": "Nope.",
                "param": None,
            },
        }
    ]


@pytest.mark.anyio
async def test_error_status_with_an_event_stream_content_type_is_read_whole() -> None:
    sink = Sink()
    await make_call(
        json_app({"error": {"message": "x"}}, status=400, headers=SSE_HEADERS), sink
    ).run()
    assert sink.types == ["error"]
    assert sink.events[0]["status"] == 400
    assert sink.events[0]["error"]["message"] == "x"


@pytest.mark.anyio
async def test_5xx_non_json_body() -> None:
    sink = Sink()
    app = json_app(
        b"  upstream timed out \n", status=502, headers=[(b"content-type", b"text/plain")]
    )
    await make_call(app, sink).run()
    assert sink.events == [
        {
            "type": "error",
            "sequence_number": 0,
            "status": 502,
            "error": {
                "type": "server_error",
                "code": "server_error",
                "message": "upstream timed out",
                "param": None,
            },
        }
    ]
    ResponseWsError.model_validate(sink.events[0])


@pytest.mark.anyio
async def test_5xx_empty_body() -> None:
    sink = Sink()
    await make_call(json_app(b"", status=503), sink).run()
    (event,) = sink.events
    assert event["status"] == 503
    assert event["error"]["type"] == "server_error"
    assert "503" in event["error"]["message"]


@pytest.mark.anyio
async def test_4xx_long_text_body_is_cut() -> None:
    sink = Sink()
    await make_call(json_app(b"x" * 5000, status=400), sink).run()
    (event,) = sink.events
    assert event["error"]["message"] == "x" * 500
    assert event["error"]["type"] == "invalid_request_error"


@pytest.mark.anyio
async def test_an_answer_read_whole_is_bounded_by_max_buffered_answer_bytes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = Sink()
    await make_call(json_app(b"x" * 100, status=400), sink, max_buffered=100).run()
    (event,) = sink.events
    assert (event["status"], event["error"]["message"]) == (400, "x" * 100)

    sink = Sink()
    with caplog.at_level(logging.ERROR, logger="ws_mode._handler_call"):
        await make_call(json_app(b"x" * 101, status=400), sink, max_buffered=100).run()
    (event,) = sink.events
    assert (event["status"], event["error"]["code"]) == (500, "server_error")
    assert "larger than ws_mode accepts" in caplog.text


# --- handler failures --------------------------------------------------------------------------


@pytest.mark.anyio
async def test_handler_raising_before_start(caplog: pytest.LogCaptureFixture) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        raise ValueError("broken handler")

    sink = Sink()
    with caplog.at_level(logging.ERROR, logger="ws_mode._handler_call"):
        await make_call(app, sink).run()
    (event,) = sink.events
    assert event["status"] == 500
    assert event["error"]["type"] == "server_error"
    assert event["error"]["code"] == "server_error"
    assert "ValueError" in event["error"]["message"]
    assert "broken handler" in caplog.text
    ResponseWsError.model_validate(event)


@pytest.mark.anyio
async def test_handler_raising_mid_stream() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send(start())
        await send(body(sse("response.created") + sse("response.output_text.delta", delta="a")))
        raise RuntimeError("model crashed")

    sink = Sink()
    await make_call(app, sink).run()
    assert sink.types == ["response.created", "response.output_text.delta", "error"]
    assert sink.events[0]["status"] == 500
    assert sink.events[0]["error"]["code"] == "server_error"


@pytest.mark.anyio
async def test_handler_raising_after_the_terminal_event_is_not_reported() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send(start())
        await send(body(sse("response.completed")))
        raise RuntimeError("cleanup failed")

    sink = Sink()
    await make_call(app, sink).run()
    assert sink.types == ["response.completed"]


@pytest.mark.anyio
async def test_handler_returning_without_answering() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()

    sink = Sink()
    await make_call(app, sink).run()
    (event,) = sink.events
    assert event["status"] == 500
    assert "without answering" in event["error"]["message"]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "messages",
    [
        [body(b"early")],
        [start(), start()],
    ],
    ids=["body-before-start", "start-twice"],
)
async def test_asgi_protocol_errors_are_server_errors(messages: list[Message]) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        for message in messages:
            await send(message)

    sink = Sink()
    await make_call(app, sink).run()
    assert sink.types == ["error"]
    assert sink.events[0]["status"] == 500


@pytest.mark.anyio
async def test_client_gone_propagates() -> None:
    class LeavingSink(Sink):
        async def send_text(self, text: str) -> None:
            raise ClientGone("left")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send(start())
        await send(body(sse("response.created")))

    sink = LeavingSink()
    with pytest.raises(ClientGone):
        await make_call(app, sink).run()
    # The event was framed; its send found the client gone, and nothing more was reported.
    assert sink.log == [("sse", "response.created", b'{"type":"response.created"}')]


@pytest.mark.anyio
async def test_a_streamed_event_that_never_ends_is_bounded_by_max_buffered_answer_bytes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An event stream is handed on event by event; one event that never ends (no blank line)
    would be held whole, so it is bounded too: past the limit the handler's `send` raises, and
    the turn fails with a server error."""
    sent: list[int] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send(start())
        await send(body(sse("response.created")))
        await send(body(b"data: "))
        for _ in range(200):  # one data line of 20,000 bytes, its event never ended
            await send(body(b"x" * 100))
            sent.append(100)
        await send(body(b"", more=False))

    sink = Sink()
    with caplog.at_level(logging.ERROR, logger="ws_mode._handler_call"):
        await make_call(app, sink, max_buffered=1000).run()
    assert sink.types == ["response.created", "error"]
    assert (sink.events[-1]["status"], sink.events[-1]["error"]["code"]) == (500, "server_error")
    assert "larger than ws_mode accepts" in caplog.text
    assert 900 <= sum(sent) <= 1000  # refused at the chunk that passed the limit


@pytest.mark.anyio
async def test_a_long_event_within_max_buffered_answer_bytes_arrives_whole() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send(start())
        await send(body(sse("response.created")))
        event = sse("response.output_text.delta", delta="y" * 5000)
        for offset in range(0, len(event), 100):  # in pieces of a line
            await send(body(event[offset : offset + 100]))
        await send(body(b"", more=False))

    sink = Sink()
    await make_call(app, sink, max_buffered=6000).run()
    delta = "response.output_text.delta"
    deltas = [orjson.loads(data) for _, kind, data in sink.log if kind == delta]
    assert [event["delta"] for event in deltas] == ["y" * 5000]
