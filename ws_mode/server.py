"""Serving with uvicorn, shut down gracefully.

uvicorn closes every WebSocket (code 1012) as soon as it starts shutting down, before the
application's lifespan shutdown runs, so the middleware cannot give running turns a grace
period from there. `Server` drains the middlewares first: running turns finish (up to
`Limits.shutdown_grace_seconds`), then sockets close with 1001 and clients reconnect, and
the store writes still under way land (each within its own timeout) before the process
exits. It also drops uvicorn's spurious error line after the upgrades ws_mode refused
(`RefusalLineFilter`, also exported here with `show_on_stderr` for programs that configure
uvicorn's logging themselves).

`BatchingWebSocketProtocol` is uvicorn's `websockets-sansio` WebSocket protocol with the frames
of one pass of the event loop written in one system call instead of one each (a turn's burst of
events), framing the application's messages itself and deflating only those of at least
`deflate_threshold` bytes: `uvicorn app:app --ws ws_mode.server:BatchingWebSocketProtocol`, or
`uvicorn.Config(app, ws=BatchingWebSocketProtocol)`. `ws-mode serve` and `ws-mode proxy` use it
by default.

`Server` also makes Python's garbage collector cheaper for a server holding many sockets
(`tune_gc`): under 1,000 sockets a quarter of the process's CPU went to full collections that
walked every socket's state again and again.
"""

from __future__ import annotations

import asyncio
import gc
import socket
from collections.abc import Sequence
from typing import Final

import uvicorn

from . import _logs as logs
from ._batching import BatchingWebSocketProtocol
from ._logs import RefusalLineFilter, show_on_stderr
from ._middleware import WebSocketModeMiddleware, find_middlewares

__all__ = [
    "GC_THRESHOLD",
    "BatchingWebSocketProtocol",
    "RefusalLineFilter",
    "Server",
    "find_middlewares",
    "show_on_stderr",
    "tune_gc",
]

#: The first generation's threshold `Server` gives Python's garbage collector: allocations
#: (less deallocations) between two young collections, against Python's 700.
GC_THRESHOLD: Final = 50_000


def tune_gc(threshold: int = GC_THRESHOLD) -> None:
    """Make Python's cyclic garbage collector cheaper for a long-running server.

    Everything alive now (the modules, the app) is moved out of the collector's sight
    (`gc.freeze()`: it lives as long as the process anyway), and young collections run every
    `threshold` allocations instead of every 700, so the objects of a turn are mostly freed by
    reference counting before a collection sees them, and fewer survive into the old
    generation, whose collections walk every live object (each socket's state, its cache).
    Reference counting still frees everything else at once; only cyclic garbage waits longer.
    Call it once the app is built, before serving; `Server` does at startup.
    """
    if threshold < 1:
        raise ValueError(f"the threshold must be at least 1, got {threshold}")
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(threshold, middle, old)


class Server(uvicorn.Server):
    """A `uvicorn.Server` that drains WebSocket mode before it shuts down.

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
        await asyncio.gather(*(middleware.drain() for middleware in self.middlewares))
        await super().shutdown(sockets)
