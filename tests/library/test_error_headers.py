"""Rate-limit and retry headers of a handler's error answer reach the socket in `error.headers`.

A real handler on loopback answers 429 with OpenAI's rate-limit headers and some that must not
pass (a cookie, a challenge, a hop-by-hop header); the openai SDK and a raw websockets client
read the error event.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from openai import OpenAI
from openai.types.responses.responses_server_event import ResponseWsError
from starlette.types import Receive, Scope, Send
from websockets.sync.client import connect

from tests.integration.clients import sdk_recv
from tests.servers import serve
from ws_mode import WebSocketModeMiddleware
from ws_mode._headers import error_headers

RATE_LIMITS = {
    "retry-after": "7",
    "retry-after-ms": "6500",
    "x-ratelimit-limit-requests": "500",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-reset-requests": "7s",
    "x-ratelimit-limit-tokens": "30000",
    "x-ratelimit-remaining-tokens": "29000",
    "x-ratelimit-reset-tokens": "2ms",
    "x-request-id": "req_123",
    "openai-processing-ms": "12",
}
#: Headers of the same answer that never reach the error event.
WITHHELD = {
    "set-cookie": "session=secret",
    "www-authenticate": "Bearer",
    "authorization": "Bearer sk-leak",
    "keep-alive": "timeout=5",
    "x-internal": "yes",
}
BODY = {
    "error": {
        "type": "rate_limit_error",
        "code": "rate_limit_exceeded",
        "message": "Slow down.",
        "param": None,
    }
}


async def limited(scope: Scope, receive: Receive, send: Send) -> None:
    """A handler that answers every request 429, with rate-limit headers (in mixed case)."""
    if scope["type"] != "http":
        return
    await receive()
    body = json.dumps(BODY).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(name.title().encode(), value.encode()) for name, value in RATE_LIMITS.items()]
    headers += [(name.encode(), value.encode()) for name, value in WITHHELD.items()]
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve(WebSocketModeMiddleware(limited)) as url:
        yield url


def test_the_allow_list_keeps_rate_limits_and_drops_the_rest() -> None:
    raw = [(name.encode(), value.encode()) for name, value in {**RATE_LIMITS, **WITHHELD}.items()]
    raw += [(b"X-Codex-Primary-Used-Percent", b"90"), (b"x-ratelimit-limit-requests", b"600")]
    kept = error_headers(raw)
    assert set(kept) == {*RATE_LIMITS, "x-codex-primary-used-percent"}
    assert kept["x-ratelimit-limit-requests"] == "500, 600"  # a repeated header, joined
    assert error_headers([(b"content-type", b"application/json")]) == {}


def test_the_openai_sdk_reads_them_in_error_headers(base_url: str) -> None:
    client = OpenAI(base_url=base_url + "/v1", api_key="test", max_retries=0)
    with client.responses.connect() as connection:
        connection.send({"type": "response.create", "model": "m", "input": "hi"})
        event = sdk_recv(connection)
    assert isinstance(event, ResponseWsError)
    assert event.status == 429
    assert event.error.code == "rate_limit_exceeded"
    assert event.error.headers == RATE_LIMITS


def test_a_raw_client_reads_them_beside_the_error_too(base_url: str) -> None:
    with connect(base_url.replace("http", "ws", 1) + "/v1/responses") as socket:
        socket.send(json.dumps({"type": "response.create", "model": "m", "stream_id": "a"}))
        event = json.loads(socket.recv(timeout=10))
    assert event["type"] == "error"
    assert event["status"] == 429
    assert event["stream_id"] == "a"
    assert isinstance(event["sequence_number"], int)
    # OpenAI's schema (and its SDKs) read `error.headers`; Codex reads `headers`.
    assert event["error"]["headers"] == RATE_LIMITS
    assert event["headers"] == RATE_LIMITS
