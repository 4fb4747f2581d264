"""``ws-mode serve --app MODULE:ATTRIBUTE``: your own app, served the way ``ws-mode serve``
serves the reference server.

The same server runner (:func:`~ws_mode.toolkit.cli.common.run_server`, or
:func:`~ws_mode.toolkit.cli.common.run_workers` with ``--workers N``): uvicorn with ws_mode's
batching WebSocket protocol, the collector tuned (:func:`ws_mode.tune_gc`), a drain on shutdown
that first stops accepting, rolling restarts on SIGHUP, and uvicorn's frame limit
(``--ws-max-size``) set above the ``Limits.max_message_bytes`` of the app's own
:class:`~ws_mode.WebSocketModeMiddleware` (found with :func:`ws_mode.find_middlewares`), so an
oversized message gets the middleware's error event rather than a close 1009.

The app is loaded here first (``--factory``: the named callable is called), to find its
middleware and fail before anything listens when it cannot be imported or has none; with
``--workers N`` each worker loads it again with :func:`app_from_environment`, an app factory
reading the ``WS_MODE_SERVE_APP*`` variables (:data:`ENVIRONMENT`) the command sets. The
reference server's own flags (``--store``, ``--tool-calls``...) do not apply: the app's
middleware is configured in its code.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Final

from ws_mode import _logs as logs
from ws_mode._errors import ConfigError
from ws_mode._limits import Limits
from ws_mode._middleware import find_middlewares

from .common import (
    API_PATH,
    PROG,
    CommandError,
    environment,
    run_server,
    run_workers,
    show_access_log,
)
from .metrics import metrics_banner, serve_metrics

__all__ = [
    "APP_FACTORY",
    "ENVIRONMENT",
    "REFERENCE_FLAGS",
    "add_app_arguments",
    "app_from_environment",
    "app_limits",
    "load_app",
    "serve_app",
]

#: The variables that tell each worker which app to load: ``--app``, ``--factory`` (``true``
#: or unset) and ``--app-dir``.
ENVIRONMENT: Final = {
    "app": "WS_MODE_SERVE_APP",
    "factory": "WS_MODE_SERVE_APP_FACTORY",
    "app_dir": "WS_MODE_SERVE_APP_DIR",
}
#: Where each worker's app comes from (uvicorn calls it in each worker).
APP_FACTORY: Final = "ws_mode.toolkit.cli.your_app:app_from_environment"

#: The flags of ``ws-mode serve`` that configure the reference server, by argparse ``dest``:
#: refused with ``--app``.
REFERENCE_FLAGS: Final = (
    "store",
    "start_degraded",
    "max_connection_seconds",
    "full_context",
    "tool_calls",
    "tokens_per_second",
    "rate_limited_model",
)


def add_app_arguments(serve: argparse.ArgumentParser) -> None:
    """Add ``--app``, ``--factory`` and ``--app-dir``."""
    group = serve.add_argument_group(
        "your own app",
        "serve your ASGI app instead of the reference server, with the same runner (workers, "
        "the drain, the batching protocol, the collector tuned); its WebSocketModeMiddleware's "
        "Limits set --ws-max-size",
    )
    group.add_argument(
        "--app",
        metavar="MODULE:ATTRIBUTE",
        default=None,
        help="the app to serve, as uvicorn names it (e.g. myproject.asgi:app); it must contain "
        "a WebSocketModeMiddleware",
    )
    group.add_argument(
        "--factory",
        action="store_true",
        help="--app names a function that returns the app (uvicorn's --factory)",
    )
    group.add_argument(
        "--app-dir",
        default=".",
        metavar="DIR",
        help="look for the app's module in this directory first (default: the current one)",
    )


def load_app(target: str, *, factory: bool, app_dir: str = ".") -> Any:
    """The app ``target`` (``module:attribute``) names, called when ``factory``; the module
    looked up in ``app_dir`` first, as uvicorn does. :class:`CommandError` when it cannot be
    loaded."""
    from uvicorn.importer import ImportFromStringError, import_from_string

    directory = os.path.abspath(app_dir)
    if directory not in sys.path:
        sys.path.insert(0, directory)  # multiprocessing's spawn gives the workers this path
    try:
        found = import_from_string(target)
    except ImportFromStringError as exc:
        raise CommandError(f"--app {target}: {exc}") from None
    except ConfigError as exc:
        # ws_mode's own refusal of a setting the app's module made (a store's malformed URL):
        # one line, as for the middleware's options; any other error keeps its traceback.
        raise CommandError(f"--app {target}: {exc}") from None
    if not factory:
        return found
    if not callable(found):
        raise CommandError(f"--app {target} --factory: {type(found).__name__} is not callable")
    return found()


def app_from_environment() -> Any:
    """The app of one worker of ``ws-mode serve --app ... --workers N``, loaded as the
    :data:`ENVIRONMENT` variables say; ws_mode's warnings and access log printed beside
    uvicorn's lines, as the command prints them."""
    logs.show_on_stderr()
    show_access_log()  # uvicorn configured the worker's logging before it called this
    return load_app(
        os.environ[ENVIRONMENT["app"]],
        factory=os.environ.get(ENVIRONMENT["factory"]) == "true",
        app_dir=os.environ.get(ENVIRONMENT["app_dir"], "."),
    )


def app_limits(app: Any, target: str) -> Limits:
    """The :class:`Limits` of the middleware in ``app`` that takes the largest messages (the
    frame limit must let every middleware's through). :class:`CommandError` when it has
    none."""
    try:
        middlewares = find_middlewares(app)
    except ConfigError as exc:
        # A bad option of the middleware, found while reading the stack: one line, in the
        # words uvicorn prints when its lifespan startup fails on it.
        raise CommandError(f"WebSocketModeMiddleware: {exc}") from None
    if not middlewares:
        raise CommandError(
            f"--app {target}: no WebSocketModeMiddleware found in it (add it: "
            "app.add_middleware(WebSocketModeMiddleware), or wrap the app in it)"
        )
    limits = [middleware.settings.limits for middleware in middlewares]
    return max(limits, key=lambda each: each.max_message_bytes)


def serve_app(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run ``ws-mode serve --app``: 2 (with a usage line) for a reference server's flag."""
    given = [dest for dest in REFERENCE_FLAGS if getattr(args, dest) != parser.get_default(dest)]
    if given:
        flags = ", ".join("--" + dest.replace("_", "-") for dest in given)
        parser.print_usage(sys.stderr)
        print(
            f"{parser.prog}: error: {flags}: for the reference server only; with --app, "
            "your WebSocketModeMiddleware takes its options in your code",
            file=sys.stderr,
        )
        return 2
    target: str = args.app
    workers: int = args.workers
    metrics: str | None = args.metrics
    if workers > 1 and metrics is not None:
        parser.print_usage(sys.stderr)
        print(
            f"{parser.prog}: error: --metrics cannot go with --workers {workers}: a scrape "
            "would reach one worker at random; run one process per port, each scraped",
            file=sys.stderr,
        )
        return 2
    app = load_app(target, factory=args.factory, app_dir=args.app_dir)
    limits = app_limits(app, target)
    shape = target + (f", {workers} workers" if workers > 1 else "")

    def banner(origin: str) -> str:
        return f"{PROG} serve: {shape}, WebSocket mode at ws://{origin}{API_PATH}"

    if workers == 1:
        run_server(
            serve_metrics(app, metrics), args, limits, metrics_banner(banner, metrics), "app"
        )
    else:
        variables = {
            ENVIRONMENT["app"]: target,
            ENVIRONMENT["factory"]: "true" if args.factory else "false",
            ENVIRONMENT["app_dir"]: os.path.abspath(args.app_dir),
        }
        with environment(variables):
            run_workers(APP_FACTORY, args, limits, banner, "app")
    return 0
