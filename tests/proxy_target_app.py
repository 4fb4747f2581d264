"""The proxy that `tests/proxy/test_proxy_target.py` sends raw request-targets to, importable by a
server in a child process (daphne, granian) as `tests.proxy_target_app:app`.

Two proxies, each wrapped by the middleware as `ws-mode proxy` wraps it, behind one app that
picks by the `Host` header (the request-target is what the tests vary): `Host: portless` goes to
the proxy of an upstream URL that names no port, any other host to the one that does. The
settings come from the environment: `WS_MODE_TEST_UPSTREAM` and `WS_MODE_TEST_PORTLESS_UPSTREAM`
(the two upstream URLs), `WS_MODE_TEST_KEY` (the operator's `api_key`), `WS_MODE_TEST_CLIENT`
(`aiohttp`: the proxy's own client; `httpx`: an `httpx.AsyncClient` passed in).
"""

from __future__ import annotations

import os

import httpx

from ws_mode import WebSocketModeMiddleware
from ws_mode._asgi import ASGIApp, Receive, Scope, Send
from ws_mode._headers import header
from ws_mode.proxy import create_proxy

#: The `Host` header that picks the proxy of the upstream URL without a port.
PORTLESS_HOST = b"portless"


def proxied(upstream: str, key: str, client: str) -> WebSocketModeMiddleware:
    """The proxy to `upstream` holding the operator's `key`, through `client` (aiohttp or
    httpx), wrapped by the middleware with the proxy's handshake hook."""
    own = httpx.AsyncClient() if client == "httpx" else None
    proxy = create_proxy(upstream, api_key=key, client=own)
    return WebSocketModeMiddleware(proxy, handshake_headers=proxy.handshake_headers)


def make_app(upstream: str, portless: str, key: str, client: str) -> ASGIApp:
    """The two proxies behind one app, picked by the `Host` header."""
    with_port = proxied(upstream, key, client)
    without_port = proxied(portless, key, client)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await with_port(scope, receive, send)  # the proxies make their clients when used
            return
        chosen = without_port if header(scope, b"host") == PORTLESS_HOST else with_port
        await chosen(scope, receive, send)

    return app


if "WS_MODE_TEST_UPSTREAM" in os.environ:
    app = make_app(
        os.environ["WS_MODE_TEST_UPSTREAM"],
        os.environ["WS_MODE_TEST_PORTLESS_UPSTREAM"],
        os.environ["WS_MODE_TEST_KEY"],
        os.environ.get("WS_MODE_TEST_CLIENT", "aiohttp"),
    )
