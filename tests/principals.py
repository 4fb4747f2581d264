"""Authenticate hooks for tests of the store: principals that are plain `str` keys.

`by_bearer_token` takes the bearer token itself as the principal (a test's tenants are its
tokens). `Keys` is a hook over a set of valid keys, read from `x-api-key` or a bearer token,
whose answer a test can change while sockets are open (a key revoked, a key granted).
"""

from __future__ import annotations

import threading
from typing import Any

from ws_mode import AuthenticationFailed, bearer_token


def by_bearer_token(scope: dict[str, Any]) -> str:
    """The request's bearer token as its principal; 401 without one."""
    token = bearer_token(scope)
    if token is None:
        raise AuthenticationFailed()
    return token


class Keys:
    """An `authenticate` hook: the principal of a valid key (from `x-api-key`, else a bearer
    token) is the tenant it was granted to; any other key gets 401. `calls` counts the checks."""

    def __init__(self, **tenants: str) -> None:
        self._tenants = dict(tenants)  # key -> tenant
        self._lock = threading.Lock()
        self.calls = 0

    def revoke(self, key: str) -> None:
        with self._lock:
            del self._tenants[key]

    def grant(self, key: str, tenant: str) -> None:
        with self._lock:
            self._tenants[key] = tenant

    async def __call__(self, scope: dict[str, Any]) -> str:
        key = None
        for name, value in scope.get("headers", ()):
            if name == b"x-api-key":
                key = value.decode("latin-1")
        key = key or bearer_token(scope)
        with self._lock:
            self.calls += 1
            tenant = self._tenants.get(key) if key is not None else None
        if tenant is None:
            raise AuthenticationFailed("Invalid or missing API key.")
        return tenant
