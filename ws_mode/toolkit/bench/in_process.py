"""The middleware driven in-process, with no server and no socket, for the microbenchmarks
that call it directly (:mod:`.forward`, :mod:`.turns`, the deflate-threshold recording): the
scope of a WebSocket connection as a server would hand it over, the event loop uvicorn
would serve it on, and the permessage-deflate it would negotiate (framing compared with
websockets' own, in the deflate study and in the framing tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory

from ws_mode._budget import BUDGET_EXTENSION

__all__ = ["event_loop_runner", "socket_scope", "uvicorn_deflate"]

_T = TypeVar("_T")


def event_loop_runner() -> Callable[[Coroutine[Any, Any, _T]], _T]:
    """``uvloop.run`` when uvloop is installed (uvicorn then serves on it too), else
    ``asyncio.run``."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    run: Callable[[Coroutine[Any, Any, _T]], _T] = uvloop.run
    return run


def socket_scope(path: str) -> dict[str, Any]:
    """A fresh ASGI ``websocket`` scope for a connection to ``path`` on loopback."""
    return {
        "type": "websocket",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "scheme": "ws",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "subprotocols": [],
        # Whole messages, handed straight to the middleware: nothing held outside its budget
        # (as under ws_mode's protocol, which offers this extension).
        "extensions": {BUDGET_EXTENSION: {}},
    }


def uvicorn_deflate() -> ServerPerMessageDeflateFactory:
    """The permessage-deflate uvicorn's websockets-sansio protocol (and so
    ``BatchingWebSocketProtocol``) offers: 12-bit windows both ways, ``memLevel`` 5 (uvicorn
    builds it inline, with nothing to import)."""
    return ServerPerMessageDeflateFactory(
        server_max_window_bits=12,
        client_max_window_bits=12,
        compress_settings={"memLevel": 5},
    )
