"""Browsers from other sites cannot open a socket (cross-site WebSocket hijacking); clients
that send no Origin are unaffected."""

from __future__ import annotations

import pytest
from websockets.exceptions import InvalidStatus

from tests.integration.clients import Server, completed_response, create


@pytest.mark.parametrize(
    "origin", ["https://evil.example", "null", "http://app.example.com", "https://trusted.example"]
)
@pytest.mark.parametrize("prefix", ["", "/browser"])
def test_a_foreign_origin_is_refused_before_accept(
    server: Server, prefix: str, origin: str
) -> None:
    with pytest.raises(InvalidStatus) as refused, server.raw(prefix, headers={"Origin": origin}):
        pass
    if server.name != "daphne":  # daphne has no denial responses: it answers 403 itself
        assert refused.value.response.status_code == 403
        assert b"origin_not_allowed" in refused.value.response.body
    else:
        assert refused.value.response.status_code == 403


@pytest.mark.parametrize(
    ("prefix", "origin"),
    [
        ("", None),  # not a browser
        ("/browser", None),
        ("/browser", "https://app.example.com"),
        ("/browser", "https://APP.example.com:443"),
        ("/browser", "https://eu.trusted.example"),
    ],
)
def test_allowed_origins_and_clients_without_one_are_served(
    server: Server, tag: str, prefix: str, origin: str | None
) -> None:
    headers = {"Origin": origin} if origin else None
    with server.raw(prefix, headers=headers) as ws:
        ws.send(create(tag, input="Hi"))
        completed_response(ws.until_terminal())


def test_the_servers_own_origin_is_served(server: Server, tag: str) -> None:
    own = server.base_url  # http://127.0.0.1:PORT, what a page served by this app sends
    with server.raw(headers={"Origin": own}) as ws:
        ws.send(create(tag, input="Hi"))
        completed_response(ws.until_terminal())
