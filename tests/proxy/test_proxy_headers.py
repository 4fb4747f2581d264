"""Through `ws_mode.proxy`: an upstream's rate limits reach the socket client in `error.headers`,
and its handshake headers reach the upgrade's answer.

A real upstream on loopback answers `HEAD` (the handshake's probe) with the headers Codex reads
on the upgrade, and every `POST` with 429 and OpenAI's rate-limit headers; the proxy, wrapped by
the middleware as `ws-mode proxy` wraps it, runs on another loopback server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from openai import OpenAI
from openai.types.responses.responses_server_event import ResponseWsError
from starlette.types import Receive, Scope, Send
from websockets.sync.client import connect

from tests.integration.clients import sdk_recv
from tests.servers import free_port, serve
from ws_mode import WebSocketModeMiddleware
from ws_mode.proxy import create_proxy

RATE_LIMITS = {
    "retry-after": "3",
    "x-ratelimit-limit-tokens": "30000",
    "x-ratelimit-remaining-tokens": "0",
    "x-ratelimit-reset-tokens": "3s",
    "x-request-id": "req_up",
}
#: The upstream's handshake headers that reach the upgrade's answer.
HANDSHAKE = {"openai-model": "gpt-up", "x-models-etag": "etag-up", "x-reasoning-included": "true"}
#: Headers of the upstream's answers that never reach a socket client.
WITHHELD = {"set-cookie": "upstream=secret", "www-authenticate": "Bearer", "x-internal": "yes"}


async def upstream(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    await receive()
    asked = dict(scope["headers"])
    if scope["method"] == "HEAD":
        # Codex's sticky-routing token: the one the client sent, or a new one.
        turn_state = asked.get(b"x-codex-turn-state", b"ts-new")
        headers = [(name.encode(), value.encode()) for name, value in HANDSHAKE.items()]
        headers += [(b"x-codex-turn-state", turn_state), (b"allow", b"POST")]
        headers += [(b"x-saw-authorization", asked.get(b"authorization", b"none"))]
        headers += [(name.encode(), value.encode()) for name, value in WITHHELD.items()]
        await send({"type": "http.response.start", "status": 405, "headers": headers})
        await send({"type": "http.response.body", "body": b""})
        return
    body = json.dumps(
        {"error": {"type": "requests", "code": "rate_limit_exceeded", "message": "Wait."}}
    ).encode()
    headers = [(b"content-type", b"application/json")]
    headers += [(b"x-codex-turn-state", asked.get(b"x-codex-turn-state", b"none"))]
    headers += [(name.encode(), value.encode()) for name, value in RATE_LIMITS.items()]
    headers += [(name.encode(), value.encode()) for name, value in WITHHELD.items()]
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def proxy_url() -> Iterator[str]:
    with serve(upstream) as upstream_url:
        proxy = create_proxy(upstream_url + "/v1", api_key="sk-proxy")
        with serve(
            WebSocketModeMiddleware(proxy, handshake_headers=proxy.handshake_headers),
            lifespan="on",
        ) as url:
            yield url


def test_the_upstreams_handshake_headers_reach_the_upgrades_answer(proxy_url: str) -> None:
    ws_url = proxy_url.replace("http", "ws", 1) + "/v1/responses"
    with connect(ws_url, additional_headers={"x-codex-turn-state": "ts-client"}) as socket:
        headers = socket.response.headers
    for name, value in HANDSHAKE.items():
        assert headers[name] == value
    assert headers["x-codex-turn-state"] == "ts-client"  # the probe carried the client's
    for name in (*WITHHELD, "allow", "x-saw-authorization"):
        assert name not in headers
    with connect(ws_url) as socket:
        assert socket.response.headers["x-codex-turn-state"] == "ts-new"


def test_the_turns_of_a_socket_carry_the_turn_state_the_client_sent(proxy_url: str) -> None:
    ws_url = proxy_url.replace("http", "ws", 1) + "/v1/responses"
    with connect(ws_url, additional_headers={"x-codex-turn-state": "ts-client"}) as socket:
        socket.send(json.dumps({"type": "response.create", "model": "m", "input": "hi"}))
        event = json.loads(socket.recv(timeout=10))
    assert event["error"]["headers"]["x-codex-turn-state"] == "ts-client"


def test_an_upstream_429_reaches_the_socket_with_its_rate_limits(proxy_url: str) -> None:
    with connect(proxy_url.replace("http", "ws", 1) + "/v1/responses") as socket:
        socket.send(json.dumps({"type": "response.create", "model": "m", "input": "hi"}))
        event = json.loads(socket.recv(timeout=10))
    assert event["type"] == "error"
    assert event["status"] == 429
    assert event["error"]["code"] == "rate_limit_exceeded"
    # The turn carried the turn-state the upstream issued at the handshake.
    assert event["error"]["headers"] == {**RATE_LIMITS, "x-codex-turn-state": "ts-new"}
    assert event["headers"] == event["error"]["headers"]


def test_the_openai_sdk_reads_the_upstreams_rate_limits(proxy_url: str) -> None:
    client = OpenAI(base_url=proxy_url + "/v1", api_key="unused", max_retries=0)
    with client.responses.connect() as connection:
        connection.send({"type": "response.create", "model": "m", "input": "hi"})
        event = sdk_recv(connection)
    assert isinstance(event, ResponseWsError)
    assert event.status == 429
    assert event.error.headers == {**RATE_LIMITS, "x-codex-turn-state": "ts-new"}


def test_plain_http_keeps_every_end_to_end_header(proxy_url: str) -> None:
    answer = httpx.post(proxy_url + "/v1/responses", json={"model": "m", "input": "hi"})
    assert answer.status_code == 429
    assert answer.headers["x-codex-turn-state"] == "none"
    for name, value in {**RATE_LIMITS, **WITHHELD}.items():
        assert answer.headers[name] == value


def test_an_unreachable_upstream_leaves_the_handshake_without_its_headers() -> None:
    proxy = create_proxy(f"http://127.0.0.1:{free_port()}/v1")
    app = WebSocketModeMiddleware(proxy, handshake_headers=proxy.handshake_headers)
    with (
        serve(app, lifespan="on") as url,
        connect(url.replace("http", "ws", 1) + "/v1/responses") as socket,
    ):
        assert "openai-model" not in socket.response.headers
