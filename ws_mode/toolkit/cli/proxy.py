"""``ws-mode proxy``: WebSocket mode in front of a remote HTTP Responses server (docs/proxy.md).

The proxy itself is the library's :mod:`ws_mode.proxy`; this is its command: the flags, the
upstream key from the environment, uvicorn in the foreground.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from typing import Any, Final

from ws_mode._asgi import Scope
from ws_mode._auth import AuthenticationFailed, bearer_token
from ws_mode._middleware import WebSocketModeMiddleware

from ..args import number
from .common import (
    API_PATH,
    PROG,
    CommandError,
    Requirements,
    add_server_arguments,
    check_store_works,
    limits_from_arguments,
    run_server,
    store_argument,
    store_from_argument,
)
from .metrics import add_metrics_argument, metrics_banner, serve_metrics

__all__ = ["PROXY_REQUIREMENTS", "UPSTREAM_KEY_ENV", "add_command"]

UPSTREAM_KEY_ENV: Final = "WS_MODE_UPSTREAM_API_KEY"
#: What ``ws-mode proxy`` imports: uvicorn with its websockets-based WebSocket implementation,
#: and httpx (its timeouts; the upstream client when aiohttp, also in the extra, is missing).
PROXY_REQUIREMENTS: Final = Requirements("proxy", ("uvicorn", "websockets", "httpx"))


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``proxy`` and its flags."""
    proxy = commands.add_parser(
        "proxy",
        help="give WebSocket mode to a remote HTTP Responses server",
        description="Forward every HTTP request to an upstream Responses server (vLLM, Ollama, "
        "LiteLLM, OpenAI), streaming both ways, with WebSocket mode at "
        "ws://HOST:PORT/v1/responses in front. See docs/proxy.md.",
    )
    proxy.add_argument(
        "--upstream",
        required=True,
        metavar="URL",
        help="the upstream's base URL, like the openai SDK's base_url: "
        "http://localhost:8000/v1 stands for the client's /v1",
    )
    add_server_arguments(proxy, store_type=store_argument)
    proxy.add_argument(
        "--api-key",
        metavar="KEY",
        help=f"send 'Authorization: Bearer KEY' upstream instead of the client's own "
        f"(default: ${UPSTREAM_KEY_ENV}, else the client's header passes through)",
    )
    proxy.add_argument(
        "--full-context",
        choices=("always", "on_miss"),
        default="always",
        help="send the upstream the whole history on every turn (always), or only the new "
        "items plus previous_response_id when the parent is cached (on_miss: only for "
        "upstreams that store responses) (default: %(default)s)",
    )
    proxy.add_argument(
        "--forward-uncached",
        action="store_true",
        help="forward a previous_response_id the socket has not cached to the upstream, to "
        "resolve from its own store, instead of answering previous_response_not_found",
    )
    proxy.add_argument(
        "--store-scope",
        choices=("key", "shared"),
        help="with --store (required with it): whose stored responses a caller may continue. "
        "key: each client API key's own (the key is checked by the upstream on every turn; "
        "needs the client's key to reach it, so no --api-key); shared: every caller's (one "
        "tenant, or callers allowed to read each other's responses)",
    )
    proxy.add_argument(
        "--timeout",
        type=number(float, 0, strict=True),
        default=600.0,
        help="seconds to wait for the upstream on each read (default: %(default)g)",
    )
    proxy.add_argument(
        "--no-upstream-handshake",
        dest="upstream_handshake",
        action="store_false",
        help="open sockets without asking the upstream for its handshake headers (by default "
        "each handshake sends the upstream a HEAD with the client's headers, and its "
        "openai-*, x-codex-*, x-models-etag and x-reasoning-included headers go on the "
        "handshake's answer)",
    )
    proxy.add_argument(
        "--conversation-key-header",
        metavar="NAME",
        action="append",
        dest="conversation_key_headers",
        help="a request header every request sent upstream carries the conversation key in, "
        "for a router to keep a conversation on one replica (repeatable; default: "
        "x-session-id; docs/fleet.md)",
    )
    proxy.add_argument(
        "--no-conversation-key",
        dest="conversation_key",
        action="store_false",
        help="send the upstream no conversation key header (a client's header of that name "
        "then passes as any other)",
    )
    add_metrics_argument(proxy)
    proxy.set_defaults(run=_proxy, requirements=PROXY_REQUIREMENTS)


def _key_headers(args: argparse.Namespace) -> tuple[str, ...] | None:
    """The headers the conversation key goes in: ``--conversation-key-header``'s, the
    default's, or none with ``--no-conversation-key``."""
    if not args.conversation_key:
        if args.conversation_key_headers:
            raise CommandError("--no-conversation-key and --conversation-key-header conflict")
        return None
    if args.conversation_key_headers:
        return tuple(args.conversation_key_headers)
    return ("x-session-id",)


def _proxy(args: argparse.Namespace) -> int:
    import_servers_lean()
    import httpx

    from ws_mode._conversation import SECRET_ENV
    from ws_mode._errors import ConfigError
    from ws_mode.proxy import create_proxy
    from ws_mode.proxy._transport import aiohttp_installed

    api_key: str | None = args.api_key or os.environ.get(UPSTREAM_KEY_ENV) or None
    try:
        upstream = create_proxy(
            args.upstream,
            api_key=api_key,
            timeout=httpx.Timeout(args.timeout, connect=min(args.timeout, 10.0)),
        )
    except ConfigError as exc:
        raise CommandError(str(exc)) from None
    limits = limits_from_arguments(args)
    scoping, stored = _store_scoping(args, api_key)
    check_store_works(args.store, start_degraded=args.start_degraded)
    app = WebSocketModeMiddleware(
        upstream,
        full_context=args.full_context,
        on_cache_miss="forward" if args.forward_uncached else "error",
        limits=limits,
        store=store_from_argument(args.store) if args.store else None,
        start_degraded=args.start_degraded,
        handshake_headers=upstream.handshake_headers if args.upstream_handshake else None,
        conversation_key_secret=os.environ.get(SECRET_ENV) or None,
        conversation_key_headers=_key_headers(args),
        **scoping,
    )
    auth = "the configured key" if api_key else "the client's Authorization"
    # The SDK refuses to start without a key: any will do when the proxy sets its own.
    key_hint = '"unused"' if api_key else '"<the upstream\'s API key>"'
    slow = "" if aiohttp_installed() else " (aiohttp is not installed: httpx costs more CPU)"

    def banner(origin: str) -> str:
        return (
            f"{PROG} proxy: WebSocket mode at ws://{origin}{API_PATH}, forwarding to "
            f"{upstream.describe()} with {auth}{slow}{stored}; openai SDK: "
            f'OpenAI(base_url="http://{origin}/v1", api_key={key_hint})'
        )

    served = serve_metrics(app, args.metrics)
    run_server(
        served,
        args,
        limits,
        metrics_banner(banner, args.metrics),
        "proxy",
        lifespan="on",
    )
    return 0


#: Modules the libraries the proxy imports would import for features the proxy never uses, when
#: they happen to be installed (as with the ``cli`` extra): httpx's own command line client
#: (rich, pygments, click) and uvicorn's ``--reload`` file watcher (watchfiles, anyio). Both
#: libraries fall back when the import fails (``httpx.main`` becomes a stub, uvicorn's reloader
#: its stat-based one), so nothing the proxy runs changes: 4 MiB of the proxy process's 59.
_UNUSED_IMPORTS: Final = ("httpx._main", "watchfiles")


def import_servers_lean() -> None:
    """Import httpx and uvicorn without :data:`_UNUSED_IMPORTS` (a ``None`` in ``sys.modules``
    makes their import fail, and both libraries fall back), unless something imported those
    already; should a version of either need them after all, both are imported whole."""
    blocked = [
        name
        for name in _UNUSED_IMPORTS
        if name.partition(".")[0] not in sys.modules and name not in sys.modules
    ]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        import httpx
        import uvicorn
    except ImportError:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
        import httpx  # noqa: F401
        import uvicorn  # noqa: F401


def _store_scoping(args: argparse.Namespace, api_key: str | None) -> tuple[dict[str, Any], str]:
    """The middleware's keywords that say whose stored responses are whose (``--store-scope``),
    and what the banner says of it."""
    scope: str | None = args.store_scope
    if args.store is None:
        if scope is not None:
            raise CommandError("--store-scope needs --store")
        return {}, ""
    if scope is None:
        raise CommandError(
            "--store needs --store-scope: key (each client API key continues only its own "
            "stored responses) or shared (every caller may continue every stored response)"
        )
    if scope == "shared":
        return {"shared_store": True}, ", a store every caller shares"
    if api_key is not None:
        raise CommandError(
            "--store-scope key scopes stored responses by the client's API key, which the "
            "upstream must check: drop --api-key (and $" + UPSTREAM_KEY_ENV + "), or use "
            "--store-scope shared"
        )
    return {"authenticate": _client_key}, ", a store scoped by each client's API key"


def _client_key(scope: Scope) -> str:
    """The ``--store-scope key`` principal: a digest of the client's bearer token (never the
    token itself). The upstream checks the token on every forwarded turn; this only keeps one
    key's stored responses from another's."""
    token = bearer_token(scope)
    if token is None:
        raise AuthenticationFailed("Send your API key: Authorization: Bearer <key>.")
    return hashlib.sha256(token.encode()).hexdigest()
