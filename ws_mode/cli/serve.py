"""``ws-mode serve``: the reference Responses server with WebSocket mode, under uvicorn."""

from __future__ import annotations

import argparse

from ..limits import Limits
from ..middleware import FullContext, WebSocketModeMiddleware
from ..store import ResponseStore
from ..tools.args import number
from .common import API_PATH, PROG, add_server_arguments, run_server

__all__ = ["add_command", "build_app"]


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``serve`` and its flags."""
    serve = commands.add_parser(
        "serve",
        help="run the reference Responses server with WebSocket mode",
        description="Run the reference Responses server (a scripted, deterministic model) "
        "wrapped by WebSocketModeMiddleware under uvicorn: plain HTTP POST /v1/responses and "
        "WebSocket mode at ws://HOST:PORT/v1/responses.",
    )
    add_server_arguments(serve)
    serve.add_argument(
        "--full-context",
        choices=("always", "on_miss"),
        default="always",
        help="give the handler the whole history on every turn (always), or only the new "
        "items plus the cached Turn when the parent is cached (on_miss) (default: %(default)s)",
    )
    serve.add_argument(
        "--tool-calls",
        type=number(int, 0),
        default=3,
        help="tool calls the model asks for before it answers (default: %(default)s)",
    )
    serve.add_argument(
        "--tokens-per-second",
        type=number(float, 0),
        default=0.0,
        help="simulated generation speed, 0 for no delay (default: %(default)g)",
    )
    serve.add_argument(
        "--max-connection-seconds",
        type=number(float, 0, strict=True),
        default=Limits().max_connection_seconds,
        help="close each socket after this long (default: %(default)g)",
    )
    serve.set_defaults(run=_serve)


def build_app(
    *,
    tool_calls: int = 3,
    tokens_per_second: float = 0.0,
    full_context: FullContext = "always",
    limits: Limits | None = None,
    store: ResponseStore | None = None,
) -> WebSocketModeMiddleware:
    """The reference Responses server wrapped by the middleware, as ``ws-mode serve`` runs it.

    Its :class:`~ws_mode.reference.ReferenceStats` are on ``app.app.state.reference_stats``.
    """
    from ..reference import ReferenceConfig, create_app

    reference = create_app(
        ReferenceConfig(tool_calls=tool_calls, tokens_per_second=tokens_per_second)
    )
    return WebSocketModeMiddleware(reference, full_context=full_context, limits=limits, store=store)


def _serve(args: argparse.Namespace) -> int:
    limits = Limits(max_connection_seconds=args.max_connection_seconds)
    app = build_app(
        tool_calls=args.tool_calls,
        tokens_per_second=args.tokens_per_second,
        full_context=args.full_context,
        limits=limits,
        store=args.store,
    )
    full_context = args.full_context

    def banner(origin: str) -> str:
        return (
            f"{PROG} serve: WebSocket mode (full_context={full_context}) at "
            f"ws://{origin}{API_PATH}; openai SDK: "
            f'OpenAI(base_url="http://{origin}/v1", api_key="unused")'
        )

    run_server(app, args, limits, banner, "server")
    return 0
