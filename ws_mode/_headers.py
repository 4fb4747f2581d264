"""Which request headers cross a hop: one rule for the in-process call and for the proxy.

Hop-by-hop headers (RFC 9110 §7.6.1: `Connection`, `Keep-Alive`, `Proxy-Authorization`, ...)
and every header the `Connection` header names belong to one connection and never cross, nor do
the WebSocket handshake's own (`Sec-WebSocket-*`). Each caller also drops the headers it sets
itself.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Final

from ._asgi import Scope

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
    dropped = _dropped(also_dropped if isinstance(also_dropped, tuple) else tuple(also_dropped))
    kept: list[tuple[bytes, bytes]] = []
    named: set[bytes] | None = None  # what a `Connection` header names
    for raw_name, raw_value in headers:
        name = bytes(raw_name).lower()
        value = bytes(raw_value)
        if name == b"connection":
            named = (named or set()) | {token.strip().lower() for token in value.split(b",")}
        if name not in dropped and not name.startswith(b"sec-websocket-"):
            kept.append((name, value))
    if named:
        kept = [(name, value) for name, value in kept if name not in named]
    return kept


@functools.lru_cache(maxsize=64)
def _dropped(also_dropped: tuple[bytes, ...]) -> frozenset[bytes]:
    return HOP_BY_HOP.union(also_dropped)


def header(scope: Scope, wanted: bytes) -> bytes | None:
    """The value of the request header `wanted` (lowercase), or None."""
    for name, value in scope.get("headers", ()):
        if name.lower() == wanted:
            return bytes(value)
    return None
