"""The proxy hands the trace context on: the upstream request carries the current span's
`traceparent` (a middleware turn's, or the application's own), recorded by a real upstream in
its own process; with no span current, the client's header passes through as it came."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext

from tests.proxy.test_proxy import KEY, headers_of, upstream_process, upstream_requests
from tests.servers import serve
from ws_mode import WebSocketModeMiddleware
from ws_mode.proxy import create_proxy
from ws_mode.testing._client import connect

CLIENT_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture(scope="module")
def storing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with upstream_process("storing", Path(tmp_path_factory.mktemp("logs")), key=KEY) as origin:
        yield origin


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    made = TracerProvider()
    made.add_span_processor(SimpleSpanProcessor(exporter))
    yield made
    made.shutdown()


def traceparent_of(context: SpanContext) -> str:
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def test_a_socket_turn_s_traceparent_reaches_the_upstream(
    storing: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tag = uuid.uuid4().hex
    app = WebSocketModeMiddleware(
        create_proxy(storing + "/v1", api_key=KEY), tracer_provider=provider
    )
    headers = {"traceparent": CLIENT_TRACEPARENT}
    with serve(app) as base, connect(base, headers=headers) as sock:
        sock.send(
            {"type": "response.create", "model": "m", "input": "hi", "metadata": {"tag": tag}}
        )
        assert sock.receive_turn(timeout=10)[-1]["type"] == "response.completed"
    (request,) = upstream_requests(storing, tag)
    (turn,) = [span for span in exporter.get_finished_spans() if span.name == "response.create"]
    sent = headers_of(request)["traceparent"]
    assert sent == traceparent_of(turn.context)
    assert sent.split("-")[1] == CLIENT_TRACEPARENT.split("-")[1]  # one trace, the client's


async def _post(app: object, tag: str, headers: dict[str, str]) -> int:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
        answer = await client.post(
            "/v1/responses",
            json={"model": "m", "input": "hi", "metadata": {"tag": tag}},
            headers=headers,
        )
        return answer.status_code


def test_plain_http_through_the_proxy_carries_the_current_span_or_the_client_s_header(
    storing: str, provider: TracerProvider
) -> None:
    proxy = create_proxy(storing + "/v1", api_key=KEY)
    tracer = provider.get_tracer("the-application")
    traced, untraced = uuid.uuid4().hex, uuid.uuid4().hex

    async def both() -> str:
        # As under an application's own server instrumentation: a span is current.
        with tracer.start_as_current_span("the application's request") as span:
            assert await _post(proxy, traced, {"traceparent": CLIENT_TRACEPARENT}) == 200
            context = span.get_span_context()
        assert await _post(proxy, untraced, {"traceparent": CLIENT_TRACEPARENT}) == 200
        await proxy.aclose()
        return traceparent_of(context)

    expected = asyncio.run(both())
    (with_span,) = upstream_requests(storing, traced)
    (without,) = upstream_requests(storing, untraced)
    assert headers_of(with_span)["traceparent"] == expected
    assert headers_of(without)["traceparent"] == CLIENT_TRACEPARENT
