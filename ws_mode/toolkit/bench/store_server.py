"""The server side of the store benchmark: the reference server behind two middlewares, one
without a store and one with a Redis store, in its own process.

:mod:`ws_mode.toolkit.bench.store` starts it (``python -m ws_mode.toolkit.bench.store_server --redis
URL
--prefix P --fd N``, through :func:`ws_mode.testing._loopback.server_process`, which binds the
loopback socket and passes it down). It serves:

- WebSocket mode without a store at ``/off/v1/responses``, with a
  :class:`~ws_mode.redis_store.RedisStore` (keys under ``--prefix``) at ``/on/v1/responses``,
  both cache-aware (``--full-context on_miss``, the reference's renderer: the cheapest turns,
  where the store's share is largest) or both drop-in (``always``); plain HTTP
  ``POST /v1/responses`` goes through both to the reference app;
- ``GET /bench/stats``: both middlewares' counters (``middleware.stats``) and the process's
  CPU time.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any, Final

import orjson
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ws_mode._middleware import FullContext
from ws_mode.testing._loopback import add_child_arguments, serve_inherited, ws_max_size

__all__ = ["API_PATH", "BACKLOG", "PATHS", "STATS_PATH", "build_store_app", "main"]

API_PATH: Final = "/v1/responses"
#: The socket path of each mode: without a store, with the Redis store.
PATHS: Final = {"off": "/off/v1/responses", "on": "/on/v1/responses"}
STATS_PATH: Final = "/bench/stats"
#: The bench's records live this long in Redis if the run could not delete them.
TTL_SECONDS: Final = 3600.0
#: The listening socket's backlog: every socket of the throughput run connects at once.
BACKLOG: Final = 4096


def build_store_app(
    redis_url: str,
    prefix: str,
    full_context: FullContext = "on_miss",
    timeout: float = 1.0,
) -> ASGIApp:
    """The reference app behind a middleware without a store and one with a RedisStore on
    ``redis_url`` (keys under ``prefix``, each call bounded by ``timeout``), both drop-in
    (``always``) or both cache-aware (``on_miss``, with the reference's renderer), and the
    stats route."""
    from ws_mode._middleware import WebSocketModeMiddleware
    from ws_mode.redis_store import RedisStore

    from ..reference import ReferenceConfig, create_app, render_items

    # The tool calls come with each request (the reference's metadata override).
    reference = create_app(ReferenceConfig(tool_calls=0), path=API_PATH)
    store = RedisStore(redis_url, prefix=prefix, ttl_seconds=TTL_SECONDS, timeout=timeout)
    shared: dict[str, Any] = {"handler_path": API_PATH, "full_context": full_context}
    if full_context == "on_miss":
        shared["renderer"] = render_items
    # One tenant (the bench): the store's cost does not depend on whose scope a record is in.
    on = WebSocketModeMiddleware(
        reference, path=PATHS["on"], store=store, shared_store=True, **shared
    )
    off = WebSocketModeMiddleware(on, path=PATHS["off"], **shared)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == STATS_PATH:
            stats = {"on": on.stats.snapshot(), "off": off.stats.snapshot()}
            body = orjson.dumps({**stats, "cpu_seconds": time.process_time()})  # NaN: null
            answer = Response(body, media_type="application/json")
            await answer(scope, receive, send)
            return
        await off(scope, receive, send)

    return app


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ws_mode.toolkit.bench.store_server --redis URL --prefix P --fd N``: serve on the
    parent's socket."""
    parser = argparse.ArgumentParser(prog="python -m ws_mode.toolkit.bench.store_server")
    parser.add_argument("--redis", required=True, help="the Redis URL of the store")
    parser.add_argument("--prefix", required=True, help="the store's key prefix")
    parser.add_argument("--full-context", choices=("always", "on_miss"), default="on_miss")
    parser.add_argument("--store-timeout", type=float, default=2.0, help="RedisStore(timeout=)")
    add_child_arguments(parser)
    args = parser.parse_args(argv)
    # Warm what the first request would otherwise pay for: the tokenizer's training.
    from ..reference import render_items

    render_items([{"role": "user", "content": "warm up"}])
    serve_inherited(
        build_store_app(args.redis, args.prefix, args.full_context, args.store_timeout),
        args,
        access_log=False,
        ws_max_size=ws_max_size(),
        backlog=BACKLOG,
        timeout_graceful_shutdown=2,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
