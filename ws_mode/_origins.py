"""Which web origins may open a socket: the defence against cross-site WebSocket hijacking.

Browsers send an `Origin` header on every WebSocket handshake and attach the site's cookies
whatever page opened the socket, so a page on another site could run turns with a visitor's
cookies. Clients that are not browsers (the openai SDKs, Codex, agents) send no `Origin` and are
never affected. A handshake that carries an `Origin` is accepted when that origin is the
server's own (its scheme-less host and port equal the handshake's `Host`), or is listed in
`allowed_origins`: exact origins (`https://app.example.com`), subdomain patterns
(`https://*.example.com`), or `*` for any.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

from ._asgi import Scope
from ._errors import ConfigError
from ._headers import header

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


class OriginPolicy:
    """Decides whether a handshake's `Origin` may open a socket."""

    __slots__ = ("_any", "_exact", "_suffixes")

    def __init__(self, allowed: Sequence[str]) -> None:
        if isinstance(allowed, str) or not all(isinstance(o, str) for o in allowed):
            raise ConfigError(f"allowed_origins must be a sequence of strings, got {allowed!r}.")
        self._any = "*" in allowed
        self._exact: set[str] = set()
        self._suffixes: list[tuple[str, str]] = []  # (scheme, ".example.com")
        for origin in allowed:
            if origin == "*":
                continue
            if origin == "null":
                self._exact.add("null")
                continue
            scheme, _, rest = origin.partition("://")
            if scheme not in _DEFAULT_PORTS or not rest or "/" in rest:
                raise ConfigError(
                    f"allowed_origins entries look like 'https://app.example.com', "
                    f"'https://*.example.com' or '*', got {origin!r}."
                )
            if rest.startswith("*."):
                self._suffixes.append((scheme, rest[1:].lower()))
            else:
                self._exact.add(_normal(origin))

    def allows(self, scope: Scope) -> bool:
        """Whether the handshake in `scope` may open a socket."""
        origin = _header(scope, b"origin")
        if origin is None or self._any:
            return True
        if origin == "null":
            return "null" in self._exact
        normal = _normal(origin)
        if normal in self._exact:
            return True
        parts = urlsplit(normal)
        host = _header(scope, b"host")
        if host is not None and parts.netloc == _netloc(parts.scheme, host.lower()):
            return True  # the server's own origin
        return any(
            parts.scheme == scheme and (parts.hostname or "").endswith(suffix)
            for scheme, suffix in self._suffixes
        )


def _header(scope: Scope, name: bytes) -> str | None:
    value = header(scope, name)
    return value.decode("latin-1").strip() if value is not None else None


def _normal(origin: str) -> str:
    """`scheme://host[:port]`, lower case, without the scheme's default port."""
    parts = urlsplit(origin.strip().lower())
    return f"{parts.scheme}://{_netloc(parts.scheme, parts.netloc)}"


def _netloc(scheme: str, netloc: str) -> str:
    default = _DEFAULT_PORTS.get(scheme)
    host, colon, port = netloc.rpartition(":")
    if colon and port.isdigit() and "]" not in port:
        return host if default is not None and int(port) == default else netloc
    return netloc
