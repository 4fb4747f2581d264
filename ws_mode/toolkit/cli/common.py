"""What the ``ws-mode`` commands share: their error, their requirements, their paths, the store,
the foreground server.

:class:`CommandError` is the one-line failure a command exits 1 for; :class:`Requirements` the
modules a command imports and the extra that brings them; :func:`run_server` runs
uvicorn in the foreground for ``serve`` and ``proxy`` (their flags:
:func:`add_server_arguments`), draining WebSocket mode on shutdown and printing a banner once
bound; :func:`run_workers` runs several uvicorn worker processes on one socket instead, each
draining before it stops. :func:`check_store_works` asks the ``--store`` whether it works before
anything is served.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import logging
import os
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ws_mode import _access_log as access_log
from ws_mode import _logs as logs
from ws_mode._install import install_hint
from ws_mode._limits import Limits
from ws_mode._store import MemoryStore, ResponseStore, check_store
from ws_mode.testing._loopback import WS_IMPLEMENTATIONS, ws_max_size

from ..args import number, port

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp

__all__ = [
    "API_PATH",
    "CHECK_REQUIREMENTS",
    "CLI_REQUIREMENTS",
    "LOG_LEVELS",
    "PROG",
    "WS_IMPLEMENTATIONS",
    "CommandError",
    "Requirements",
    "add_server_arguments",
    "check_store_works",
    "environment",
    "limits_from_arguments",
    "run_server",
    "run_workers",
    "store_argument",
    "store_from_argument",
    "url_host",
]

PROG: Final = "ws-mode"
API_PATH: Final = "/v1/responses"
LOG_LEVELS: Final = ("critical", "error", "warning", "info", "debug", "trace")
#: The URL schemes ``--store`` takes for Redis: one server, a Redis Cluster, a Sentinel's master.
REDIS_SCHEMES: Final = (
    "redis://",
    "rediss://",
    "unix://",
    "redis+cluster://",
    "rediss+cluster://",
    "redis+sentinel://",
    "rediss+sentinel://",
)


class CommandError(Exception):
    """A failure the command reports in one line and exits non-zero for."""


@dataclass(frozen=True)
class Requirements:
    """The modules a command imports (none is imported to start the command line, so each
    command checks its own before it runs), and the extra of the package that brings them."""

    extra: str
    modules: tuple[str, ...]

    def missing(self) -> list[str]:
        """The modules not installed, in order."""
        return [name for name in self.modules if importlib.util.find_spec(name) is None]

    def install_hint(self) -> str:
        """How to install them."""
        return install_hint(self.extra)


#: What every command but ``proxy`` needs (the ``cli`` extra): the reference server (a
#: Starlette app with its tokenizer) under uvicorn, the clients, the display.
CLI_REQUIREMENTS: Final = Requirements(
    "cli", ("uvicorn", "httpx", "websockets", "rich", "starlette", "tokenizers")
)
#: What ``ws-mode check`` imports (the ``check`` extra): the socket client, nothing else; the
#: openai SDK, when installed, validates output items too.
CHECK_REQUIREMENTS: Final = Requirements("check", ("websockets",))


#: A socket's lifetime in seconds, as ``--max-connection-seconds`` takes it.
CONNECTION_SECONDS: Final = number(float, 0, strict=True)


def add_server_arguments(
    parser: argparse.ArgumentParser, *, store_type: Callable[[str], Any] | None = None
) -> None:
    """The flags of a command that serves in the foreground: ``--host``, ``--port``,
    ``--log-level``, ``--store``, ``--start-degraded``, ``--ws``, ``--ws-per-message-deflate``
    (:func:`run_server` and :func:`run_workers` read them), and the :class:`Limits` fields the
    commands expose (``--max-connection-seconds``; :func:`limits_from_arguments` reads them).
    ``--store`` gives a store (:func:`store_from_argument`), or what ``store_type`` makes of
    its text (:func:`store_argument` keeps the text)."""
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: %(default)s)"
    )
    parser.add_argument(
        "--port", type=port, default=8000, help="port to bind, 0 for any (default: %(default)s)"
    )
    parser.add_argument(
        "--log-level", choices=LOG_LEVELS, default="info", help="uvicorn's log level"
    )
    parser.add_argument(
        "--store",
        type=store_type or store_from_argument,
        default=None,
        metavar="memory|REDIS_URL",
        help="keep responses created with store: true beyond the socket, so a client can "
        "continue them after a reconnect or on another worker: in this process (memory) or "
        "in Redis (needs the redis extra): one Redis (redis://HOST:PORT/DB, rediss:// with "
        "TLS, unix:///PATH), a Redis Cluster (redis+cluster://HOST:PORT[,HOST:PORT...]) or "
        "the master Sentinels follow (redis+sentinel://HOST:26379[,...]/SERVICE[/DB]); "
        "?wait_replicas=N in the URL: a write counts once N replicas have it (not on a "
        "cluster); ?encryption_keys_env=NAME: records encrypted at rest with the keys in the "
        "environment variable NAME (base64, comma-separated, newest first; the encryption "
        "extra); docs/store.md (default: none)",
    )
    parser.add_argument(
        "--start-degraded",
        action="store_true",
        help="start even when the store does not work at startup (Redis unreachable, a "
        "wrong database or password, rediss:// against a Redis without TLS, a cluster node "
        "named as one Redis...): a loud warning instead of an error; until the store works, "
        "continuations missing from a socket's cache fail and no response is kept",
    )
    parser.add_argument(
        "--max-connection-seconds",
        type=CONNECTION_SECONDS,
        default=Limits().max_connection_seconds,
        metavar="S",
        help="close each socket after this long: websocket_connection_limit_reached, then a "
        "close with 1001 (default: %(default)g)",
    )
    parser.add_argument(
        "--ws",
        choices=tuple(WS_IMPLEMENTATIONS),
        default="batched",
        help="uvicorn's WebSocket implementation: batched is websockets-sansio writing the "
        "frames one pass of the event loop produces in one system call (default: %(default)s)",
    )
    parser.add_argument(
        "--ws-per-message-deflate",
        choices=("true", "false"),
        default="true",
        help="accept the permessage-deflate compression clients offer on the socket (the "
        "openai SDK does): fewer bytes down a slow link, more CPU per event frame; false for "
        "clients on the same host or network (default: %(default)s; docs/benchmarks.md)",
    )


def limits_from_arguments(args: argparse.Namespace) -> Limits:
    """The :class:`Limits` the flags of :func:`add_server_arguments` give (the others: their
    defaults)."""
    return Limits(max_connection_seconds=args.max_connection_seconds)


def store_argument(text: str) -> str:
    """A ``--store`` value checked (``memory``, or a Redis URL with redis-py installed), as
    given: for a store to be built later, or elsewhere (each worker process)."""
    if text == "memory":
        return text
    if is_redis_url(text):
        if importlib.util.find_spec("redis") is None:
            raise argparse.ArgumentTypeError(
                f"a Redis store needs the redis extra: {install_hint('redis')}"
            )
        from ws_mode._encryption import codec_of
        from ws_mode._redis_clients import store_options, url_kind

        try:
            url_kind(text)  # the URL's form: nothing is connected
            # The keys its encryption_keys_env names, read and checked (never shown).
            options = store_options(text)[1]
            codec_of(None, None, options.encryption_keys_env, options.read_plaintext)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        except ImportError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text
    schemes = ", ".join(REDIS_SCHEMES)
    shown = text if "@" not in text else text.split("://", 1)[0] + "://..."
    raise argparse.ArgumentTypeError(f"expected memory or a Redis URL ({schemes}), got {shown!r}")


def is_redis_url(text: str) -> bool:
    """Whether a ``--store`` value names a Redis store (shared by processes and hosts)."""
    return text.lower().startswith(REDIS_SCHEMES)


def store_from_argument(text: str) -> ResponseStore:
    """The store a ``--store`` value names (``memory``, or a Redis URL)."""
    if text == "memory":
        return MemoryStore()
    store_argument(text)  # raises, naming what is expected (never the URL's credentials)
    from ws_mode.redis_store import RedisStore

    return RedisStore(text)


def check_store_works(text: str | None, *, start_degraded: bool) -> None:
    """Before serving: ask the store ``--store`` names whether it works, and raise
    :class:`CommandError` naming the problem when it does not (the server's own startup asks
    again, and logs any warning). With ``--start-degraded`` nothing is asked here: the server
    starts, and warns."""
    if text is None or start_degraded:
        return

    async def ask() -> str | None:
        store = store_from_argument(text)
        try:
            problem, _warnings = await check_store(store, Limits().store_read_seconds)
        finally:
            await store.aclose()
        return problem

    problem = asyncio.run(ask())
    if problem is not None:
        raise CommandError(
            f"the store does not work: {problem} (to start anyway: --start-degraded)"
        )


@contextlib.contextmanager
def environment(variables: Mapping[str, str], names: Iterable[str] = ()) -> Iterator[None]:
    """``os.environ`` with ``variables`` set and the other ``names`` unset, restored on exit:
    what the worker processes of ``--workers N`` inherit."""
    saved = {name: os.environ.get(name) for name in {*names, *variables}}
    for name in saved:
        os.environ.pop(name, None)
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def url_host(host: str) -> str:
    """``host`` as it goes in a URL: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def run_server(
    app: ASGIApp,
    args: argparse.Namespace,
    limits: Limits,
    banner: Callable[[str], str],
    what: str,
    **config: Any,
) -> None:
    """Run ``app`` under uvicorn at ``args.host``/``args.port`` (``args.log_level``), draining
    WebSocket mode on shutdown; print ``banner(origin)`` once bound. ``config`` goes to
    ``uvicorn.Config`` (``ws`` and ``ws_per_message_deflate`` from ``--ws`` and
    ``--ws-per-message-deflate``). :class:`CommandError` when the
    ``what`` cannot start."""
    import uvicorn

    from ws_mode.server import Server

    host = url_host(args.host)
    port: int = args.port

    class AnnouncingServer(Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                print(banner(f"{host}:{_bound_port(self, port)}"), flush=True)

    settings = uvicorn.Config(
        app,
        host=args.host,
        port=port,
        log_level=args.log_level,
        ws_max_size=ws_max_size(limits),
        **{**_ws_config(args), **config},
    )
    show_access_log()
    try:
        AnnouncingServer(settings).run()
    except SystemExit as exc:  # uvicorn exits 1 when it cannot bind or start
        if exc.code:
            raise CommandError(f"the {what} could not start on {host}:{port}") from None
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the Ctrl-C it shut down for


def _ws_config(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn's WebSocket settings from ``--ws`` and ``--ws-per-message-deflate``."""
    return {
        "ws": WS_IMPLEMENTATIONS[getattr(args, "ws", "batched")],
        "ws_per_message_deflate": getattr(args, "ws_per_message_deflate", "true") == "true",
    }


def run_workers(
    target: str,
    args: argparse.Namespace,
    limits: Limits,
    banner: Callable[[str], str],
    what: str,
    **config: Any,
) -> None:
    """Run ``args.workers`` uvicorn worker processes serving the app factory ``target``
    (``"module:function"``, called in each worker) on one socket bound here at
    ``args.host``/``args.port``; print ``banner(origin)`` once bound. The workers inherit this
    process's environment, and uvicorn restarts one that dies; SIGHUP replaces them one at a
    time (a rolling restart). ``config`` goes to ``uvicorn.Config`` (``ws`` and
    ``ws_per_message_deflate`` from ``--ws`` and ``--ws-per-message-deflate``).
    :class:`CommandError` when the ``what`` cannot start.

    A worker told to stop (SIGHUP's restart, SIGTERM, the command's shutdown) stops accepting,
    then drains WebSocket mode like :func:`run_server` (running turns finish, sockets close
    with 1001): :mod:`.workers`.
    """
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE

    from .workers import DrainingSupervisor

    host = url_host(args.host)
    settings = uvicorn.Config(
        target,
        factory=True,
        workers=args.workers,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        ws_max_size=ws_max_size(limits),
        **{**_ws_config(args), **config},
    )
    try:
        listener = settings.bind_socket()
    except SystemExit:  # uvicorn exits when it cannot bind
        raise CommandError(f"the {what} could not start on {host}:{args.port}") from None
    with listener:
        listener.listen(settings.backlog)  # connections wait for the workers, never refused
        print(banner(f"{host}:{listener.getsockname()[1]}"), flush=True)
        supervisor = DrainingSupervisor(settings, sockets=[listener])
        with contextlib.suppress(KeyboardInterrupt):
            supervisor.run()
    if any(worker.exitcode == STARTUP_FAILURE for worker in supervisor.processes):
        raise CommandError(f"the {what}'s workers could not start on {host}:{args.port}")


def _bound_port(server: uvicorn.Server, default: int) -> int:
    """The port a started uvicorn server listens on (the chosen one when asked for 0)."""
    for listening in getattr(server, "servers", ()):  # set by startup()
        for listener in listening.sockets:
            port: int = listener.getsockname()[1]
            return port
    return default


def configure_logging() -> None:
    """What the command's processes print (a program, unlike the library, may configure
    logging): ws_mode's warnings on stderr in uvicorn's style, uvicorn's spurious line after
    ws_mode's refusals dropped. The warning that socket turns may miss middleware outside
    WebSocketModeMiddleware is not printed: the command serves the middleware itself, so
    nothing wraps it."""
    logs.show_on_stderr()
    logs.filter_uvicorn_refusals()
    logging.getLogger("ws_mode._stack").setLevel(logging.ERROR)


def show_access_log() -> None:
    """ws_mode's access log (a line per turn and per closed connection) on stdout beside
    uvicorn's, at the level ``--log-level`` gave uvicorn's access log (call it once uvicorn
    configured its logging: ``warning`` shows none)."""
    access_log.show_access_log(logging.getLogger("uvicorn.access").getEffectiveLevel())
