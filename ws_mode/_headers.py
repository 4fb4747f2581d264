"""Which headers cross a hop: one rule for the in-process call and for the proxy; which of an
error answer's headers its error event carries; what the application may set on the handshake.

Hop-by-hop headers (RFC 9110 §7.6.1: `Connection`, `Keep-Alive`, `Proxy-Authorization`, ...)
and every header the `Connection` header names belong to one connection and never cross, nor do
the WebSocket handshake's own (`Sec-WebSocket-*`). Each caller also drops the headers it sets
itself.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from ._asgi import Scope
from ._protocol import FULL_CONTEXT_HEADER

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


#: Response headers an error event carries in `error.headers` (OpenAI's `ErrorPayload`: "response
#: headers that were emitted with the error"), by name: on a socket they are the only way a
#: client sees when to retry.
ERROR_HEADER_NAMES: Final = frozenset({b"retry-after", b"retry-after-ms", b"x-request-id"})
#: ... and by prefix: rate limits (`x-ratelimit-limit-requests`, `-remaining-tokens`,
#: `-reset-requests`, ...), OpenAI's own (`openai-processing-ms`, `openai-version`, ...) and
#: Codex's (its usage limits, `x-codex-primary-used-percent`, ...). Nothing else passes: no
#: cookie, no credential or challenge, no hop-by-hop header.
ERROR_HEADER_PREFIXES: Final = (b"x-ratelimit-", b"openai-", b"x-codex-")


def error_headers(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The headers of an error answer an error event carries (`ERROR_HEADER_NAMES`,
    `ERROR_HEADER_PREFIXES`): lower-case names, values as text; a repeated header's values
    joined with `, ` (RFC 9110 §5.3)."""
    kept: dict[str, str] = {}
    for raw_name, raw_value in headers:
        name = bytes(raw_name).lower()
        if name in ERROR_HEADER_NAMES or name.startswith(ERROR_HEADER_PREFIXES):
            key = name.decode("latin-1")
            value = bytes(raw_value).decode("latin-1").strip()
            kept[key] = f"{kept[key]}, {value}" if key in kept else value
    return kept


#: Names the application may not set on the handshake's answer: the server writes the 101's
#: own (its hop-by-hop `Connection` and `Upgrade`, the `Sec-WebSocket-*` handshake) and it has
#: no body to frame; the middleware sets the mode's header itself.
_SERVER_SET: Final = HOP_BY_HOP | {b"content-length", FULL_CONTEXT_HEADER}
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")


def handshake_answer_headers(result: object) -> list[tuple[bytes, bytes]]:
    """What a `handshake_headers` hook returned (a mapping of names to values, an iterable of
    pairs, or None; `str` or `bytes` each) as the ASGI headers of `websocket.accept`: names
    lowercased. ValueError for a name that is no HTTP token or that the server sets itself
    (hop-by-hop, `Sec-WebSocket-*`, `Content-Length`, the middleware's
    `x-ws-mode-full-context`), and for a value with a line break, a
    NUL or a character outside Latin-1."""
    if result is None:
        return []
    if isinstance(result, Mapping):
        pairs: Iterable[Any] = result.items()
    elif isinstance(result, str | bytes) or not isinstance(result, Iterable):
        raise ValueError(
            "handshake_headers must return a mapping of header names to values, an iterable "
            f"of (name, value) pairs, or None; got {type(result).__name__}."
        )
    else:
        pairs = result
    headers: list[tuple[bytes, bytes]] = []
    for pair in pairs:
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise ValueError(f"handshake_headers gave {pair!r}, not a (name, value) pair.")
        name, value = (_latin1(part) for part in pair)
        name = name.lower()
        if not _TOKEN.match(name):
            raise ValueError(f"handshake_headers gave {pair[0]!r}, not a header name.")
        if name in _SERVER_SET or name.startswith(b"sec-websocket-"):
            raise ValueError(
                f"handshake_headers may not set {pair[0]!r}: the server sets it (hop-by-hop, "
                "Sec-WebSocket-* and Content-Length headers are the handshake's own, "
                "x-ws-mode-full-context the middleware's)."
            )
        if any(byte in value for byte in b"\r\n\0"):
            raise ValueError(f"handshake_headers gave {pair[0]!r} a value with a line break.")
        headers.append((name, value.strip()))
    return headers


def _latin1(part: object) -> bytes:
    if isinstance(part, bytes):
        return part
    if isinstance(part, str):
        try:
            return part.encode("latin-1")
        except UnicodeEncodeError:
            raise ValueError(f"header names and values are Latin-1 text, got {part!r}.") from None
    raise ValueError(f"header names and values are str or bytes, got {type(part).__name__}.")
