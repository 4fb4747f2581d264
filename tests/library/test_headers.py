"""One rule for the headers that cross a hop, shared by the in-process call and the proxy."""

from __future__ import annotations

from typing import Any

from ws_mode._handler_call import handler_headers
from ws_mode._headers import end_to_end, header
from ws_mode.proxy._upstream import REQUEST_DROPPED

HANDSHAKE = [
    (b"host", b"api.example.com"),
    (b"connection", b"Upgrade, X-Private"),
    (b"upgrade", b"websocket"),
    (b"x-private", b"1"),
    (b"proxy-authorization", b"Basic cHJveHk6c2VjcmV0"),
    (b"keep-alive", b"timeout=5"),
    (b"te", b"trailers"),
    (b"sec-websocket-key", b"abc"),
    (b"sec-websocket-version", b"13"),
    (b"authorization", b"Bearer sk"),
    (b"X-Tenant", b"acme"),
]


def test_end_to_end_drops_hop_by_hop_connection_named_and_handshake_headers() -> None:
    assert end_to_end(HANDSHAKE) == [
        (b"host", b"api.example.com"),
        (b"authorization", b"Bearer sk"),
        (b"x-tenant", b"acme"),
    ]
    assert end_to_end(HANDSHAKE, (b"host",)) == [
        (b"authorization", b"Bearer sk"),
        (b"x-tenant", b"acme"),
    ]


def test_the_handler_and_the_upstream_see_the_same_client_headers() -> None:
    """What the in-process call passes on of the client's headers is what the proxy would
    forward: neither passes hop-by-hop ones such as Proxy-Authorization on."""
    to_handler = {name for name, _ in handler_headers({"headers": HANDSHAKE})}
    to_upstream = {name for name, _ in end_to_end(HANDSHAKE, REQUEST_DROPPED)}
    assert to_handler - {b"host", b"content-type", b"accept"} == to_upstream
    assert b"proxy-authorization" not in to_handler
    assert b"x-private" not in to_handler


def test_header_reads_one_request_header() -> None:
    scope: dict[str, Any] = {"headers": [(b"content-length", b"42"), (b"x-a", b"b")]}
    assert header(scope, b"content-length") == b"42"
    assert header(scope, b"content-type") is None
    assert header({}, b"content-length") is None
