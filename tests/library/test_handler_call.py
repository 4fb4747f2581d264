"""Tests of the in-process HTTP call: the synthetic scope, the handler's SSE and JSON answers,
`receive()`, real frameworks, and events handed as objects (its errors and failures:
test_handler_call_failures.py)."""

from __future__ import annotations

import asyncio
import logging
import typing
from typing import Any

import orjson
import pytest
from openai.types.responses.responses_server_event import ResponseWsError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from tests.library.handler_call_kit import (
    JSON_HEADERS,
    STREAM_EVENTS,
    WS_SCOPE,
    Sink,
    body,
    json_app,
    make_call,
    response_object,
    sse,
    start,
)
from ws_mode import Turn, turn
from ws_mode._events import ResponseStream
from ws_mode._handler_call import (
    HandlerCall,
    handler_headers,
    http_scope,
)

# --- the synthetic scope --------------------------------------------------------------------


def test_handler_headers_keep_the_app_headers_and_drop_the_socket_ones() -> None:
    headers = handler_headers(WS_SCOPE)
    assert headers == [
        (b"host", b"example.com"),
        (b"authorization", b"Bearer sk-test"),
        (b"user-agent", b"OpenAI/Python 2.0"),
        (b"x-tenant", b"acme"),
        (b"x-forwarded-for", b"10.0.0.1"),
        (b"x-forwarded-for", b"10.0.0.2"),
        (b"cookie", b"session=1"),
        (b"content-type", b"application/json"),
        (b"accept", b"text/event-stream"),
    ]


def test_handler_headers_without_host() -> None:
    scope = {"type": "websocket", "headers": [(b"authorization", b"Bearer x")]}
    assert handler_headers(scope) == [
        (b"authorization", b"Bearer x"),
        (b"content-type", b"application/json"),
        (b"accept", b"text/event-stream"),
    ]
    assert handler_headers({"type": "websocket"})[-2:] == [
        (b"content-type", b"application/json"),
        (b"accept", b"text/event-stream"),
    ]


def test_http_scope() -> None:
    turn = object()
    headers = handler_headers(WS_SCOPE)
    scope = http_scope(
        WS_SCOPE, path="/v1/responses", headers=headers, body_length=42, extension=turn
    )
    assert scope["type"] == "http"
    assert scope["method"] == "POST"
    assert scope["http_version"] == "1.1"
    assert scope["scheme"] == "https"
    assert scope["path"] == "/v1/responses"
    assert scope["raw_path"] == b"/v1/responses"
    assert scope["root_path"] == "/api"
    assert scope["client"] == ("10.0.0.9", 50000)
    assert scope["server"] == ("example.com", 443)
    assert scope["asgi"]["version"] == "3.0"
    assert scope["headers"] == [*headers, (b"content-length", b"42")]
    assert scope["extensions"]["ws_mode"] is turn
    assert "websocket.http.response" not in scope["extensions"]
    assert scope["extensions"]["tls"] == {"version": 0x304}
    # The socket's own scope is left as it was.
    assert "ws_mode" not in WS_SCOPE["extensions"]
    assert "websocket.http.response" in WS_SCOPE["extensions"]
    assert headers == handler_headers(WS_SCOPE)
    assert "subprotocols" not in scope


def test_http_scope_reads_as_a_request() -> None:
    request_body = b'{"model":"m","stream":true}'
    scope = http_scope(
        WS_SCOPE,
        path="/v1/responses",
        headers=handler_headers(WS_SCOPE),
        body_length=len(request_body),
        extension=None,
    )
    request = Request(scope)
    assert request.method == "POST"
    assert request.url.scheme == "https"
    assert request.url.hostname == "example.com"
    assert request.url.path.endswith("/v1/responses")
    assert request.url.query == "tenant=1"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["accept"] == "text/event-stream"
    assert request.headers["content-length"] == str(len(request_body))
    assert request.headers.getlist("x-forwarded-for") == ["10.0.0.1", "10.0.0.2"]
    assert request.headers.getlist("content-length") == [str(len(request_body))]
    assert request.headers.getlist("accept") == ["text/event-stream"]
    assert request.headers.getlist("content-type") == ["application/json"]
    assert "accept-encoding" not in request.headers
    assert "upgrade" not in request.headers
    assert "connection" not in request.headers
    assert not any(name.startswith("sec-websocket-") for name in request.headers)


@pytest.mark.parametrize(
    ("ws_scheme", "http_scheme"), [("ws", "http"), ("wss", "https"), (None, "http")]
)
def test_http_scope_scheme(ws_scheme: str | None, http_scheme: str) -> None:
    ws_scope = dict(WS_SCOPE)
    if ws_scheme is None:
        del ws_scope["scheme"]
    else:
        ws_scope["scheme"] = ws_scheme
    scope = http_scope(ws_scope, path="/x", headers=[], body_length=0, extension=None)
    assert scope["scheme"] == http_scheme


def test_http_scope_state_is_a_shallow_copy() -> None:
    scope = http_scope(WS_SCOPE, path="/x", headers=[], body_length=0, extension=None)
    assert scope["state"] == WS_SCOPE["state"]
    assert scope["state"] is not WS_SCOPE["state"]
    assert scope["state"]["nested"] is WS_SCOPE["state"]["nested"]
    scope["state"]["db"] = "changed"
    scope["state"]["new"] = True
    assert WS_SCOPE["state"] == {"db": "pool", "nested": {"a": 1}}


def test_http_scope_without_state_or_extensions() -> None:
    ws_scope = {"type": "websocket", "path": "/v1/responses", "headers": []}
    scope = http_scope(ws_scope, path="/handler", headers=[], body_length=7, extension="t")
    assert "state" not in scope
    assert scope["extensions"] == {"ws_mode": "t"}
    assert scope["path"] == "/handler"
    assert scope["root_path"] == ""
    assert scope["query_string"] == b""
    assert scope["headers"] == [(b"content-length", b"7")]


# --- SSE answers --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_sse_answer_is_forwarded_event_by_event() -> None:
    sink = Sink()
    events = [
        sse("response.created", sequence_number=0),
        sse("response.output_text.delta", sequence_number=1, delta="Hel"),
        sse("response.output_text.delta", sequence_number=2, delta="lo"),
        sse("response.completed", sequence_number=3),
    ]
    stream = b"".join(events)
    first_end = len(events[0])
    # Odd cuts: the first chunk ends just after event 1, mid-way into event 2's `data:` line.
    cuts = [first_end + 9, first_end + 10, len(stream) - 7, len(stream) - 1]
    seen_before_chunk: list[list[str | None]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["body"] == b'{"stream":true}'
        await send(start())
        previous = 0
        for cut in [*cuts, len(stream)]:
            seen_before_chunk.append(list(sink.types))
            await send(body(stream[previous:cut], more=cut < len(stream)))
            previous = cut

    call = make_call(app, sink)
    await call.run()
    assert call.status == 200
    assert sink.types == [
        "response.created",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.completed",
    ]
    assert [payload for _, _, payload in sink.log] == [
        event.split(b"data: ")[1][:-2] for event in events
    ]
    # Event 1 went out before the app sent chunk 2.
    assert seen_before_chunk[0] == []
    assert seen_before_chunk[1] == ["response.created"]
    assert seen_before_chunk[2] == ["response.created"]
    assert seen_before_chunk[3] == [
        "response.created",
        "response.output_text.delta",
        "response.output_text.delta",
    ]
    assert sink.finished


@pytest.mark.anyio
async def test_sse_answer_in_one_byte_chunks_with_crlf() -> None:
    sink = Sink()
    stream = (
        b'event: response.created\r\ndata: {"type":"response.created"}\r\n\r\n'
        b": comment\r\n"
        b'event: response.completed\r\ndata: {"type":"response.completed"}\r\n\r\n'
    )

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send(start(headers=[(b"Content-Type", b"Text/Event-Stream")]))
        for index in range(len(stream)):
            await send(body(stream[index : index + 1]))
        await send(body(b"", more=False))

    await make_call(app, sink).run()
    assert sink.log == [
        ("sse", "response.created", b'{"type":"response.created"}'),
        ("sse", "response.completed", b'{"type":"response.completed"}'),
    ]


@pytest.mark.anyio
async def test_events_after_the_terminal_one_are_dropped() -> None:
    sink = Sink()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send(start())
        await send(
            body(
                sse("response.created")
                + sse("response.completed")
                + sse("response.output_text.delta", delta="late"),
            )
        )
        await send(body(sse("response.output_text.delta", delta="later"), more=False))

    await make_call(app, sink).run()
    assert sink.types == ["response.created", "response.completed"]


@pytest.mark.anyio
async def test_stream_without_terminal_event_is_a_server_error() -> None:
    sink = Sink()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send(start())
        await send(
            body(sse("response.created") + b"event: response.completed\ndata: {}\n", more=False)
        )

    await make_call(app, sink).run()
    assert sink.types == ["response.created", "error"]
    error = sink.events[-1]
    assert error["status"] == 500
    assert error["error"]["type"] == "server_error"
    assert "terminal" in error["error"]["message"]
    ResponseWsError.model_validate(error)


@pytest.mark.anyio
async def test_body_after_the_last_chunk_is_ignored() -> None:
    sink = Sink()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send(start())
        await send(body(sse("response.created"), more=False))
        await send(body(sse("response.completed"), more=False))

    await make_call(app, sink).run()
    assert sink.types == ["response.created", "error"]


# --- JSON answers -------------------------------------------------------------------------------

TEXT_TURN = [
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


def assert_sdk_events(events: list[dict[str, Any]]) -> None:
    for event in events:
        parsed = STREAM_EVENTS[event["type"]].model_validate(event)
        assert getattr(parsed, "sequence_number", None) == event["sequence_number"]


@pytest.mark.anyio
async def test_json_answer_becomes_lifecycle_events() -> None:
    sink = Sink()
    response = response_object()
    await make_call(json_app(response), sink).run()
    assert sink.types == TEXT_TURN
    events = sink.events
    assert [event["sequence_number"] for event in events] == list(range(len(TEXT_TURN)))
    assert_sdk_events(events)
    created = events[0]["response"]
    assert created["status"] == "in_progress"
    assert created["output"] == []
    assert created["id"] == "resp_1"
    assert events[1]["response"] == created
    assert events[2]["item"]["content"] == []
    assert events[2]["item"]["status"] == "in_progress"
    assert events[3]["part"]["text"] == ""
    assert events[4]["delta"] == "Hello there"
    assert events[5]["text"] == "Hello there"
    assert events[6]["part"] == response["output"][0]["content"][0]
    assert events[7]["item"] == response["output"][0]
    assert events[-1]["response"] == response
    for event in events[3:7]:
        assert event["item_id"] == "msg_1"
        assert event["output_index"] == 0
        assert event["content_index"] == 0


@pytest.mark.anyio
async def test_json_answer_with_every_item_kind() -> None:
    output = [
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city":"Paris"}',
            "status": "completed",
        },
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": "a", "annotations": []},
                {"type": "output_text", "text": "b", "annotations": []},
            ],
        },
    ]
    response = response_object(output=output)
    sink = Sink()
    await make_call(json_app(response), sink).run()
    assert sink.types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        *(TEXT_TURN[3:7] * 2),
        "response.output_item.done",
        "response.completed",
    ]
    events = sink.events
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert_sdk_events(events)
    assert events[2]["item"] == output[0]
    assert events[4]["item"]["arguments"] == ""
    assert events[5]["delta"] == events[6]["arguments"] == '{"city":"Paris"}'
    assert events[6]["name"] == "get_weather"
    done = [event for event in events if event["type"] == "response.output_item.done"]
    assert [event["item"] for event in done] == output
    assert [event["output_index"] for event in done] == [0, 1, 2]
    assert [e["content_index"] for e in events if e["type"] == "response.output_text.delta"] == [
        0,
        1,
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("payload", [b"not json", b"[1, 2]", b'"resp"', b'{"output": "text"}', b""])
async def test_json_answer_that_is_not_a_response(payload: bytes) -> None:
    sink = Sink()
    await make_call(json_app(payload), sink).run()
    assert sink.types == ["error"]
    assert sink.events[0]["status"] == 500
    assert sink.events[0]["error"]["code"] == "server_error"


# --- receive() ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_receive_gives_the_body_then_blocks_until_cancelled() -> None:
    received: list[Message] = []
    waiting: list[asyncio.Task[Message]] = []
    blocked = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        received.append(await receive())
        # Like Starlette's listen_for_disconnect: a second receive() in its own task.
        waiting.append(asyncio.ensure_future(receive()))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(receive(), 0.1)
        blocked.set()
        await asyncio.sleep(3600)

    sink = Sink()
    call = make_call(app, sink, b'{"input":"hi"}')
    task = asyncio.ensure_future(call.run())
    await asyncio.wait_for(blocked.wait(), 5)
    assert received == [{"type": "http.request", "body": b'{"input":"hi"}', "more_body": False}]
    (waiter,) = waiting
    assert not waiter.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.wait_for(waiter, 10) == {"type": "http.disconnect"}
    assert await asyncio.wait_for(call.receive(), 10) == {"type": "http.disconnect"}
    assert sink.log == []


@pytest.mark.anyio
async def test_receive_after_the_response_is_complete_returns_disconnect() -> None:
    after: list[Message | str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send(start())
        await send(body(sse("response.completed"), more=False))
        try:
            after.append(await asyncio.wait_for(receive(), 0.5))
        except TimeoutError:
            after.append("still blocked")

    sink = Sink()
    await make_call(app, sink).run()
    assert sink.types == ["response.completed"]
    assert after == [{"type": "http.disconnect"}]


# --- real frameworks ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_starlette_streaming_handler_is_not_cut_short() -> None:
    async def handler(request: Request) -> StreamingResponse:
        payload = await request.json()
        assert payload == {"stream": True}
        assert request.headers["authorization"] == "Bearer sk-test"
        assert request.scope["extensions"]["ws_mode"] == "the turn"

        async def events() -> typing.AsyncIterator[bytes]:
            yield sse("response.created", sequence_number=0)
            for index in range(5):
                await asyncio.sleep(0.01)
                yield sse("response.output_text.delta", sequence_number=index + 1, delta="x")
            yield sse("response.completed", sequence_number=6)

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/responses", handler, methods=["POST"])])
    sink = Sink()
    await make_call(app, sink).run()
    assert sink.types == [
        "response.created",
        *["response.output_text.delta"] * 5,
        "response.completed",
    ]


@pytest.mark.anyio
async def test_starlette_json_and_error_handlers() -> None:
    response = response_object()

    async def ok(request: Request) -> JSONResponse:
        return JSONResponse(response)

    async def fails(request: Request) -> PlainTextResponse:
        return PlainTextResponse("quota exhausted", status_code=429)

    app = Starlette(
        routes=[
            Route("/v1/responses", ok, methods=["POST"]),
            Route("/fail", fails, methods=["POST"]),
        ]
    )
    sink = Sink()
    await make_call(app, sink).run()
    assert sink.types == TEXT_TURN

    scope = http_scope(
        WS_SCOPE, path="/fail", headers=handler_headers(WS_SCOPE), body_length=2, extension=None
    )
    sink = Sink()
    await HandlerCall(app, scope, b"{}", sink, max_buffered=1024).run()
    assert sink.events == [
        {
            "type": "error",
            "sequence_number": 0,
            "status": 429,
            "error": {
                "type": "invalid_request_error",
                "code": "invalid_request_error",
                "message": "quota exhausted",
                "param": None,
            },
        }
    ]


@pytest.mark.anyio
async def test_with_a_response_stream_as_the_sink() -> None:
    frames: list[str] = []
    finished: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []

    class SocketAndTurn:
        """The stream's socket and its owner."""

        async def send_text(self, text: str) -> None:
            frames.append(text)

        def response_finished(
            self, response: dict[str, Any], output: list[dict[str, Any]], size: int
        ) -> None:
            finished.append((response, output))

        def response_failed(self, response: dict[str, Any] | None) -> None:
            pytest.fail("the response did not fail")

    ends = SocketAndTurn()
    stream = ResponseStream(
        ends,  # as the socket: it only sends text
        ends,
        stream_id="lane",
        previous_response_id="resp_0",
    )
    response = response_object(previous_response_id=None)
    await make_call(json_app(response), stream).run()
    decoded = [orjson.loads(frame) for frame in frames]
    assert [event["type"] for event in decoded] == TEXT_TURN
    assert all(event["stream_id"] == "lane" for event in decoded)
    assert decoded[0]["response"]["previous_response_id"] == "resp_0"
    assert decoded[-1]["response"]["previous_response_id"] == "resp_0"
    ((done_response, output),) = finished
    assert done_response["id"] == "resp_1"
    assert output == response["output"]
    assert stream.succeeded


# --- events handed as objects (Turn.send_event) -------------------------------------------------


@pytest.mark.anyio
async def test_events_handed_before_the_answer_stand_for_an_event_stream() -> None:
    current = Turn(previous=None, new_input=[])

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        handed = turn(scope)
        assert handed is current
        await handed.send_event({"type": "response.created", "sequence_number": 0})
        await handed.send_event(b'{"type":"response.completed","sequence_number":1}')
        # The answer that follows changes nothing: the response ended with the handed events.
        await send(start(200, JSON_HEADERS))
        await send(body(b"", more=False))

    sink = Sink()
    await make_call(app, sink, extension=current).run()
    assert sink.log == [
        ("object", "response.created", {"type": "response.created", "sequence_number": 0}),
        ("object", "response.completed", {"type": "response.completed", "sequence_number": 1}),
    ]
    with pytest.raises(RuntimeError, match="only while the turn's handler runs"):
        await current.send_event({"type": "response.created"})


@pytest.mark.anyio
async def test_handed_events_and_sse_go_out_in_order() -> None:
    current = Turn(previous=None, new_input=[])

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send(start())
        await send(body(sse("response.created")))
        await current.send_event({"type": "response.output_text.delta", "delta": "a"})
        await send(body(sse("response.completed"), more=False))

    sink = Sink()
    await make_call(app, sink, extension=current).run()
    assert sink.types == ["response.created", "response.output_text.delta", "response.completed"]


@pytest.mark.anyio
async def test_an_event_handed_after_a_json_answer_started_is_a_server_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    current = Turn(previous=None, new_input=[])

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send(start(200, JSON_HEADERS))
        await current.send_event({"type": "response.created"})

    sink = Sink()
    with caplog.at_level(logging.ERROR, logger="ws_mode._handler_call"):
        await make_call(app, sink, extension=current).run()
    (event,) = sink.events
    assert event["error"]["code"] == "server_error"
    assert "not an event stream" in caplog.text
