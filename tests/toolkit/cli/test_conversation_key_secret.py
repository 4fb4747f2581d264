"""`ws-mode proxy` reads the conversation key's secret from WS_MODE_CONVERSATION_KEY_SECRET:
two proxy processes given the same secret give a conversation seeded by the same
`prompt_cache_key` the same key upstream (as a fleet needs), one given another secret another.

Real `ws-mode proxy` processes, a real upstream on loopback (uvicorn) recording each request's
`x-session-id`, the kit's `websockets` client. The headers the key goes in are the proxy's
flags: `--conversation-key-header NAME` (repeatable), `--no-conversation-key`."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator

import pytest
from starlette.types import Receive, Scope, Send

from tests.servers import serve, ws_mode_proxy
from tests.store_kit import read_body
from ws_mode._conversation import SECRET_ENV
from ws_mode.testing._client import connect

SESSIONS: list[str] = []
#: Each request's headers.
HEADERS: list[dict[bytes, bytes]] = []


async def upstream(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    await read_body(receive)
    HEADERS.append(dict(scope["headers"]))
    SESSIONS.append(HEADERS[-1].get(b"x-session-id", b"").decode())
    response = {
        "id": "resp_" + secrets.token_hex(8),
        "object": "response",
        "status": "completed",
        "model": "up",
        "output": [],
    }
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps(response).encode()})


@pytest.fixture(scope="module")
def upstream_url() -> Iterator[str]:
    with serve(upstream) as url:
        yield url


def key_upstream(upstream_url: str, secret: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The key a conversation seeded by one `prompt_cache_key` gets through a `ws-mode proxy`
    process started with `secret` in the environment."""
    monkeypatch.setenv(SECRET_ENV, secret)
    with ws_mode_proxy("--upstream", upstream_url + "/v1") as proxy, connect(proxy.origin) as ws:
        ws.send({"type": "response.create", "model": "up", "prompt_cache_key": "project-1"})
        assert ws.receive_turn(timeout=30)[-1]["type"] == "response.completed"
    return SESSIONS[-1]


def test_proxies_sharing_the_secret_give_a_conversation_one_key(
    upstream_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet_secret = "the fleet's secret, shared by all"
    first = key_upstream(upstream_url, fleet_secret, monkeypatch)
    second = key_upstream(upstream_url, fleet_secret, monkeypatch)
    other = key_upstream(upstream_url, "another fleet's own secret", monkeypatch)
    assert len(first) == 32
    assert first == second
    assert other != first


def upstream_headers(upstream_url: str, *flags: str) -> dict[bytes, bytes]:
    """The headers of the request a `ws-mode proxy` process started with `flags` sends
    upstream for a socket's turn whose client sent `x-session-id: mine`."""
    command = ("--upstream", upstream_url + "/v1", *flags)
    with (
        ws_mode_proxy(*command) as proxy,
        connect(proxy.origin, headers={"x-session-id": "mine"}) as ws,
    ):
        ws.send({"type": "response.create", "model": "up"})
        assert ws.receive_turn(timeout=30)[-1]["type"] == "response.completed"
    return HEADERS[-1]


def test_the_key_goes_in_the_headers_the_flags_name(upstream_url: str) -> None:
    named = upstream_headers(
        upstream_url,
        "--conversation-key-header", "x-session-id",
        "--conversation-key-header", "x-smg-routing-key",
    )  # fmt: skip
    key = named[b"x-session-id"]
    assert len(key) == 32
    assert key != b"mine"
    assert named[b"x-smg-routing-key"] == key
    default = upstream_headers(upstream_url)
    assert len(default[b"x-session-id"]) == 32
    assert b"x-smg-routing-key" not in default
    # Off: no key; the client's own header passes as any other.
    off = upstream_headers(upstream_url, "--no-conversation-key")
    assert off[b"x-session-id"] == b"mine"
    assert b"x-smg-routing-key" not in off
