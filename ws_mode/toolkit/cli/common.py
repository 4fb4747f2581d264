"""What the ``ws-mode`` commands share: their error, their requirements, their paths, the
foreground server.

:class:`CommandError` is the one-line failure a command exits 1 for; :class:`Requirements` the
modules a command imports and the extra that brings them; :func:`run_server` runs
uvicorn in the foreground for ``serve`` and ``proxy`` (their flags:
:func:`add_server_arguments`), draining WebSocket mode on shutdown and printing a banner once
bound; :func:`run_workers` runs several uvicorn worker processes on one socket instead, each
draining before it stops.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ws_mode import _access_log as access_log
from ws_mode import _logs as logs
from ws_mode._install import install_hint
from ws_mode._limits import Limits
from ws_mode._store import MemoryStore, ResponseStore
from ws_mode.testing._loopback import UVICORN_WS, ws_max_size

from ..args import port

if TYPE_CHECKING:
    import uvicorn
    from starlette.types import ASGIApp

__all__ = [
    "API_PATH",
    "CLI_REQUIREMENTS",
    "LOG_LEVELS",
    "PROG",
    "CommandError",
    "Requirements",
    "add_server_arguments",
    "run_server",
    "run_workers",
    "store_argument",
    "store_from_argument",
    "url_host",
]

PROG: Final = "ws-mode"
API_PATH: Final = "/v1/responses"
LOG_LEVELS: Final = ("critical", "error", "warning", "info", "debug", "trace")


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


def add_server_arguments(
    parser: argparse.ArgumentParser, *, store_type: Callable[[str], Any] | None = None
) -> None:
    """The flags of a command that serves in the foreground: ``--host``, ``--port``,
    ``--log-level``, ``--store``. ``--store`` gives a store (:func:`store_from_argument`),
    or what ``store_type`` makes of its text (:func:`store_argument` keeps the text)."""
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
        metavar="memory|redis://HOST:PORT/DB",
        help="keep responses created with store: true beyond the socket, so a client can "
        "continue them after a reconnect or on another worker: in this process (memory) or "
        "in Redis (needs the redis extra) (default: none)",
    )


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
        return text
    raise argparse.ArgumentTypeError(f"expected memory or a redis:// URL, got {text!r}")


def is_redis_url(text: str) -> bool:
    """Whether a ``--store`` value names a Redis store (shared by processes and hosts)."""
    return text.startswith(("redis://", "rediss://", "unix://"))


def store_from_argument(text: str) -> ResponseStore:
    """The store a ``--store`` value names."""
    if store_argument(text) == "memory":
        return MemoryStore()
    from ws_mode.redis_store import RedisStore

    return RedisStore(text)


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
    ``uvicorn.Config`` (``ws`` defaults to ``UVICORN_WS``). :class:`CommandError` when the
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
        **{"ws": UVICORN_WS, **config},
    )
    show_access_log()
    try:
        AnnouncingServer(settings).run()
    except SystemExit as exc:  # uvicorn exits 1 when it cannot bind or start
        if exc.code:
            raise CommandError(f"the {what} could not start on {host}:{port}") from None
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the Ctrl-C it shut down for


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
    time (a rolling restart). ``config`` goes to ``uvicorn.Config`` (``ws`` defaults to
    ``UVICORN_WS``). :class:`CommandError` when the ``what`` cannot start.

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
        **{"ws": UVICORN_WS, **config},
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
