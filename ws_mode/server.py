"""Serving with uvicorn, shut down gracefully.

uvicorn closes every WebSocket (code 1012) as soon as it starts shutting down, before the
application's lifespan shutdown runs, so the middleware cannot give running turns a grace
period from there. `Server` drains the middlewares first: running turns finish (up to
`Limits.shutdown_grace_seconds`), then sockets close with 1001 and clients reconnect, and
the store writes still under way land (each within its own timeout) before the process
exits; a handler that ignores its cancellation holds it at most
`Limits.abandon_handler_seconds` more. Its listening sockets close before the drain begins,
so new connections are refused at TCP level and a load balancer sends them to another server
at once (an upgrade that got in just before is answered 503, which clients retry). It also
drops uvicorn's spurious error line after the upgrades ws_mode refused
(`RefusalLineFilter`, also exported here with `show_on_stderr` for programs that configure
uvicorn's logging themselves).

`BatchingWebSocketProtocol` is uvicorn's `websockets-sansio` WebSocket protocol with the frames
of one pass of the event loop written in one system call instead of one each (a turn's burst of
events), framing the application's messages itself and deflating only those of at least
`deflate_threshold` bytes: `uvicorn app:app --ws ws_mode.server:BatchingWebSocketProtocol`, or
`uvicorn.Config(app, ws=BatchingWebSocketProtocol)`. `ws-mode serve`, `ws-mode proxy` and
`Server` (when its configuration names no other) use it by default: it also counts what a
client is still sending in the middleware's memory budget, which uvicorn's own protocols hold
outside it.

`Server` also makes Python's garbage collector cheaper for a server holding many sockets
(`ws_mode.tune_gc`, which needs no uvicorn: call it under any server).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence

import uvicorn

from . import _logs as logs
from ._batching import BatchingWebSocketProtocol
from ._gc import GC_THRESHOLD, tune_gc
from ._logs import RefusalLineFilter, show_on_stderr
from ._middleware import WebSocketModeMiddleware, find_middlewares

__all__ = [
    "BatchingWebSocketProtocol",
    "RefusalLineFilter",
    "Server",
    "find_middlewares",
    "show_on_stderr",
]


class Server(uvicorn.Server):
    """A `uvicorn.Server` that stops accepting, then drains WebSocket mode, before it shuts
    down. It runs `BatchingWebSocketProtocol` unless the configuration names a WebSocket
    protocol (uvicorn's `ws`, `"auto"` by default).

    `middlewares` defaults to those found in the configured app (`find_middlewares`).
    Once started it calls `tune_gc(gc_threshold)`; `gc_threshold=None` leaves Python's
    garbage collector as it is.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        middlewares: Sequence[WebSocketModeMiddleware] | None = None,
        *,
        gc_threshold: int | None = GC_THRESHOLD,
    ) -> None:
        if gc_threshold is not None and gc_threshold < 1:
            raise ValueError(f"gc_threshold must be at least 1 or None, got {gc_threshold}")
        if config.ws == "auto":
            # uvicorn's default protocol holds a message still arriving outside the memory
            # budget; ws_mode's counts it. A protocol named on purpose is kept.
            config.ws = BatchingWebSocketProtocol
        super().__init__(config)
        self.gc_threshold = gc_threshold
        # uvicorn is started on purpose here, so its spurious line after a refusal is dropped.
        logs.filter_uvicorn_refusals()
        self.middlewares = (
            list(middlewares) if middlewares is not None else find_middlewares(config.app)
        )

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.gc_threshold is not None:
            tune_gc(self.gc_threshold)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Stop accepting, drain the middlewares, then uvicorn's own shutdown."""
        self.stop_accepting()
        await asyncio.gather(*(middleware.drain() for middleware in self.middlewares))
        await super().shutdown(sockets)

    def stop_accepting(self) -> None:
        """Close this process's listening sockets (uvicorn's shutdown closes them again,
        harmlessly). A draining middleware answers a new upgrade 503, which a client retries
        after a backoff; with nothing listening, a connection is refused, and a load balancer
        passes it to another server at once. Workers sharing one
        listening socket each close their own copy only: the others keep accepting."""
        for listening in getattr(self, "servers", ()):  # set by startup()
            listening.close()
