"""Authentication at the handshake, the run-time switch, and clients that fall back to HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Scope
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.servers import SERVERS, serve
from ws_mode import AuthenticationFailed, WebSocketModeMiddleware, bearer_token, turn
from ws_mode._errors import ConfigError

KEYS = {"sk-alice": "alice", "sk-bob": "bob"}
BANNED = {"sk-mallory"}


async def authenticate(scope: Scope) -> str:
    token = bearer_token(scope)
    if token in BANNED:
        raise AuthenticationFailed("This key may not use WebSocket mode.", status=403)
    if token not in KEYS:
        raise AuthenticationFailed("Invalid API key.")
    return KEYS[token]


async def handler(request: Request) -> JSONResponse:
    current = turn(request)
    principal = current.principal if current is not None else "http"
    beta = request.headers.get("openai-beta")
    item = {
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": f"{principal} {beta}", "annotations": []}],
    }
    return JSONResponse(
        {
            "id": "resp_1",
            "object": "response",
            "status": "completed",
            "created_at": 0,
            "model": "m",
            "output": [item],
        }
    )


def broken(scope: Scope) -> None:
    raise RuntimeError("the identity service is down")


APP = Starlette(routes=[Route("/v1/responses", handler, methods=["POST"])])
AUTHED = WebSocketModeMiddleware(APP, authenticate=authenticate, subprotocols=("ws-mode",))
SWITCHABLE = WebSocketModeMiddleware(APP, path="/switch/v1/responses", handler_path="/v1/responses")
BROKEN = WebSocketModeMiddleware(
    APP, path="/broken/v1/responses", handler_path="/v1/responses", authenticate=broken
)


REVOKABLE: dict[str, str] = {}


def revocable(scope: Scope) -> str:
    token = bearer_token(scope) or ""
    if token not in REVOKABLE:
        raise AuthenticationFailed("This key was revoked.")
    return REVOKABLE[token]


RECHECKED = WebSocketModeMiddleware(
    APP,
    path="/recheck/v1/responses",
    handler_path="/v1/responses",
    authenticate=revocable,
    reauthenticate_seconds=0,
)


async def root(scope: Any, receive: Any, send: Any) -> None:
    path: str = scope.get("path", "")
    if path.startswith("/recheck"):
        await RECHECKED(scope, receive, send)
    elif path.startswith("/switch"):
        await SWITCHABLE(scope, receive, send)
    elif path.startswith("/broken"):
        await BROKEN(scope, receive, send)
    else:
        await AUTHED(scope, receive, send)


@pytest.fixture(scope="module", params=SERVERS)
def base_url(request: pytest.FixtureRequest) -> Iterator[str]:
    with serve(root, request.param) as url:
        yield url


def ws(base_url: str, path: str = "/v1/responses") -> str:
    return base_url.replace("http", "ws", 1) + path


def first_text(socket: Any) -> str:
    socket.send(json.dumps({"type": "response.create", "model": "m", "input": "hi"}))
    while True:
        event = json.loads(socket.recv(timeout=10))
        if event["type"] == "response.completed":
            text: str = event["response"]["output"][0]["content"][0]["text"]
            return text
        assert event["type"] != "error", event


def test_the_principal_reaches_every_turn_and_the_sdk_works(base_url: str) -> None:
    client = OpenAI(base_url=base_url + "/v1", api_key="sk-alice")
    with client.responses.connect(
        extra_headers={"OpenAI-Beta": "responses_websockets=2026-02-06"}
    ) as connection:
        for _ in range(2):
            connection.send({"type": "response.create", "model": "m", "input": "hi"})
            for event in connection:
                if event.type == "response.completed":
                    assert event.response.output[0].content[0].text == (  # type: ignore[union-attr]
                        "alice responses_websockets=2026-02-06"
                    )
                    break


@pytest.mark.parametrize(
    ("key", "status", "code"),
    [("sk-wrong", 401, "invalid_api_key"), ("sk-mallory", 403, "forbidden")],
)
def test_refused_upgrades_carry_the_status_and_an_error_body(
    base_url: str, key: str, status: int, code: str
) -> None:
    with pytest.raises(InvalidStatus) as refused:
        connect(ws(base_url), additional_headers={"Authorization": f"Bearer {key}"})
    assert refused.value.response.status_code == status
    assert json.loads(refused.value.response.body or b"")["error"]["code"] == code
    if status == 401:
        assert refused.value.response.headers["WWW-Authenticate"] == "Bearer"


def test_a_browser_passes_its_token_as_a_subprotocol(base_url: str) -> None:
    with connect(ws(base_url), subprotocols=["ws-mode", "bearer.sk-bob"]) as socket:  # type: ignore[list-item]
        assert socket.subprotocol == "ws-mode"
        assert first_text(socket) == "bob None"


def test_a_failing_hook_refuses_with_500(base_url: str) -> None:
    with pytest.raises(InvalidStatus) as refused:
        connect(ws(base_url, "/broken/v1/responses"))
    assert refused.value.response.status_code == 500


def test_switched_off_answers_426_so_clients_fall_back_to_http(base_url: str) -> None:
    SWITCHABLE.enabled = False
    try:
        with pytest.raises(InvalidStatus) as refused:
            connect(ws(base_url, "/switch/v1/responses"))
        assert refused.value.response.status_code == 426
        body = json.loads(refused.value.response.body or b"")
        assert body["error"]["code"] == "websocket_mode_disabled"
    finally:
        SWITCHABLE.enabled = True
    with connect(ws(base_url, "/switch/v1/responses")) as socket:
        assert first_text(socket) == "None None"


def test_bearer_token_reads_the_header_before_the_subprotocols() -> None:
    scope = {"headers": [(b"authorization", b"Bearer from-header")], "subprotocols": ["bearer.x"]}
    assert bearer_token(scope) == "from-header"
    assert bearer_token({"headers": [], "subprotocols": ["chat", "bearer.tok"]}) == "tok"
    assert bearer_token({"headers": [(b"authorization", b"Basic abc")]}) is None
    assert bearer_token({"headers": [], "subprotocols": ["bearer."]}) is None


def test_a_revoked_key_stops_working_on_an_open_socket(base_url: str) -> None:
    """With `reauthenticate_seconds=0` the hook runs before every turn: once the key is
    revoked the next turn gets a clear error and the socket closes (1008)."""
    REVOKABLE["sk-temp"] = "carol"
    headers = {"Authorization": "Bearer sk-temp"}
    with connect(ws(base_url, "/recheck/v1/responses"), additional_headers=headers) as socket:
        assert first_text(socket).startswith("carol")
        del REVOKABLE["sk-temp"]
        socket.send(json.dumps({"type": "response.create", "model": "m", "input": "hi"}))
        event = json.loads(socket.recv(timeout=10))
        assert event["type"] == "error"
        assert event["status"] == 401
        assert event["error"]["code"] == "invalid_api_key"
        with pytest.raises(ConnectionClosed) as closed:
            socket.recv(timeout=10)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1008


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="authenticate"):
        WebSocketModeMiddleware(APP, authenticate="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="subprotocols"):
        WebSocketModeMiddleware(APP, subprotocols="ws-mode")
    with pytest.raises(ValueError, match="401 or 403"):
        AuthenticationFailed(status=404)
    with pytest.raises(ConfigError, match="reauthenticate_seconds"):
        WebSocketModeMiddleware(APP, reauthenticate_seconds=60)  # no hook to run
    with pytest.raises(ConfigError, match="reauthenticate_seconds"):
        WebSocketModeMiddleware(APP, authenticate=authenticate, reauthenticate_seconds=-1)
