"""`handshake_headers`: headers the application sets on the handshake's answer, and the one
the middleware sets itself (`x-ws-mode-full-context`, its mode).

Two middlewares on one real server: a sync hook that reads the principal, and an async one
that fails when asked to. A websockets client reads the upgrade's answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.types import Receive, Scope, Send
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.servers import SERVERS, serve
from ws_mode import WebSocketModeMiddleware
from ws_mode._auth import AuthenticationFailed
from ws_mode._errors import ConfigError
from ws_mode._headers import handshake_answer_headers
from ws_mode._hooks import is_async


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """Nothing is asked of the handler here."""


def who(scope: Scope) -> str:
    return "alice"


def sync_headers(scope: Scope, principal: Any) -> dict[str, str]:
    turn_state = dict(scope["headers"]).get(b"x-codex-turn-state", b"ts-new").decode()
    return {
        "OpenAI-Model": "gpt-test",
        "x-models-etag": "etag-1",
        "x-reasoning-included": "true",
        "x-codex-turn-state": turn_state,
        "x-principal": principal,
    }


async def async_headers(scope: Scope, principal: Any) -> list[tuple[bytes, bytes]]:
    if dict(scope["headers"]).get(b"x-break") == b"raise":
        raise RuntimeError("the model catalogue is down")
    if dict(scope["headers"]).get(b"x-break") == b"upgrade":
        return [(b"upgrade", b"h2c")]
    return [(b"openai-model", b"gpt-async"), (b"x-principal", repr(principal).encode())]


@pytest.fixture(scope="module")
def ws_url() -> Iterator[str]:
    inner = WebSocketModeMiddleware(app, path="/async", handshake_headers=async_headers)
    outer = WebSocketModeMiddleware(
        inner, path="/sync", authenticate=who, handshake_headers=sync_headers
    )
    assert is_async(async_headers)
    assert not is_async(sync_headers)
    with serve(outer) as url:
        yield url.replace("http", "ws", 1)


def test_a_sync_hook_sets_headers_from_the_scope_and_the_principal(ws_url: str) -> None:
    with connect(ws_url + "/sync", additional_headers={"x-codex-turn-state": "ts-7"}) as socket:
        headers = socket.response.headers
    assert headers["openai-model"] == "gpt-test"
    assert headers["x-models-etag"] == "etag-1"
    assert headers["x-reasoning-included"] == "true"
    assert headers["x-codex-turn-state"] == "ts-7"
    assert headers["x-principal"] == "alice"


def test_an_async_hook_sets_them_too_and_without_authenticate_the_principal_is_none(
    ws_url: str,
) -> None:
    with connect(ws_url + "/async") as socket:
        headers = socket.response.headers
    assert headers["openai-model"] == "gpt-async"
    assert headers["x-principal"] == "None"


@pytest.mark.parametrize("breaks", ["raise", "upgrade"])
def test_a_failing_hook_or_a_refused_name_refuses_the_upgrade_with_500(
    ws_url: str, breaks: str
) -> None:
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url + "/async", additional_headers={"x-break": breaks})
    assert refused.value.response.status_code == 500
    assert b"server_error" in refused.value.response.body


async def plain(scope: Scope, receive: Receive, send: Send) -> None:
    """Accepts any socket the middlewares pass on, and closes it: the server's own 101."""
    if scope["type"] == "websocket":
        await receive()
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": 1000})


def refuse_some(scope: Scope) -> str:
    if dict(scope["headers"]).get(b"x-deny") == b"1":
        raise AuthenticationFailed()
    return "alice"


@pytest.mark.parametrize("server", SERVERS)
def test_the_answer_names_the_mode_and_nothing_else(server: str) -> None:
    always = WebSocketModeMiddleware(plain, path="/always", authenticate=refuse_some)
    on_miss = WebSocketModeMiddleware(
        always,
        path="/on-miss",
        full_context="on_miss",
        authenticate=who,
        handshake_headers=sync_headers,
    )
    with serve(on_miss, server) as url:
        ws_url = url.replace("http", "ws", 1)
        with connect(ws_url + "/elsewhere") as socket:
            assert socket.response is not None
            bare = socket.response.headers
        answers = {}
        for path in ("/always", "/on-miss"):
            with connect(ws_url + path) as socket:
                assert socket.response is not None
                answers[path] = socket.response.headers
        with pytest.raises(InvalidStatus) as refused:
            connect(ws_url + "/always", additional_headers={"x-deny": "1"})
    assert answers["/always"]["x-ws-mode-full-context"] == "always"
    assert answers["/on-miss"]["x-ws-mode-full-context"] == "on_miss"
    assert answers["/on-miss"].get_all("x-ws-mode-full-context") == ["on_miss"]
    assert "x-ws-mode-full-context" not in bare  # not the middleware's socket
    # One header more than the server's own 101 (and the hook's), and it says only the mode.
    hooked = sync_headers({"headers": []}, "x")
    own = {name.lower() for name in bare} | {name.lower() for name in hooked}
    for headers in answers.values():
        assert {name.lower() for name in headers} - own == {"x-ws-mode-full-context"}
    # A refused upgrade says nothing of the mode.
    assert "x-ws-mode-full-context" not in refused.value.response.headers


def test_what_a_hook_may_return() -> None:
    assert handshake_answer_headers(None) == []
    assert handshake_answer_headers({"X-A": "1"}) == [(b"x-a", b"1")]
    assert handshake_answer_headers([("x-a", b"1"), (b"x-b", "2")]) == [
        (b"x-a", b"1"),
        (b"x-b", b"2"),
    ]
    for refused in (
        {"Connection": "close"},
        {"Sec-WebSocket-Accept": "x"},
        {"content-length": "0"},
        {"transfer-encoding": "chunked"},
        {"X-WS-Mode-Full-Context": "always"},
        {"bad name": "1"},
        {"x-a": "1\r\nx-b: 2"},
        {"x-a": "\u2603"},
        {"x-a": 1},
        "x-a: 1",
        [("x-a",)],
        42,
    ):
        with pytest.raises(ValueError, match="header"):
            handshake_answer_headers(refused)


def test_the_option_must_be_callable() -> None:
    with pytest.raises(ConfigError, match="handshake_headers"):
        WebSocketModeMiddleware(app, handshake_headers={"x-a": "1"})  # type: ignore[arg-type]
