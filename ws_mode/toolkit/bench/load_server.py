"""The server side of the load test: the reference app behind the middleware, in its own process.

The load test starts this module as a subprocess (``python -m ws_mode.toolkit.bench.load_server
--spec JSON --fd N --lifetime S``, through :func:`ws_mode.testing._loopback.server_process`, which
binds the loopback socket and passes it down). Besides the reference Responses server at
``/v1/responses`` (WebSocket mode included), it answers ``GET /load/stats``: its pid, its open
sockets, its memory (:func:`ws_mode.toolkit.measure.memory`), its CPU time, the middleware's
counters, and how many distinct HTTP connections (client ports) sent it requests;
``POST /load/reset`` hands the memory the previous side freed back to the system (a garbage
collection, then glibc's ``malloc_trim`` where there is one) and starts the peak RSS and that
count over (before each side of the load);
``GET /load/ping`` answers 204 (the HTTP side opens its keep-alive connections with it).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import gc
import json
import os
import resource
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, Final

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from ws_mode._limits import Limits
from ws_mode._middleware import WebSocketModeMiddleware
from ws_mode.testing._loopback import add_child_arguments, serve_inherited

from ..measure import memory, reset_peak_rss

__all__ = [
    "PING_PATH",
    "RESET_PATH",
    "SOCKET_PATH",
    "STATS_PATH",
    "build_load_app",
    "main",
    "raise_file_limit",
]

STATS_PATH: Final = "/load/stats"
RESET_PATH: Final = "/load/reset"
PING_PATH: Final = "/load/ping"
SOCKET_PATH: Final = "/v1/responses"
BACKLOG: Final = 4096


def raise_file_limit() -> int:
    """Allow as many open files as the hard limit does (each socket is one); the soft limit
    now in force (-1: unlimited, or not known)."""
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return -1 if soft == resource.RLIM_INFINITY else int(soft)
    return -1


def release_memory() -> bool:
    """Collect garbage and give the free heap back to the system (glibc's ``malloc_trim``);
    False where there is no ``malloc_trim``."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
        return True
    return False


def build_load_app(spec: dict[str, Any]) -> ASGIApp:
    """The reference app behind the middleware as the spec (the load's options) sets it, and
    the stats route."""
    from ..reference import ReferenceConfig, create_app, render_items

    config = ReferenceConfig(
        tool_calls=int(spec["turns"]) - 1, tokens_per_second=float(spec["tokens_per_second"])
    )
    middleware = WebSocketModeMiddleware(
        create_app(config, path=SOCKET_PATH),
        full_context=spec["full_context"],
        renderer=render_items if spec["full_context"] == "on_miss" else None,
        limits=Limits(
            max_connections=int(spec["connections"]) + 16,
            max_cached_bytes=int(spec["max_cached_bytes"]),
            max_cached_responses=int(spec["max_cached_responses"]),
        ),
    )

    peers: set[Any] = set()  # the HTTP connections seen since the last reset

    def state() -> bytes:
        stats = getattr(middleware, "stats", None)
        return orjson.dumps(
            {
                "pid": os.getpid(),
                "connections": middleware.connections,
                "memory": asdict(memory()),
                "cpu_seconds": time.process_time(),
                "http_connections": len(peers),
                "stats": stats.snapshot() if stats is not None else {},
            }
        )

    async def answer(send: Send, status: int, body: bytes = b"") -> None:
        headers = [(b"content-type", b"application/json")] if body else []
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path == STATS_PATH:
                await answer(send, 200, state())
                return
            if path == RESET_PATH:
                peers.clear()
                trimmed = release_memory()
                reset = {"trimmed": trimmed, "peak_reset": reset_peak_rss()}
                await answer(send, 200, orjson.dumps(reset))
                return
            peers.add(tuple(scope.get("client") or ()))
            if path == PING_PATH:
                await answer(send, 204)
                return
        await middleware(scope, receive, send)

    return app


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ws_mode.toolkit.bench.load_server --spec JSON --fd N``: serve on the parent's
    socket."""
    parser = argparse.ArgumentParser(prog="python -m ws_mode.toolkit.bench.load_server")
    parser.add_argument("--spec", required=True, help="the load's options as JSON")
    add_child_arguments(parser)
    args = parser.parse_args(argv)
    raise_file_limit()
    serve_inherited(
        build_load_app(json.loads(args.spec)),
        args,
        backlog=BACKLOG,
        ws_max_size=64 * 1024 * 1024,
        timeout_keep_alive=60,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
