"""The ASGI middleware: sockets at `path` become WebSocket mode, everything else passes through."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from .connection import Connection
from .errors import ConfigError
from .limits import Limits

__all__ = ["FullContext", "Settings", "WebSocketModeMiddleware"]

logger = logging.getLogger(__name__)

FullContext = Literal["always", "on_miss"]


@dataclass(frozen=True, slots=True)
class Settings:
    """What every connection of one middleware shares; checked once, in `__init__`."""

    app: ASGIApp
    path: str
    handler_path: str
    full_context: FullContext
    limits: Limits


class WebSocketModeMiddleware:
    """Adds OpenAI's Responses API WebSocket mode to an app serving `POST /v1/responses`.

    A WebSocket opened at `path` becomes a WebSocket mode connection whose turns call the
    wrapped app in-process as `POST handler_path` requests; all other traffic (plain HTTP to
    the same path included, other socket paths, lifespan) reaches the app untouched.

    `full_context="always"` gives the handler the whole history on every turn (drop-in for
    stateless handlers); `"on_miss"` gives it only the new input plus `previous_response_id`
    when the parent is cached, and the cached state through `ws_mode.turn(request)`.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        path: str = "/v1/responses",
        handler_path: str | None = None,
        full_context: FullContext = "always",
        limits: Limits | None = None,
    ) -> None:
        if not isinstance(path, str) or not path.startswith("/"):
            raise ConfigError(f"path must be a string starting with '/', got {path!r}.")
        if handler_path is not None and (
            not isinstance(handler_path, str) or not handler_path.startswith("/")
        ):
            raise ConfigError(
                f"handler_path must be None or a string starting with '/', got {handler_path!r}."
            )
        if full_context not in ("always", "on_miss"):
            raise ConfigError(f"full_context must be 'always' or 'on_miss', got {full_context!r}.")
        if limits is None:
            limits = Limits()
        elif not isinstance(limits, Limits):
            raise ConfigError(f"limits must be a ws_mode.Limits, got {type(limits).__name__}.")
        self.app = app
        self.settings = Settings(
            app=app,
            path=path.rstrip("/") or "/",
            handler_path=handler_path or path,
            full_context=full_context,
            limits=limits,
        )
        self.connections = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket" or not self._is_socket_path(scope):
            await self.app(scope, receive, send)
            return
        message = await receive()
        if message["type"] != "websocket.connect":
            return  # the client left before the handshake finished
        if self.connections >= self.settings.limits.max_connections:
            await self._deny(scope, send)
            return
        self.connections += 1
        try:
            await Connection(self.settings, scope, receive, send).run()
        finally:
            self.connections -= 1

    def _is_socket_path(self, scope: Scope) -> bool:
        path: str = scope["path"]
        if path != "/" and path.endswith("/"):
            path = path[:-1]
        root_path: str = scope.get("root_path", "")
        wanted = self.settings.path
        return path == wanted or (bool(root_path) and path == root_path + wanted)

    async def _deny(self, scope: Scope, send: Send) -> None:
        """Refuse the upgrade: 426 lets clients such as Codex fall back to HTTP."""
        limit = self.settings.limits.max_connections
        logger.warning("refusing a WebSocket mode connection: %d are open", limit)
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1013})
            return
        body = orjson.dumps(
            {
                "error": {
                    "type": "invalid_request_error",
                    "code": "websocket_connection_limit_reached",
                    "message": f"This server already serves {limit} WebSocket mode "
                    "connections; use the HTTP API or retry later.",
                    "param": None,
                }
            }
        )
        await send(
            {
                "type": "websocket.http.response.start",
                "status": 426,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "websocket.http.response.body", "body": body})
