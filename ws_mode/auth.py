"""Authentication at the handshake, and again while the socket is open.

The middleware calls `authenticate(scope)` before accepting a socket. The hook returns the
principal the connection's turns then carry (`Turn.principal`), or raises
`AuthenticationFailed` to refuse the upgrade with 401 or 403. A plain function runs in a
worker thread (`ws_mode.hooks`), so it may use Django's ORM or any blocking call. With
`reauthenticate_seconds` the hook runs again, on the same handshake, before a turn once that
long has passed (0: before every turn), so a revoked credential stops working on open sockets
too.

Browsers cannot set `Authorization` on a WebSocket upgrade; they can offer subprotocols. A
client may pass its token as a subprotocol `bearer.<token>` next to the protocol it speaks:
`bearer_token(scope)` finds the token in either place.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .asgi import Scope
from .errors import WSModeError
from .hooks import call_hook

__all__ = ["AuthenticationFailed", "Authenticator", "authenticate", "bearer_token"]

logger = logging.getLogger(__name__)

#: `authenticate(scope)`: returns the principal (any value) or raises `AuthenticationFailed`.
Authenticator = Callable[[Scope], Awaitable[Any] | Any]

TOKEN_SUBPROTOCOL_PREFIX = "bearer."


class AuthenticationFailed(WSModeError):
    """Refuses a WebSocket mode handshake: 401 (no or bad credentials) or 403 (not allowed)."""

    def __init__(self, message: str = "Invalid or missing credentials.", *, status: int = 401):
        if status not in (401, 403):
            raise ValueError(f"AuthenticationFailed status must be 401 or 403, got {status}.")
        super().__init__(message)
        self.message = message
        self.status = status


def bearer_token(scope: Scope, *, subprotocol_prefix: str = TOKEN_SUBPROTOCOL_PREFIX) -> str | None:
    """The bearer token of a handshake: from `Authorization: Bearer …`, else from a
    subprotocol `bearer.<token>` the client offered (browsers cannot set headers)."""
    headers: list[tuple[bytes, bytes]] = list(scope.get("headers", ()))
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    offers: list[str] = list(scope.get("subprotocols", ()))
    for offered in offers:
        if offered.startswith(subprotocol_prefix) and len(offered) > len(subprotocol_prefix):
            return offered[len(subprotocol_prefix) :]
    return None


async def authenticate(hook: Authenticator, scope: Scope) -> Any:
    """Run the hook on a handshake: the principal, or `AuthenticationFailed` (a hook that
    fails otherwise is logged and refuses with 500)."""
    try:
        principal = await call_hook(hook, scope)
    except AuthenticationFailed:
        raise
    except Exception as exc:
        logger.exception("the authenticate hook failed")
        failed = AuthenticationFailed("Authentication failed on the server.")
        failed.status = 500
        raise failed from exc
    return principal


def failure_code(exc: AuthenticationFailed) -> str:
    """The error code a refusal carries."""
    return {401: "invalid_api_key", 403: "forbidden"}.get(exc.status, "server_error")
