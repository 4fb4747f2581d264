"""Which request headers cross a hop: one rule for the in-process call and for the proxy.

Hop-by-hop headers (RFC 9110 §7.6.1: `Connection`, `Keep-Alive`, `Proxy-Authorization`, ...)
and every header the `Connection` header names belong to one connection and never cross, nor do
the WebSocket handshake's own (`Sec-WebSocket-*`). Each caller also drops the headers it sets
itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from .asgi import Scope

__all__ = ["HOP_BY_HOP", "end_to_end", "header"]

HOP_BY_HOP: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
    }
)


def end_to_end(
    headers: Iterable[tuple[bytes, bytes]], also_dropped: Iterable[bytes] = ()
) -> list[tuple[bytes, bytes]]:
    """`headers` (names lowercased) without the hop-by-hop ones, those their `Connection`
    header names, the WebSocket handshake's, and `also_dropped`."""
    pairs = [(bytes(name).lower(), bytes(value)) for name, value in headers]
    dropped = HOP_BY_HOP.union(also_dropped)
    for name, value in pairs:
        if name == b"connection":
            dropped = dropped.union(token.strip().lower() for token in value.split(b","))
    return [
        (name, value)
        for name, value in pairs
        if name not in dropped and not name.startswith(b"sec-websocket-")
    ]


def header(scope: Scope, wanted: bytes) -> bytes | None:
    """The value of the request header `wanted` (lowercase), or None."""
    for name, value in scope.get("headers", ()):
        if name.lower() == wanted:
            return bytes(value)
    return None
