"""OpenTelemetry tracing: a span per connection and one per turn, recorded by the SDK's in-memory
exporter while a real client talks to a real server (uvicorn).

A conversation gives one connection span with a child per turn carrying its response id,
parent id, lane, cache hit or miss, store hydration, bytes and status; the handshake's
`traceparent` is the connection's parent; the handler's own spans nest under the turn, and its
request carries the turn's `traceparent`; with a no-op provider, or without opentelemetry at
all, nothing is traced and the handler sees the headers the client sent.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracerProvider, SpanKind, StatusCode
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.servers import serve
from ws_mode import ConfigError, MemoryStore, WebSocketModeMiddleware
from ws_mode._logs import LOG_VALUE_CHARS, cut
from ws_mode.testing._client import SyncSocket, connect

#: A remote parent, as a client's instrumentation would send it in the handshake.
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
WAIT = 10.0


@dataclass
class Seen:
    """What the handler saw on each call: the `traceparent` header and the span current
    while it ran (its own span's parent)."""

    traceparent: list[str | None] = field(default_factory=list)
    current: list[trace.SpanContext] = field(default_factory=list)


def handler_app(provider: trace.TracerProvider, seen: Seen) -> Starlette:
    """A Responses handler answering JSON that makes a span of its own for each call."""
    tracer = provider.get_tracer("the-application")

    async def create(request: Request) -> JSONResponse:
        body = await request.json()
        seen.traceparent.append(request.headers.get("traceparent"))
        seen.current.append(trace.get_current_span().get_span_context())
        with tracer.start_as_current_span("handler work"):
            return JSONResponse(
                {
                    "id": f"resp_{uuid.uuid4().hex}",
                    "object": "response",
                    "status": "completed",
                    "model": body.get("model"),
                    "output": [
                        {
                            "type": "message",
                            "id": f"msg_{uuid.uuid4().hex}",
                            "role": "assistant",
                            "status": "completed",
                            "content": [{"type": "output_text", "text": "hi", "annotations": []}],
                        }
                    ],
                }
            )

    return Starlette(routes=[Route("/v1/responses", create, methods=["POST"])])


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    made = TracerProvider()
    made.add_span_processor(SimpleSpanProcessor(exporter))
    yield made
    made.shutdown()


def served(provider: Any, seen: Seen, **options: Any) -> Any:
    app = WebSocketModeMiddleware(handler_app(provider, seen), tracer_provider=provider, **options)
    return serve(app)


def create(previous: str | None = None, **fields: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "response.create", "model": "m", "input": "hello", **fields}
    if previous is not None:
        event["previous_response_id"] = previous
    return event


def turn(sock: SyncSocket, previous: str | None = None, **fields: Any) -> dict[str, Any]:
    """One turn; its terminal event."""
    sock.send(create(previous, **fields))
    return sock.receive_turn(timeout=WAIT)[-1]


def spans_once(
    exporter: InMemorySpanExporter, ready: Callable[[list[ReadableSpan]], bool]
) -> list[ReadableSpan]:
    """The finished spans once `ready` says they are all there (the server ends a connection's
    span after the client saw the socket close)."""
    deadline = time.monotonic() + WAIT
    while True:
        spans = list(exporter.get_finished_spans())
        if ready(spans) or time.monotonic() > deadline:
            return spans
        time.sleep(0.02)


def connection_spans(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return [span for span in spans if span.name == "WebSocket /v1/responses"]


def turn_spans(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return [span for span in spans if span.name == "response.create"]


def closed(count: int = 1) -> Callable[[list[ReadableSpan]], bool]:
    return lambda spans: len(connection_spans(spans)) >= count


def test_a_conversation_is_one_connection_span_with_a_child_per_turn(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    seen = Seen()
    with served(provider, seen) as base, connect(base) as sock:
        first = turn(sock)["response"]["id"]
        second = turn(sock, first, stream_id="lane-a")["response"]["id"]
        third = turn(sock, second, stream_id="lane-a")["response"]["id"]
        sock.close()
        spans = spans_once(exporter, closed())
    (connection,) = connection_spans(spans)
    turns = sorted(turn_spans(spans), key=lambda span: span.start_time or 0)
    assert len(turns) == 3
    assert connection.kind is SpanKind.SERVER
    assert connection.parent is None  # no traceparent in the handshake: a trace of its own
    attributes = dict(connection.attributes or {})
    assert attributes["network.protocol.name"] == "websocket"
    assert attributes["url.path"] == "/v1/responses"
    assert attributes["client.address"] == "127.0.0.1"
    assert attributes["ws_mode.turns"] == 3
    assert attributes["ws_mode.close.code"] == 1000
    assert attributes["ws_mode.close.by"] == "client"
    assert attributes["ws_mode.bytes_in"] > 0
    assert attributes["ws_mode.bytes_out"] > attributes["ws_mode.bytes_in"]
    connection_id = attributes["ws_mode.connection.id"]
    for span, header, (response_id, previous, lane) in zip(
        turns,
        seen.traceparent,
        [(first, None, None), (second, first, "lane-a"), (third, second, "lane-a")],
        strict=True,
    ):
        context = span.context
        assert header == (
            f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
        )
        assert span.parent is not None
        assert span.parent.span_id == connection.context.span_id
        assert span.context.trace_id == connection.context.trace_id
        assert span.status.status_code is StatusCode.UNSET
        turn_attributes = dict(span.attributes or {})
        assert turn_attributes["gen_ai.response.id"] == response_id
        assert turn_attributes["gen_ai.request.model"] == "m"
        assert turn_attributes["gen_ai.operation.name"] == "chat"
        assert turn_attributes["gen_ai.provider.name"] == "openai"
        assert turn_attributes["ws_mode.response.status"] == "completed"
        assert turn_attributes["ws_mode.connection.id"] == connection_id
        assert turn_attributes.get("ws_mode.previous_response_id") == previous
        assert turn_attributes.get("ws_mode.stream_id") == lane
        assert turn_attributes["ws_mode.bytes_in"] > 0
        assert turn_attributes["ws_mode.bytes_out"] > 0
        if previous is None:
            assert "ws_mode.cache.hit" not in turn_attributes
        else:
            assert turn_attributes["ws_mode.cache.hit"] is True
            assert turn_attributes["ws_mode.store.hydrated"] is False
        assert "error.type" not in turn_attributes
    # The turns' bytes are the connection's (it sent nothing of its own).
    assert (
        sum(dict(span.attributes or {})["ws_mode.bytes_out"] for span in turns)
        == (attributes["ws_mode.bytes_out"])
    )


def test_spans_keep_a_bounded_part_of_every_client_value(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """An SDK holds each span until it is exported: what a client chose (its model, user agent
    and, behind a trusted proxy, its address) goes in cut, never whole."""
    model = "gpt-" + "m" * 100_000
    agent = "agent/" + "a" * 5000
    forwarded = "10.0.0.9" + "f" * 4000  # uvicorn trusts 127.0.0.1's X-Forwarded-For
    seen = Seen()
    headers = {"User-Agent": agent, "X-Forwarded-For": forwarded}
    with served(provider, seen) as base, connect(base, headers=headers) as sock:
        first = turn(sock, model=model)["response"]["id"]
        assert turn(sock, first, model=model, stream_id="s" * 256)["type"] == "response.completed"
        sock.close()
        spans = spans_once(exporter, closed())
    (connection,) = connection_spans(spans)
    turns = sorted(turn_spans(spans), key=lambda span: span.start_time or 0)
    attributes = dict(connection.attributes or {})
    assert attributes["user_agent.original"] == agent[:256] + "... (5006 characters)"
    assert attributes["client.address"] == forwarded[:256] + "... (4008 characters)"
    for span in turns:
        turn_attributes = dict(span.attributes or {})
        assert turn_attributes["gen_ai.request.model"] == cut(model)
        assert turn_attributes["gen_ai.request.model"].endswith("... (100004 characters)")
    # Ids and lanes are refused past their bounds on arrival, so the ones a span gets are whole.
    assert dict(turns[1].attributes or {})["ws_mode.previous_response_id"] == first
    assert dict(turns[1].attributes or {})["ws_mode.stream_id"] == "s" * 256
    for span in spans:
        for value in dict(span.attributes or {}).values():
            assert not isinstance(value, str) or len(value) <= LOG_VALUE_CHARS + 30


def test_the_handshake_traceparent_is_the_connection_s_parent(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    seen = Seen()
    with (
        served(provider, seen) as base,
        connect(base, headers={"traceparent": TRACEPARENT}) as sock,
    ):
        turn(sock)
        sock.close()
        spans = spans_once(exporter, closed())
    (connection,) = connection_spans(spans)
    assert connection.parent is not None
    assert connection.parent.is_remote
    assert f"{connection.context.trace_id:032x}" == CLIENT_TRACE
    assert f"{connection.parent.span_id:016x}" == CLIENT_SPAN
    (only,) = turn_spans(spans)
    assert f"{only.context.trace_id:032x}" == CLIENT_TRACE


def test_under_the_application_s_own_server_span_the_connection_is_its_child(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    # As OpenTelemetry's ASGI instrumentation around the middleware does: a server span made
    # from the handshake is current when the middleware is called.
    seen = Seen()
    tracer = provider.get_tracer("the-application")
    middleware = WebSocketModeMiddleware(handler_app(provider, seen), tracer_provider=provider)

    async def instrumented(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await middleware(scope, receive, send)
            return
        with tracer.start_as_current_span("GET /v1/responses", kind=SpanKind.SERVER):
            await middleware(scope, receive, send)

    with serve(instrumented) as base, connect(base) as sock:
        turn(sock)
        sock.close()
        spans = spans_once(exporter, lambda found: len(found) >= 4)
    (outer,) = [span for span in spans if span.name == "GET /v1/responses"]
    (connection,) = connection_spans(spans)
    assert connection.kind is SpanKind.INTERNAL
    assert connection.parent is not None
    assert connection.parent.span_id == outer.context.span_id


def test_the_handler_s_own_spans_nest_under_the_turn(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    seen = Seen()
    with (
        served(provider, seen) as base,
        connect(base, headers={"traceparent": TRACEPARENT}) as sock,
    ):
        first = turn(sock)["response"]["id"]
        turn(sock, first)
        sock.close()
        spans = spans_once(exporter, closed())
    turns = sorted(turn_spans(spans), key=lambda span: span.start_time or 0)
    handlers = sorted(
        (span for span in spans if span.name == "handler work"),
        key=lambda span: span.start_time or 0,
    )
    assert len(turns) == len(handlers) == 2
    for turn_span, handler_span, header, current in zip(
        turns, handlers, seen.traceparent, seen.current, strict=True
    ):
        # The span current in the handler is the turn's...
        assert handler_span.parent is not None
        assert handler_span.parent.span_id == turn_span.context.span_id
        assert current.span_id == turn_span.context.span_id
        # ...and its request carries it (for an app whose ASGI instrumentation reads it),
        # instead of the client's handshake traceparent.
        context = turn_span.context
        assert header == (
            f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
        )


def test_a_cache_miss_and_a_store_hydration_show_on_the_turn(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    seen = Seen()
    store = MemoryStore()
    with served(provider, seen, store=store, shared_store=True) as base:
        with connect(base) as sock:
            stored = turn(sock)["response"]["id"]
            missing = turn(sock, "resp_nowhere")
            assert missing["type"] == "error"
        with connect(base) as sock:  # a new connection: its cache is empty, the store has it
            continued = turn(sock, stored)
            assert continued["type"] == "response.completed"
        spans = spans_once(exporter, closed(2))
    by_parent = {
        dict(span.attributes or {}).get("ws_mode.previous_response_id"): span
        for span in turn_spans(spans)
    }
    miss = by_parent["resp_nowhere"]
    attributes = dict(miss.attributes or {})
    assert attributes["ws_mode.cache.hit"] is False
    assert attributes["ws_mode.store.hydrated"] is False
    assert attributes["error.type"] == "previous_response_not_found"
    assert attributes["ws_mode.response.status"] == "failed"
    assert attributes["ws_mode.bytes_out"] > 0
    assert "gen_ai.response.id" not in attributes
    assert miss.status.status_code is StatusCode.ERROR
    hydrated = dict(by_parent[stored].attributes or {})
    assert hydrated["ws_mode.cache.hit"] is False
    assert hydrated["ws_mode.store.hydrated"] is True
    assert hydrated["ws_mode.response.status"] == "completed"


def test_a_warm_up_is_a_turn_too(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    seen = Seen()
    with served(provider, seen) as base, connect(base) as sock:
        warm = turn(sock, generate=False)
        sock.close()
        spans = spans_once(exporter, closed())
    (only,) = turn_spans(spans)
    attributes = dict(only.attributes or {})
    assert attributes["ws_mode.warm_up"] is True
    assert attributes["gen_ai.response.id"] == warm["response"]["id"]
    assert seen.traceparent == []  # no handler call


def test_a_no_op_provider_turns_tracing_off_and_the_handler_sees_the_client_s_header() -> None:
    seen = Seen()
    middleware_provider = NoOpTracerProvider()
    app = WebSocketModeMiddleware(
        handler_app(middleware_provider, seen), tracer_provider=middleware_provider
    )
    assert app.settings.observer.tracing is None
    with serve(app) as base, connect(base, headers={"traceparent": TRACEPARENT}) as sock:
        turn(sock)
    assert seen.traceparent == [TRACEPARENT]


@pytest.mark.parametrize("bad", ["otel", 1, object()])
def test_a_tracer_provider_of_another_kind_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="tracer_provider"):
        WebSocketModeMiddleware(Starlette(), tracer_provider=bad)  # type: ignore[arg-type]


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout.strip()


def test_by_default_the_global_provider_is_used_once_an_sdk_is_installed() -> None:
    # In a fresh process: the global tracer provider is OpenTelemetry's proxy until the
    # application installs an SDK (no tracer: nothing to do per turn), then it is used, even
    # by a middleware made before.
    out = _run(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from starlette.applications import Starlette
        from ws_mode import WebSocketModeMiddleware
        middleware = WebSocketModeMiddleware(Starlette())
        tracing = middleware.settings.observer.tracing
        print(tracing.tracer() is None)
        trace.set_tracer_provider(TracerProvider())
        print(tracing.tracer() is not None)
        """
    )
    assert out.splitlines() == ["True", "True"]


def test_without_opentelemetry_the_middleware_traces_nothing_and_asks_for_the_extra() -> None:
    out = _run(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if opentelemetry-api were not installed
        from starlette.applications import Starlette
        from ws_mode import ConfigError, WebSocketModeMiddleware
        from ws_mode.proxy._app import ResponsesProxy
        middleware = WebSocketModeMiddleware(Starlette())
        print(middleware.settings.observer.tracing)
        try:
            WebSocketModeMiddleware(Starlette(), tracer_provider=type(
                "Provider", (), {"get_tracer": lambda self, *args: None})())
        except ConfigError as error:
            print("otel" in str(error))
        """
    )
    assert out.splitlines() == ["None", "True"]
