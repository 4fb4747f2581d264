"""Authentication at the handshake, and again while the socket is open.

The middleware calls `authenticate(scope)` before accepting a socket. The hook returns the
principal the connection's turns then carry (`Turn.principal`), or raises
`AuthenticationFailed` to refuse the upgrade with 401 or 403. A plain function runs in a
worker thread (`ws_mode._hooks`), so it may use Django's ORM or any blocking call. With
`reauthenticate_seconds` the hook runs again, on the same handshake, once that long has
passed, before each piece of work (0: before every one): a create as it starts to run, a
`response.steer`, each successor turn a steer starts. A revoked credential stops working on
open sockets too, and a create queued before the revocation never runs after it.

Browsers cannot set `Authorization` on a WebSocket upgrade; they can offer subprotocols. A
client may pass its token as a subprotocol `bearer.<token>` next to the protocol it speaks:
`bearer_token(scope)` finds the token in either place.

What is kept for a principal beyond one socket (stored responses) and what is counted per
principal (`Limits.max_connections_per_client`) goes by its key, `principal_key(principal)`:
a `str`, `int` or `uuid.UUID` principal (or a tuple of them) is its own key; any other needs
the middleware's `principal_key=` function that maps it to a string. Nothing else is ever
turned into a key: the `str()` of an arbitrary object may print its address, which the
interpreter reuses for another object, so two tenants could share one key.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from . import _logs as logs
from ._asgi import Scope
from ._errors import WSModeError
from ._hooks import call_hook
from ._protocol import hook_failed_message

logger = logging.getLogger(__name__)

#: `authenticate(scope)`: returns the principal (any value) or raises `AuthenticationFailed`.
Authenticator = Callable[[Scope], Awaitable[Any] | Any]

#: `principal_key(principal)`: a string that names the caller, the same for the same caller on
#: every request and never the same for two callers (a user id, a tenant id).
PrincipalKey = Callable[[Any], str]

TOKEN_SUBPROTOCOL_PREFIX = "bearer."


class AuthenticationFailed(WSModeError):
    """Refuses a WebSocket mode handshake: 401 (no or bad credentials) or 403 (not allowed)."""

    def __init__(self, message: str = "Invalid or missing credentials.", *, status: int = 401):
        if status not in (401, 403):
            raise ValueError(f"AuthenticationFailed status must be 401 or 403, got {status}.")
        super().__init__(message)
        self.message = message
        self.status = status


class HookRefusal(AuthenticationFailed):
    """A hook that authorizes a request (`authenticate`, a `principal_key` function) raised:
    the request is refused with 500 `server_error`, `param` the hook's name (`hook`), and the
    log has the exception (`ws_mode._logs.hook_raised`)."""

    def __init__(self, hook: str) -> None:
        super().__init__(hook_failed_message(hook))
        self.status = 500
        self.hook = hook


class UnkeyedPrincipal(AuthenticationFailed):
    """A principal with no stable key, and no `principal_key` to give it one: the request is
    refused with 500 (the server's configuration is at fault, not the caller), and the log
    says how to fix it."""

    def __init__(self) -> None:
        super().__init__("Authentication failed on the server.")
        self.status = 500


_ADVICE = (
    "refusing a request: the authenticate hook returned %s, which has no stable key to scope "
    "stored responses and count connections by (the str() of an object may print a memory "
    "address that another object gets later). Return a str, int, uuid.UUID or a tuple of "
    "them from authenticate, or pass principal_key=lambda principal: <a str unique to that "
    "caller, such as str(principal.id)> to WebSocketModeMiddleware"
)


def principal_key(principal: Any, custom: PrincipalKey | None = None) -> str:
    """The stable key of `principal`: what its stored responses are kept under and its
    connections are counted by. `custom` (the middleware's `principal_key=`) maps any
    principal; without it a `str`, `int`, `uuid.UUID` or a tuple of them is its own key.
    Raise `UnkeyedPrincipal` (logged, with the fix) for anything else, None included.

    Keys of different types never meet: a str principal (or a `custom` key) "7" is
    `principal:7`, the int 7 `principal-int:7`."""
    if custom is not None:
        try:
            key = custom(principal)
        except Exception as exc:
            logs.hook_raised(logger, "principal_key", exc, "the request is refused with 500")
            raise HookRefusal("principal_key") from exc
        if not isinstance(key, str) or not key:
            logger.error(
                "refusing a request: principal_key returned %s for a %s principal; it must "
                "return a non-empty str",
                type(key).__name__,
                type(principal).__qualname__,
            )
            raise UnkeyedPrincipal()
        return "principal:" + key
    found = stable_key(principal)
    if found is None:
        logger.error(_ADVICE, "None" if principal is None else f"a {type(principal).__qualname__}")
        raise UnkeyedPrincipal()
    return found


def stable_key(principal: Any, custom: PrincipalKey | None = None) -> str | None:
    """`principal_key(principal, custom)`, or None where it would refuse; logs nothing (for
    callers that fall back on a scope of their own, as the conversation key does)."""
    if custom is not None:
        try:
            key = custom(principal)
        except Exception:
            return None
        return "principal:" + key if isinstance(key, str) and key else None
    if isinstance(principal, str):
        return "principal:" + str.__str__(principal)
    stable = _stable(principal)
    if stable is None:
        return None
    kind, value = stable
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return f"principal-{kind}:{text}"


def _stable(value: Any) -> tuple[str, Any] | None:
    """A value that is its own key, as its type and a JSON-able form; None for any other."""
    if isinstance(value, str):
        return "str", str.__str__(value)
    if isinstance(value, bool):  # True is an int, but names nobody
        return None
    if isinstance(value, int):
        return "int", str(int(value))
    if isinstance(value, uuid.UUID):
        return "uuid", value.hex
    if isinstance(value, tuple):
        parts = [_stable(part) for part in value]
        if any(part is None for part in parts):
            return None
        return "tuple", parts
    return None


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
    fails otherwise is logged and refuses with 500: `HookRefusal`)."""
    try:
        principal = await call_hook(hook, scope)
    except AuthenticationFailed:
        raise
    except Exception as exc:
        logs.hook_raised(logger, "authenticate", exc, "the request is refused with 500")
        raise HookRefusal("authenticate") from exc
    return principal


def challenge(exc: AuthenticationFailed) -> list[tuple[bytes, bytes]]:
    """The headers a refusal carries: `WWW-Authenticate: Bearer` with a 401 (RFC 9110: a
    401 names the scheme that would be accepted)."""
    return [(b"www-authenticate", b"Bearer")] if exc.status == 401 else []


def failure_code(exc: AuthenticationFailed) -> str:
    """The error code a refusal carries."""
    return {401: "invalid_api_key", 403: "forbidden"}.get(exc.status, "server_error")


def failure_param(exc: AuthenticationFailed) -> str | None:
    """The `param` a refusal carries: the hook's name when a hook raised, else none."""
    return exc.hook if isinstance(exc, HookRefusal) else None
