"""The proxy ``ws-mode bench --proxy`` measures, in its own process.

``python -m ws_mode.toolkit.bench.proxy_server --upstream URL --speeds N --fd N`` (started by
:mod:`ws_mode.toolkit.bench.proxy` through :func:`ws_mode.toolkit.bench.control.measured_process`)
serves what ``ws-mode proxy`` serves (:mod:`ws_mode.toolkit.cli.proxy`):
:func:`ws_mode.proxy.create_proxy` behind :class:`~ws_mode.WebSocketModeMiddleware`
(``full_context="always"``, cache misses answered with an error, default limits), with uvicorn's
lifespan on so the proxy's httpx client opens on startup. The upstream is the bench's reference
server (:mod:`ws_mode.toolkit.bench.server`), given by its origin, so client paths go upstream
unchanged: for each model speed ``i``, WebSocket mode and HTTP at ``/s{i}/v1/responses``
(:func:`~ws_mode.toolkit.bench.server.mode_path`), forwarded to the same path upstream.

Unlike ``ws-mode proxy`` it logs no access line per request (uvicorn's log level is warning),
and it also serves the bench's stats and profile routes
(:func:`~ws_mode.toolkit.bench.server.control_routes`: the process's CPU time and peak RSS,
cProfile).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.types import ASGIApp

from ws_mode._limits import Limits
from ws_mode._middleware import WebSocketModeMiddleware
from ws_mode.testing._loopback import add_child_arguments, serve_inherited, ws_max_size

from .server import Dispatch, control_routes, mode_path, process_stats

__all__ = ["build_proxy_app", "main"]


def build_proxy_app(upstream: str, speeds: int) -> ASGIApp:
    """The proxy in front of ``upstream`` (an origin), with WebSocket mode at the path of each
    of ``speeds`` model speeds, and the bench's stats and profile routes under ``/bench/``."""
    from ws_mode.proxy import create_proxy

    limits = Limits()
    app: ASGIApp = create_proxy(upstream)
    for index in range(speeds):
        path = mode_path(index, "http")
        app = WebSocketModeMiddleware(
            app,
            path=path,
            handler_path=path,
            full_context="always",
            on_cache_miss="error",
            limits=limits,
        )

    def stats() -> dict[str, Any]:
        return {"references": [], **process_stats()}

    tools = Starlette(routes=control_routes(stats, lambda: None))
    return Dispatch([("/bench/", tools)], app)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ws_mode.toolkit.bench.proxy_server --upstream URL --speeds N --fd N``: serve the
    proxy on the parent's socket."""
    parser = argparse.ArgumentParser(prog="python -m ws_mode.toolkit.bench.proxy_server")
    parser.add_argument("--upstream", required=True, help="the upstream's origin")
    parser.add_argument("--speeds", type=int, default=1, help="model speeds the upstream serves")
    add_child_arguments(parser)
    args = parser.parse_args(argv)
    serve_inherited(
        build_proxy_app(args.upstream, args.speeds),
        args,
        lifespan="on",
        access_log=False,
        ws_max_size=ws_max_size(),
        timeout_graceful_shutdown=2,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
