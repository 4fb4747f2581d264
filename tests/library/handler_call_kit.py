"""What the tests of the in-process HTTP call share: a sink recording what a HandlerCall hands
on, SSE and JSON answers, a socket's scope, and the call made from them."""

from __future__ import annotations

import typing
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel
from starlette.types import Message, Receive, Scope, Send

from ws_mode import Limits
from ws_mode._handler_call import (
    HandlerCall,
    handler_headers,
    http_scope,
)

# The SDK's event union has no pydantic discriminator: pick each event's model by its type.
STREAM_EVENTS: dict[str, type[BaseModel]] = {
    typing.get_args(model.model_fields["type"].annotation)[0]: model
    for model in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class Sink:
    """Records what a HandlerCall hands on; finishes on a terminal event, like ResponseStream."""

    def __init__(self) -> None:
        self.finished = False
        self.log: list[tuple[str, str | None, Any]] = []

    def frame(self, event_type: str | None, data: bytes) -> str | dict[str, Any]:
        self.log.append(("sse", event_type, data))
        if event_type in TERMINAL:
            self.finished = True
        return ""  # a frame to send

    def frame_object(self, event: dict[str, Any] | bytes) -> str | dict[str, Any]:
        decoded = orjson.loads(event) if isinstance(event, bytes) else event
        self.log.append(("object", decoded.get("type"), decoded))
        if decoded.get("type") in TERMINAL:
            self.finished = True
        return ""  # a frame to send

    async def send_text(self, text: str) -> None:
        return None

    async def event(self, event: dict[str, Any], *, from_handler: bool = False) -> None:
        assert not from_handler, "frame() always answers with a frame"
        self.log.append(("event", event.get("type"), event))
        if event.get("type") in TERMINAL:
            self.finished = True

    @property
    def types(self) -> list[str | None]:
        return [kind for _, kind, _ in self.log]

    @property
    def events(self) -> list[dict[str, Any]]:
        return [payload for source, _, payload in self.log if source == "event"]


def sse(event_type: str, **payload: Any) -> bytes:
    return (
        b"event: "
        + event_type.encode()
        + b"\ndata: "
        + orjson.dumps({"type": event_type, **payload})
        + b"\n\n"
    )


SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8")]
JSON_HEADERS = [(b"content-type", b"application/json")]


def start(status: int = 200, headers: list[tuple[bytes, bytes]] = SSE_HEADERS) -> Message:
    return {"type": "http.response.start", "status": status, "headers": headers}


def body(data: bytes, more: bool = True) -> Message:
    return {"type": "http.response.body", "body": data, "more_body": more}


WS_SCOPE: dict[str, Any] = {
    "type": "websocket",
    "asgi": {"version": "3.0"},
    "scheme": "wss",
    "http_version": "1.1",
    "path": "/v1/responses",
    "raw_path": b"/v1/responses",
    "root_path": "/api",
    "query_string": b"tenant=1",
    "headers": [
        (b"host", b"example.com"),
        (b"connection", b"Upgrade"),
        (b"upgrade", b"websocket"),
        (b"sec-websocket-key", b"dGhlIHNhbXBsZSBub25jZQ=="),
        (b"sec-websocket-version", b"13"),
        (b"sec-websocket-extensions", b"permessage-deflate"),
        (b"sec-websocket-protocol", b"chat"),
        (b"accept-encoding", b"gzip, br"),
        (b"authorization", b"Bearer sk-test"),
        (b"user-agent", b"OpenAI/Python 2.0"),
        (b"x-tenant", b"acme"),
        (b"x-forwarded-for", b"10.0.0.1"),
        (b"x-forwarded-for", b"10.0.0.2"),
        (b"accept", b"*/*"),
        (b"content-type", b"text/plain"),
        (b"content-length", b"99"),
        (b"keep-alive", b"timeout=5"),
        (b"te", b"trailers"),
        (b"transfer-encoding", b"chunked"),
        (b"proxy-connection", b"keep-alive"),
        (b"cookie", b"session=1"),
    ],
    "client": ("10.0.0.9", 50000),
    "server": ("example.com", 443),
    "subprotocols": ["chat"],
    "state": {"db": "pool", "nested": {"a": 1}},
    "extensions": {"websocket.http.response": {}, "tls": {"version": 0x304}},
}


def make_call(
    app: App,
    sink: Any,
    request_body: bytes = b'{"stream":true}',
    max_buffered: int = Limits().max_buffered_answer_bytes,
    extension: object = "the turn",
) -> HandlerCall:
    scope = http_scope(
        WS_SCOPE,
        path="/v1/responses",
        headers=handler_headers(WS_SCOPE),
        body_length=len(request_body),
        extension=extension,
    )
    return HandlerCall(app, scope, request_body, sink, max_buffered=max_buffered)


def response_object(**overrides: Any) -> dict[str, Any]:
    """A finished response object the openai SDK accepts."""
    response: dict[str, Any] = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1700000000,
        "status": "completed",
        "model": "test-model",
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Hello there", "annotations": []}],
            }
        ],
        "previous_response_id": None,
        "instructions": None,
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "store": False,
        "temperature": None,
        "top_p": None,
        "usage": {
            "input_tokens": 3,
            "output_tokens": 2,
            "total_tokens": 5,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
        "error": None,
        "incomplete_details": None,
        "metadata": {},
    }
    response.update(overrides)
    Response.model_validate(response)
    return response


def json_app(
    payload: Any, status: int = 200, headers: list[tuple[bytes, bytes]] = JSON_HEADERS
) -> App:
    encoded = payload if isinstance(payload, bytes) else orjson.dumps(payload)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send(start(status, headers))
        await send(body(encoded, more=False))

    return app
