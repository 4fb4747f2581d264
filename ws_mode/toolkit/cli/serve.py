"""``ws-mode serve``: the reference Responses server with WebSocket mode, under uvicorn (or
your own app, ``--app MODULE:ATTRIBUTE``, run the same way: :mod:`.your_app`).

One process by default (drained on shutdown, :func:`~ws_mode.toolkit.cli.common.run_server`).
With ``--workers N`` (N > 1), N uvicorn worker processes share one socket, each drained before
it stops, and SIGHUP restarts them one at a time (:mod:`~ws_mode.toolkit.cli.workers`); each
builds its app with :func:`app_from_environment` from the ``WS_MODE_SERVE_*`` environment
variables (:data:`ENVIRONMENT`), which the command sets from its flags. Any server that takes
an app factory can run the same app (uvicorn's own workers close their sockets with 1012
instead of draining), e.g.::

    WS_MODE_SERVE_STORE=redis://127.0.0.1:6379/0 \\
        uvicorn --factory ws_mode.toolkit.cli.serve:app_from_environment --workers 4
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, cast, get_args

from ws_mode import FullContext, WebSocketModeMiddleware
from ws_mode._limits import Limits
from ws_mode._store import ResponseStore

from ..args import number
from .common import (
    API_PATH,
    CONNECTION_SECONDS,
    PROG,
    add_server_arguments,
    check_store_works,
    configure_logging,
    environment,
    is_redis_url,
    limits_from_arguments,
    run_server,
    run_workers,
    show_access_log,
    store_argument,
    store_from_argument,
)
from .metrics import add_metrics_argument, metrics_banner, serve_metrics
from .your_app import add_app_arguments, serve_app

__all__ = ["ENVIRONMENT", "ServeSettings", "add_command", "app_from_environment", "build_app"]

#: The environment variables :func:`app_from_environment` reads, by setting; unset ones take
#: ``ws-mode serve``'s defaults.
ENVIRONMENT: Final = {
    "tool_calls": "WS_MODE_SERVE_TOOL_CALLS",
    "tokens_per_second": "WS_MODE_SERVE_TOKENS_PER_SECOND",
    "full_context": "WS_MODE_SERVE_FULL_CONTEXT",
    "max_connection_seconds": "WS_MODE_SERVE_MAX_CONNECTION_SECONDS",
    "store": "WS_MODE_SERVE_STORE",
    "start_degraded": "WS_MODE_SERVE_START_DEGRADED",
    "rate_limited_model": "WS_MODE_SERVE_RATE_LIMITED_MODEL",
}
#: Where each worker's app comes from (a factory: uvicorn calls it in each worker).
APP_FACTORY: Final = "ws_mode.toolkit.cli.serve:app_from_environment"

_TOOL_CALLS = number(int, 0)
_TOKENS_PER_SECOND = number(float, 0)
_FULL_CONTEXT: tuple[str, ...] = get_args(FullContext)


def _flag(text: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


@dataclass(frozen=True)
class ServeSettings:
    """What ``ws-mode serve`` serves: the reference model's script and speed, the middleware's
    ``full_context``, the sockets' lifetime, the store (``memory``, a Redis URL, or none),
    whether to start when the store does not work (``start_degraded``), and the model name
    answered with 429 (``rate_limited_model``)."""

    tool_calls: int = 3
    tokens_per_second: float = 0.0
    full_context: FullContext = "always"
    max_connection_seconds: float = Limits().max_connection_seconds
    store: str | None = None
    start_degraded: bool = False
    rate_limited_model: str | None = None

    @classmethod
    def from_arguments(cls, args: argparse.Namespace) -> ServeSettings:
        """The settings of ``ws-mode serve``'s parsed flags."""
        return cls(
            tool_calls=args.tool_calls,
            tokens_per_second=args.tokens_per_second,
            full_context=args.full_context,
            max_connection_seconds=args.max_connection_seconds,
            store=args.store,
            start_degraded=args.start_degraded,
            rate_limited_model=args.rate_limited_model,
        )

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> ServeSettings:
        """The settings the ``WS_MODE_SERVE_*`` variables of ``environ`` give (an unset one:
        the default); ValueError naming the variable when one is not valid."""
        return cls(
            tool_calls=_variable(environ, "tool_calls", _TOOL_CALLS),
            tokens_per_second=_variable(environ, "tokens_per_second", _TOKENS_PER_SECOND),
            full_context=_variable(environ, "full_context", _full_context),
            max_connection_seconds=_variable(environ, "max_connection_seconds", CONNECTION_SECONDS),
            store=_variable(environ, "store", store_argument),
            start_degraded=_variable(environ, "start_degraded", _flag),
            rate_limited_model=_variable(environ, "rate_limited_model", str),
        )

    def environment(self) -> dict[str, str]:
        """The ``WS_MODE_SERVE_*`` variables that give these settings (no store: unset)."""
        values = {
            "tool_calls": str(self.tool_calls),
            "tokens_per_second": repr(self.tokens_per_second),
            "full_context": self.full_context,
            "max_connection_seconds": repr(self.max_connection_seconds),
            "store": self.store,
            "start_degraded": "true" if self.start_degraded else "false",
            "rate_limited_model": self.rate_limited_model,
        }
        return {ENVIRONMENT[field]: value for field, value in values.items() if value is not None}

    def build(self) -> WebSocketModeMiddleware:
        """The app these settings describe (its store built here)."""
        return build_app(
            tool_calls=self.tool_calls,
            tokens_per_second=self.tokens_per_second,
            full_context=self.full_context,
            limits=Limits(max_connection_seconds=self.max_connection_seconds),
            store=store_from_argument(self.store) if self.store else None,
            start_degraded=self.start_degraded,
            rate_limited_model=self.rate_limited_model,
        )


DEFAULTS: Final = ServeSettings()


def _full_context(text: str) -> FullContext:
    for choice in get_args(FullContext):
        if text == choice:
            return cast(FullContext, choice)
    raise argparse.ArgumentTypeError(f"expected always or on_miss, got {text!r}")


def _variable(environ: Mapping[str, str], field: str, parse: Callable[[str], Any]) -> Any:
    """The setting ``field`` from its variable in ``environ`` parsed, or its default."""
    name = ENVIRONMENT[field]
    text = environ.get(name)
    if text is None:
        return getattr(DEFAULTS, field)
    try:
        return parse(text)
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"{name}: {exc}") from None


def app_from_environment() -> WebSocketModeMiddleware:
    """The app of one worker of ``ws-mode serve --workers N``, from the ``WS_MODE_SERVE_*``
    environment variables (:data:`ENVIRONMENT`): an app factory for any ASGI server. Like the
    command, it prints ws_mode's warnings in uvicorn's style (`ws_mode._logs`)."""
    configure_logging()  # each worker is a process of the command's own
    show_access_log()  # uvicorn configured the worker's logging before it called this
    return ServeSettings.from_environment(os.environ).build()


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``serve`` and its flags."""
    serve = commands.add_parser(
        "serve",
        help="run the reference Responses server with WebSocket mode",
        description="Run the reference Responses server (a scripted, deterministic model) "
        "wrapped by WebSocketModeMiddleware under uvicorn: plain HTTP POST /v1/responses and "
        "WebSocket mode at ws://HOST:PORT/v1/responses.",
    )
    add_server_arguments(serve, store_type=store_argument)
    serve.add_argument(
        "--full-context",
        choices=_FULL_CONTEXT,
        default=DEFAULTS.full_context,
        help="give the handler the whole history on every turn (always), or only the new "
        "items plus the cached Turn when the parent is cached (on_miss) (default: %(default)s)",
    )
    serve.add_argument(
        "--tool-calls",
        type=_TOOL_CALLS,
        default=DEFAULTS.tool_calls,
        help="tool calls the model asks for before it answers (default: %(default)s)",
    )
    serve.add_argument(
        "--tokens-per-second",
        type=_TOKENS_PER_SECOND,
        default=DEFAULTS.tokens_per_second,
        help="simulated generation speed, 0 for no delay (default: %(default)g)",
    )
    serve.add_argument(
        "--rate-limited-model",
        metavar="NAME",
        default=None,
        help="answer requests for this model with 429 and OpenAI's rate-limit headers "
        "(retry-after, x-ratelimit-*), to see what clients get (default: none)",
    )
    serve.add_argument(
        "--workers",
        type=number(int, 1),
        default=1,
        metavar="N",
        help="run N uvicorn worker processes on one socket; N > 1 needs --store redis://... "
        "(a memory store is per process: a conversation continued on another worker would "
        f"not be found). Each worker builds its app with {APP_FACTORY} from the variables "
        f"{', '.join(ENVIRONMENT.values())}, which the flags set (any server that takes an "
        "app factory can serve it so). SIGHUP restarts the workers one at a time; a worker "
        "that stops lets its running turns finish, then closes its sockets with 1001, and "
        "clients continue from the store on another worker (default: %(default)s)",
    )
    add_metrics_argument(serve)
    add_app_arguments(serve)
    serve.set_defaults(run=functools.partial(_serve, serve))


def build_app(
    *,
    tool_calls: int = 3,
    tokens_per_second: float = 0.0,
    full_context: FullContext = "always",
    limits: Limits | None = None,
    store: ResponseStore | None = None,
    start_degraded: bool = False,
    rate_limited_model: str | None = None,
) -> WebSocketModeMiddleware:
    """The reference Responses server wrapped by the middleware, as ``ws-mode serve`` runs it.

    The reference server authenticates nobody, so a ``store`` is shared by every caller
    (``shared_store=True``; the middleware warns so at startup). ``start_degraded`` starts it
    even when the store does not work (the middleware's own). Requests for
    ``rate_limited_model`` are answered with 429 and OpenAI's rate-limit headers.
    Its :class:`~ws_mode.toolkit.reference.ReferenceStats` are on ``app.app.state.reference_stats``.
    """
    from ws_mode._conversation import SECRET_ENV

    from ..reference import ReferenceConfig, create_app

    reference = create_app(
        ReferenceConfig(
            tool_calls=tool_calls,
            tokens_per_second=tokens_per_second,
            rate_limited_model=rate_limited_model,
        )
    )
    return WebSocketModeMiddleware(
        reference,
        full_context=full_context,
        limits=limits,
        store=store,
        shared_store=store is not None,  # no authentication: nobody to scope responses by
        start_degraded=start_degraded,
        conversation_key_secret=os.environ.get(SECRET_ENV) or None,
    )


def _serve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.app is not None:
        return serve_app(parser, args)
    if args.factory:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: --factory goes with --app", file=sys.stderr)
        return 2
    settings = ServeSettings.from_arguments(args)
    limits = limits_from_arguments(args)
    workers: int = args.workers
    if workers > 1 and not (settings.store and is_redis_url(settings.store)):
        parser.print_usage(sys.stderr)
        print(
            f"{parser.prog}: error: --workers {workers} needs --store redis://HOST:PORT/DB: "
            f"{'a memory store' if settings.store else 'without a store, the cache'} is per "
            "process, so a conversation continued on another worker would get "
            "previous_response_not_found",
            file=sys.stderr,
        )
        return 2
    metrics: str | None = args.metrics
    if workers > 1 and metrics is not None:
        parser.print_usage(sys.stderr)
        print(
            f"{parser.prog}: error: --metrics cannot go with --workers {workers}: each worker "
            "counts its own connections, and a scrape would reach one of them at random; run "
            "one ws-mode serve per port, each scraped",
            file=sys.stderr,
        )
        return 2
    check_store_works(settings.store, start_degraded=settings.start_degraded)
    full_context = settings.full_context
    shape = f"full_context={full_context}" + (f", {workers} workers" if workers > 1 else "")
    if settings.store:
        shape += ", a store every caller shares: no authentication"

    def banner(origin: str) -> str:
        return (
            f"{PROG} serve: WebSocket mode ({shape}) at "
            f"ws://{origin}{API_PATH}; openai SDK: "
            f'OpenAI(base_url="http://{origin}/v1", api_key="unused")'
        )

    if workers == 1:
        app = serve_metrics(settings.build(), metrics)
        run_server(app, args, limits, metrics_banner(banner, metrics), "server")
        return 0
    variables = settings.environment()
    with environment(variables, ENVIRONMENT.values()):
        ServeSettings.from_environment(os.environ)  # what each worker will read: valid
        run_workers(APP_FACTORY, args, limits, banner, "server")
    return 0
