"""`ws_mode.proxy.upstream`: the proxy's upstream URL, the headers that cross, and upstream
failures as OpenAI errors, checked without a network (the proxy end to end is `test_proxy.py`;
the upstream servers it runs are `proxy_upstream.py`)."""

from __future__ import annotations

import asyncio
import logging

import httpx
import orjson
import pytest
from starlette.types import Message

from ws_mode import ConfigError
from ws_mode.protocol import error_body
from ws_mode.proxy.upstream import (
    UpstreamFailure,
    answer_headers,
    check_upstream,
    log_failure,
)
from ws_mode.sse import SSEDecoder

REQUEST = httpx.Request("POST", "http://user:secret@upstream.internal:8000/v1/responses")


def test_check_upstream_normalizes_the_base_url() -> None:
    assert check_upstream(" http://host:8000/v1/ ") == "http://host:8000/v1"
    assert check_upstream("https://host") == "https://host"
    with pytest.raises(ConfigError, match="URL string"):
        check_upstream(b"http://host")
    with pytest.raises(ConfigError, match="query"):
        check_upstream("http://host/v1#top")


@pytest.mark.parametrize(
    ("encoding", "decoded"),
    [
        (None, False),
        ("identity", False),
        ("gzip", True),
        ("deflate, gzip", True),
        ("br", False),
        ("gzip, br", False),
    ],
)
def test_answer_headers_undo_only_the_encodings_httpx_decodes(
    encoding: str | None, decoded: bool
) -> None:
    raw = [
        ("content-type", "application/json"),
        ("content-length", "10"),
        ("date", "Mon, 01 Jan 2024 00:00:00 GMT"),
        ("server", "upstream"),
        ("x-request-id", "r1"),
    ]
    if encoding is not None:
        raw.append(("content-encoding", encoding))
    headers, decode = answer_headers(httpx.Response(200, headers=raw))
    assert decode is decoded
    names = [name for name, _ in headers]
    assert b"date" not in names
    assert b"server" not in names
    assert (b"x-request-id", b"r1") in headers
    assert (b"content-length" in names) is not decoded
    assert (b"content-encoding" in names) is (encoding is not None and not decoded)


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (httpx.ConnectTimeout("slow"), 504, "upstream_timeout"),
        (httpx.ReadTimeout("slow"), 504, "upstream_timeout"),
        (httpx.ConnectError("refused"), 502, "upstream_unreachable"),
        (httpx.UnsupportedProtocol("ftp"), 502, "upstream_unreachable"),
        (httpx.ReadError("reset"), 502, "upstream_error"),
        (httpx.RemoteProtocolError("cut"), 502, "upstream_error"),
    ],
)
def test_failures_map_to_statuses_and_codes(
    exc: httpx.RequestError, status: int, code: str
) -> None:
    exc.request = REQUEST
    failure = UpstreamFailure.of(exc)
    assert (failure.status, failure.code) == (status, code)
    assert type(exc).__name__ in failure.message
    assert "upstream.internal" not in failure.message  # the address stays in the log


def test_a_failure_ends_an_event_stream_with_a_flat_error_event() -> None:
    failure = UpstreamFailure(504, "upstream_timeout", "Too slow.")
    (event,) = SSEDecoder().feed(failure.sse_event())
    assert event.event == "error"
    assert orjson.loads(event.data) == {
        "type": "error",
        "status": 504,
        "code": "upstream_timeout",
        "message": "Too slow.",
        "param": None,
    }


def test_a_failure_answers_http_with_an_openai_error_body() -> None:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def gone(message: Message) -> None:
        raise OSError("the client went away")

    failure = UpstreamFailure(502, "upstream_unreachable", "Unreachable.")
    asyncio.run(failure.send(send))
    start, body = sent
    expected = error_body("server_error", "upstream_unreachable", "Unreachable.")
    assert body == {"type": "http.response.body", "body": expected}
    assert start["status"] == 502
    assert dict(start["headers"]) == {
        b"content-type": b"application/json",
        b"content-length": str(len(expected)).encode(),
    }
    asyncio.run(failure.send(gone))  # a client that left is not an error of the proxy's


def test_log_failure_names_the_upstream_without_its_credentials(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="ws_mode.proxy"):
        log_failure(httpx.ConnectError("refused"), REQUEST)
    (record,) = caplog.records
    assert record.name == "ws_mode.proxy"
    assert "upstream.internal:8000/v1/responses" in record.getMessage()
    assert "secret" not in record.getMessage()
