"""`ws_mode.proxy._upstream` and `ws_mode.proxy._transport`: the proxy's upstream URL, the headers
that cross, compressed answers undone, and upstream failures as OpenAI errors, for both HTTP
clients (aiohttp, httpx) against tiny raw servers on loopback (the proxy end to end is
`test_proxy.py`; the upstream servers it runs are `proxy_upstream.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest
from starlette.types import Message

from ws_mode import ConfigError
from ws_mode._protocol import error_body
from ws_mode._sse import SSEDecoder
from ws_mode.proxy import _transport as transport_module
from ws_mode.proxy._transport import (
    AiohttpTransport,
    HttpxTransport,
    Transport,
    aiohttp_installed,
    transport_for,
)
from ws_mode.proxy._upstream import (
    DEFAULT_TIMEOUT,
    BodyDecoder,
    UpstreamError,
    UpstreamFailure,
    answer_headers,
    check_upstream,
    log_failure,
)

AIOHTTP = aiohttp_installed()
TRANSPORTS = [
    pytest.param("aiohttp", marks=pytest.mark.skipif(not AIOHTTP, reason="aiohttp")),
    "httpx",
]
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


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
def test_answer_headers_undo_only_gzip_and_deflate(encoding: str | None, decoded: bool) -> None:
    raw = [
        (b"Content-Type", b"application/json"),
        (b"content-length", b"10"),
        (b"date", b"Mon, 01 Jan 2024 00:00:00 GMT"),
        (b"server", b"upstream"),
        (b"x-request-id", b"r1"),
        (b"transfer-encoding", b"chunked"),
    ]
    if encoding is not None:
        raw.append((b"Content-Encoding", encoding.encode()))
    headers, decoder = answer_headers(raw)
    assert (decoder is not None) is decoded
    names = [name for name, _ in headers]
    assert b"date" not in names
    assert b"server" not in names
    assert b"transfer-encoding" not in names  # hop-by-hop
    assert (b"x-request-id", b"r1") in headers
    assert (b"content-length" in names) is not decoded
    assert (b"content-encoding" in names) is (encoding is not None and not decoded)


def _raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(
    ("encodings", "encode"),
    [
        (["gzip"], gzip.compress),
        (["deflate"], zlib.compress),
        (["deflate"], _raw_deflate),
        (["deflate", "gzip"], lambda data: gzip.compress(zlib.compress(data))),
    ],
)
def test_the_body_decoder_undoes_encodings_chunk_by_chunk(
    encodings: list[str], encode: Callable[[bytes], bytes]
) -> None:
    data = b"".join(b'data: {"n": %d}\n\n' % n for n in range(2000))
    encoded = encode(data)
    decoder = BodyDecoder(encodings)
    pieces = [decoder.decode(encoded[i : i + 100]) for i in range(0, len(encoded), 100)]
    assert b"".join([*pieces, decoder.flush()]) == data
    assert len([piece for piece in pieces if piece]) > 1  # decoded as it came, not at the end


def test_a_failure_ends_an_event_stream_with_a_flat_error_event() -> None:
    failure = UpstreamFailure(504, "upstream_timeout", "Too slow.")
    ((name, data),) = SSEDecoder().feed(failure.sse_event())
    assert name == "error"
    assert orjson.loads(data) == {
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

    failure = UpstreamFailure.unreachable("ConnectError")
    asyncio.run(failure.send(send))
    start, body = sent
    expected = error_body("server_error", "upstream_unreachable", failure.message)
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
    error = UpstreamError(UpstreamFailure.unreachable("X"), ConnectionRefusedError("refused"))
    url = "http://user:secret@upstream.internal:8000/v1/responses"
    with caplog.at_level(logging.WARNING, logger="ws_mode.proxy"):
        log_failure(error, "POST", url)
    (record,) = caplog.records
    assert record.name == "ws_mode.proxy"
    assert "upstream.internal:8000/v1/responses" in record.getMessage()
    assert "refused" in record.getMessage()
    assert "secret" not in record.getMessage()


# ----------------------------------------------------------------------------- the clients


def test_the_default_client_is_aiohttp_else_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    async def made() -> tuple[type, type]:
        default = transport_for(None, DEFAULT_TIMEOUT)
        monkeypatch.setattr(transport_module, "aiohttp_installed", lambda: False)
        fallback = transport_for(None, DEFAULT_TIMEOUT)
        for transport in (default, fallback):
            await transport.aclose()
        return type(default), type(fallback)

    default = AiohttpTransport if AIOHTTP else HttpxTransport
    assert asyncio.run(made()) == (default, HttpxTransport)


def _transport(kind: str, timeout: float) -> Transport:
    limit = httpx.Timeout(timeout)
    if kind == "aiohttp":
        return AiohttpTransport(AiohttpTransport.new_session(limit))
    return HttpxTransport(HttpxTransport.new_client(limit))


async def _with_server(handler: Handler, kind: str, seconds: float, use: Any) -> Any:
    """Run ``use(transport, url)`` against a raw server on loopback answering with
    ``handler``; every connection is closed, and its handler ended, before returning."""
    connections: set[asyncio.Task[None]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        connections.add(task)
        try:
            await handler(reader, writer)
        except (asyncio.CancelledError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = _transport(kind, seconds)
    try:
        return await use(transport, f"http://127.0.0.1:{port}/v1/responses")
    finally:
        await transport.aclose()
        server.close()
        for task in connections:
            task.cancel()
        await asyncio.gather(*connections, return_exceptions=True)
        await server.wait_closed()


def origin_of(url: str) -> str:
    """``scheme://host:port`` of ``url``."""
    return url[: url.index("/", len("http://"))]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    """A request's head (its body read and dropped: by length, or chunk by chunk)."""
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":")[1]))
        elif line == b"transfer-encoding: chunked":
            while size := int(await reader.readuntil(b"\r\n"), 16):
                await reader.readexactly(size + 2)
            await reader.readuntil(b"\r\n")
    return head


async def _read_all(answer: Any) -> bytes:
    chunks = [chunk async for chunk in answer.chunks()]
    await answer.close()
    return b"".join(chunks)


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_an_upstream_nobody_listens_on_is_unreachable(kind: str) -> None:
    async def run() -> UpstreamFailure:
        listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        listener.close()
        await listener.wait_closed()
        transport = _transport(kind, 5.0)
        url = f"http://127.0.0.1:{port}/v1"
        try:
            with pytest.raises(UpstreamError) as raised:
                await transport.request("POST", url, [], b"{}", origin_of(url))
        finally:
            await transport.aclose()
        return raised.value.failure

    failure = asyncio.run(run())
    assert (failure.status, failure.code) == (502, "upstream_unreachable")


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_an_upstream_that_does_not_answer_in_time_is_a_timeout(kind: str) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(30)  # cancelled when the test is over

    async def use(transport: Transport, url: str) -> UpstreamFailure:
        with pytest.raises(UpstreamError) as raised:
            await transport.request("POST", url, [], b"{}", origin_of(url))
        return raised.value.failure

    failure = asyncio.run(_with_server(silent, kind, 0.3, use))
    assert (failure.status, failure.code) == (504, "upstream_timeout")


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_an_answer_that_breaks_off_is_an_upstream_error(kind: str) -> None:
    async def broken(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b'transfer-encoding: chunked\r\n\r\n10\r\ndata: {"a": 1}\n\n\r\n'
        )
        await writer.drain()  # then closed: no last chunk

    async def use(transport: Transport, url: str) -> tuple[list[bytes], UpstreamFailure]:
        answer = await transport.request("POST", url, [], b"{}", origin_of(url))
        got: list[bytes] = []
        chunks = answer.chunks()
        got.append(await anext(chunks))
        with pytest.raises(UpstreamError) as raised:
            await anext(chunks)
        await answer.close()
        return got, raised.value.failure

    got, failure = asyncio.run(_with_server(broken, kind, 5.0, use))
    assert b"".join(got) == b'data: {"a": 1}\n\n'
    assert (failure.status, failure.code) == (502, "upstream_error")


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_requests_go_up_as_given_and_answers_come_back_raw(kind: str) -> None:
    requests: list[bytes] = []
    compressed = gzip.compress(b"hello")

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not reader.at_eof():
            requests.append(await _read_request(reader))
            writer.write(
                b"HTTP/1.1 302 Found\r\nlocation: /elsewhere\r\nset-cookie: s=1; Path=/\r\n"
                b"content-encoding: gzip\r\ncontent-length: %d\r\n\r\n"
                % len(compressed)
                + compressed
            )
            await writer.drain()

    async def body() -> AsyncIterator[bytes]:
        yield b'{"a": '
        yield b"1}"

    async def use(transport: Transport, url: str) -> list[tuple[int, bytes]]:
        headers = [(b"x-custom", b"1"), (b"accept-encoding", b"identity")]
        answers = []
        for content in (b'{"a": 1}', body()):
            answer = await transport.request("POST", url, headers, content, origin_of(url))
            answers.append((answer.status, await _read_all(answer)))
        return answers

    answers = asyncio.run(_with_server(answer, kind, 5.0, use))
    # Redirects are not followed; the body comes undecoded (the proxy decodes it).
    assert answers == [(302, compressed), (302, compressed)]
    whole, streamed = (head.lower() for head in requests)
    assert b"x-custom: 1" in whole
    assert b"content-length: 8" in whole
    assert b"content-type" not in whole + streamed  # none sent, none made up
    assert b"transfer-encoding: chunked" in streamed  # a streamed body goes up as it comes
    assert b"cookie" not in streamed  # the first answer's cookie was not kept
