"""The `authenticate` hook of the private socket path: Django's own session authentication.

The middleware calls `authenticate(scope)` on every WebSocket handshake, before the socket is
accepted. It reads the session cookie the handshake carries (a browser sends it on its own, like
on any request to the site; other clients pass `Cookie: sessionid=...`) and asks Django's auth
which user that session is logged in as, through the ORM. The ORM is synchronous: under ASGI,
Django requires it to run off the event loop, which `asgiref.sync.sync_to_async` does (in the
one thread Django's own async views use for sync code). The user it returns is the principal
every turn of the socket carries (`ws_mode.turn(request).principal`); a handshake without a
logged-in session is refused with HTTP 401 before the socket opens.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user
from django.http import HttpRequest
from django.http.cookie import parse_cookie

from ws_mode import AuthenticationFailed


def session_user(session_key: str) -> Any | None:
    """The active user this session is logged in as, or None. Django's `get_user` does the
    checks a request would get: the session's auth hash (a password change logs it out), the
    backend, `is_active`."""
    request = HttpRequest()
    request.session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = get_user(request)  # type: ignore[arg-type]
    return user if user.is_authenticated else None


async def authenticate(scope: dict[str, Any]) -> Any:
    """The `authenticate` hook: the handshake's logged-in user, or `AuthenticationFailed`."""
    cookies: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            cookies.update(parse_cookie(value.decode("latin-1")))
    session_key = cookies.get(settings.SESSION_COOKIE_NAME)
    if not session_key:
        raise AuthenticationFailed("Log in first: the handshake carries no session cookie.")
    user = await sync_to_async(session_user)(session_key)
    if user is None:
        raise AuthenticationFailed("This session is not logged in (expired, or logged out).")
    return user
