"""The load server's process: the reference server behind the middleware under uvicorn, with the
stats, reset and ping routes (:func:`build_load_app`); ``python -m benchmarks.load --serve`` runs
:func:`serve`. It imports what it needs on its own (the clients' modules stay out of its RSS)."""

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
from typing import TYPE_CHECKING, Any, Final

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from ws_mode._gc import tune_gc
from ws_mode._limits import Limits
from ws_mode._middleware import WebSocketModeMiddleware
from ws_mode.testing._loopback import (
    WS_IMPLEMENTATIONS,
    add_child_arguments,
    serve_inherited,
)
from ws_mode.toolkit.measure import memory, reset_peak_rss

if TYPE_CHECKING:
    pass


# ----------------------------------------------------------------------------- the server
# The load server's process runs `serve`. Besides the reference Responses server at
# SOCKET_PATH (WebSocket mode included), it answers GET STATS_PATH: its pid, its open sockets,
# its memory (ws_mode.toolkit.measure.memory), its CPU time, the middleware's counters, and how
# many distinct HTTP connections (client ports) sent it requests; POST RESET_PATH hands the
# memory the previous side freed back to the system and starts the peak RSS and that count over
# (before each side of the load); GET PING_PATH answers 204 (the HTTP side opens its keep-alive
# connections with it).


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
    the stats, reset and ping routes."""
    from ws_mode.toolkit.reference import ReferenceConfig, create_app, render_items

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


def serve(argv: Sequence[str]) -> int:
    """The load server's process: ``python -m benchmarks.load --serve --spec JSON
    --fd N`` (started by :func:`server_process`) serves :func:`build_load_app` on the parent's
    socket."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load --serve")
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--spec", required=True, help="the load's options as JSON")
    add_child_arguments(parser)
    args = parser.parse_args(argv)
    raise_file_limit()
    spec = json.loads(args.spec)
    app = build_load_app(spec)
    if spec.get("gc_threshold"):
        tune_gc(spec["gc_threshold"])  # as ws-mode serve's server does once started
    serve_inherited(
        app,
        args,
        ws=WS_IMPLEMENTATIONS[spec.get("ws", "batched")],
        backlog=BACKLOG,
        ws_max_size=64 * 1024 * 1024,
        timeout_keep_alive=60,
    )
    return 0
