"""The one server runner: an ASGI app served on 127.0.0.1, on a socket bound first. The kit
serves the checked app with it; the toolkit and the test suite import it from here.

Both flavours bind the listening socket (:func:`bind_loopback`: 127.0.0.1, a port the OS picks)
before the server starts, so the port is known at once and never raced for:

- :class:`ServerThread` serves an app in a background thread of this process, with uvicorn or
  hypercorn (the compatibility kit, ``ws-mode demo``, the test suite);
- :func:`server_process` runs ``python -m MODULE`` in a child process and passes it the socket
  (``pass_fds``); the child builds its app and serves it with :func:`serve_inherited`. The child
  needs no working directory (it runs from an installed wheel) and prints nothing: the parent
  knows the port and waits for the first HTTP answer. The child ends by itself when the parent
  dies (:func:`exit_with_parent`).

Needs only the ``testing`` extra (uvicorn; hypercorn when asked for).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from .._asgi import ASGIApp
from .._budget import BUDGET_PROTOCOL
from .._limits import Limits

#: How often the servers started here ping their sockets, to find peers that vanished.
PING_SECONDS: Final = 20.0
#: uvicorn's WebSocket implementation for the servers started here and by the command line:
#: the one on websockets' Sans-I/O core (uvicorn's default since 0.50), its frames written in
#: batches, one system call for what one pass of the event loop sends
#: (:class:`ws_mode.server.BatchingWebSocketProtocol`). Named, not left to ``auto``, so that no
#: uvicorn the extras allow serves with its ``websockets`` implementation, which is built on
#: ``websockets.legacy`` (deprecated since websockets 14).
UVICORN_WS: Final = BUDGET_PROTOCOL
#: uvicorn's WebSocket implementations by the names ``--ws`` takes (``ws-mode serve``, ``ws-mode
#: proxy``, the benches): uvicorn's ``ws`` setting (not its deprecated ``websockets`` one), and
#: ``batched``, ours.
WS_IMPLEMENTATIONS: Final = {
    "batched": UVICORN_WS,
    "websockets-sansio": "websockets-sansio",
    "wsproto": "wsproto",
}


HOST: Final = "127.0.0.1"
ServerName = Literal["uvicorn", "hypercorn"]
SERVERS: tuple[ServerName, ...] = ("uvicorn", "hypercorn")

# Histories grow with every turn; servers' 16 MiB defaults are too small for long programs.
WS_MAX_SIZE = 256 * 1024 * 1024
START_TIMEOUT = 15.0
#: How far a server's frame limit sits above ``Limits.max_message_bytes`` (:func:`ws_max_size`).
WS_MARGIN: Final = 1024 * 1024
#: How often a child checks that its parent is alive, in seconds.
PARENT_POLL_SECONDS: Final = 0.5


def ws_max_size(limits: Limits | None = None) -> int:
    """The frame limit to give a server in front of the middleware: a margin above
    ``limits.max_message_bytes``, so an oversized message reaches the middleware, which answers
    it with an error event instead of the server closing the socket with 1009."""
    return (limits or Limits()).max_message_bytes + WS_MARGIN


class ServerStartError(RuntimeError):
    """The server stopped, or did not answer, before it served."""


def bind_loopback(backlog: int = 128) -> socket.socket:
    """A TCP socket bound to 127.0.0.1 on a port the OS picks, already listening."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, 0))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def origin(sock: socket.socket) -> str:
    """The base URL of a socket bound on loopback: ``http://127.0.0.1:PORT``."""
    port: int = sock.getsockname()[1]
    return f"http://{HOST}:{port}"


# ----------------------------------------------------------------------------- in a thread


class ServerThread:
    """Serves `app` with uvicorn or hypercorn on 127.0.0.1 until `stop()`.

    ``with ServerThread(app) as base_url:`` starts it and stops it at the end of the block.
    ``ws_max_size`` is the server's frame limit, ``lifespan`` uvicorn's lifespan mode;
    ``options`` go to the server's configuration (``root_path``, ``timeout_graceful_shutdown``,
    ...; uvicorn's ``ws`` is :data:`UVICORN_WS` unless given); after ``lifetime`` seconds the
    server stops by itself. ``name`` names its thread.
    """

    def __init__(
        self,
        app: ASGIApp,
        server: ServerName = "uvicorn",
        *,
        ws_max_size: int = WS_MAX_SIZE,
        lifespan: Literal["auto", "on", "off"] = "auto",
        lifetime: float | None = None,
        name: str = "ws-mode-server",
        options: Mapping[str, Any] | None = None,
    ) -> None:
        if server not in SERVERS:
            raise ValueError(f"server must be one of {SERVERS}, got {server!r}")
        self.app = app
        self.server = server
        self.base_url = ""
        self.ws_max_size = ws_max_size
        self.lifespan = lifespan
        self.lifetime = lifetime
        self.name = name
        self.options = dict(options or {})
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None
        self._stop: Callable[[], None] | None = None
        self._started: Callable[[], bool] = lambda: True
        self._failure: BaseException | None = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> str:
        """Start serving; return the base URL `http://127.0.0.1:PORT`."""
        sock = bind_loopback()
        base_url = origin(sock)
        try:
            run = self._uvicorn(sock) if self.server == "uvicorn" else self._hypercorn(sock)
        except BaseException:
            sock.close()
            raise

        def target() -> None:
            try:
                run()
            except BaseException as exc:  # reported by start(), the thread ends
                self._failure = exc
            finally:
                sock.close()

        port = base_url.rpartition(":")[2]
        self._thread = threading.Thread(target=target, name=f"{self.name}-{port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not self._started():
            if not self._thread.is_alive():
                raise ServerStartError(
                    f"{self.server} stopped before serving: {self._failure!r}"
                ) from self._failure
            if time.monotonic() > deadline:
                self.stop()
                raise ServerStartError(f"{self.server} did not start serving on port {port}")
            time.sleep(0.005)
        if self.lifetime is not None and self._stop is not None:
            self._timer = threading.Timer(self.lifetime, self._stop)
            self._timer.daemon = True
            self._timer.start()
        self.base_url = base_url
        return base_url

    def stop(self) -> None:
        """Stop the server and wait for its thread."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._stop is not None:
            self._stop()
        if self._thread is not None:
            self._thread.join(15.0)
            self._thread = None

    def _uvicorn(self, sock: socket.socket) -> Callable[[], None]:
        import uvicorn

        options = {"ws": UVICORN_WS, **self.options}
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            lifespan=self.lifespan,
            ws_max_size=self.ws_max_size,
            **options,
        )
        server = uvicorn.Server(config)

        def stop() -> None:
            server.should_exit = True

        self._stop = stop
        self._started = lambda: server.started
        return lambda: server.run(sockets=[sock])

    def _hypercorn(self, sock: socket.socket) -> Callable[[], None]:
        from hypercorn.asyncio import serve
        from hypercorn.config import Config

        config = Config()
        config.bind = [f"fd://{sock.detach()}"]  # hypercorn owns (and closes) it now
        config.loglevel = "WARNING"
        config.websocket_max_message_size = self.ws_max_size
        config.websocket_ping_interval = PING_SECONDS  # hypercorn sends none by default
        for key, value in self.options.items():
            setattr(config, key, value)
        holder: dict[str, Any] = {}

        def run() -> None:
            loop = asyncio.new_event_loop()
            event = asyncio.Event()
            holder["loop"], holder["event"] = loop, event
            try:
                loop.run_until_complete(
                    serve(self.app, config, shutdown_trigger=event.wait, mode="asgi")  # type: ignore[arg-type]
                )
            finally:
                loop.close()

        def stop() -> None:
            loop = holder.get("loop")
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(holder["event"].set)

        self._stop = stop
        return run


# ----------------------------------------------------------------------------- in a child


@dataclass(frozen=True)
class ServerProcess:
    """A server running in a child process: its origin and process id."""

    base_url: str
    pid: int


@contextlib.contextmanager
def server_process(
    module: str,
    arguments: Sequence[str] = (),
    *,
    python: str = sys.executable,
    ready_path: str = "/",
    lifetime: float | None = None,
    backlog: int = 128,
    start_timeout: float = 60.0,
) -> Iterator[ServerProcess]:
    """Run ``python -m module *arguments --fd N`` serving on a socket bound here; yield it once
    it answers an HTTP ``GET ready_path`` (any status). The child is terminated (killed if it
    lingers) when the block exits, and exits by itself if this process dies or after
    ``lifetime`` seconds. Raises :class:`ServerStartError` if it exits or stays silent."""
    listener = bind_loopback(backlog)
    base_url = origin(listener)
    command = [python, "-m", module, *arguments, "--fd", str(listener.fileno())]
    if lifetime is not None:
        command += ["--lifetime", str(lifetime)]
    log = tempfile.TemporaryFile()  # noqa: SIM115  (closed in the finally below)
    try:
        try:
            process = subprocess.Popen(
                command,
                pass_fds=(listener.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C reaches the parent, which stops the child
            )
        except OSError as exc:
            raise ServerStartError(f"could not start (python -m {module}): {exc}") from exc
        finally:
            listener.close()  # the child has its copy; with it gone, a dead child refuses
        try:
            try:
                wait_answering(base_url, process, path=ready_path, timeout=start_timeout)
            except ServerStartError as exc:
                log.seek(0)
                detail = log.read().decode(errors="replace").strip().splitlines()[-5:]
                raise ServerStartError(
                    f"{exc}: " + (" | ".join(detail) or f"python -m {module}")
                ) from None
            yield ServerProcess(base_url, process.pid)
        finally:
            stop_process(process)
    finally:
        log.close()


def wait_answering(
    base_url: str,
    process: subprocess.Popen[bytes],
    *,
    path: str = "/",
    timeout: float = START_TIMEOUT,
) -> None:
    """Wait until the server at ``base_url``, run by ``process``, answers ``GET path`` (any
    status); :class:`ServerStartError` (``exited`` or ``did not start in time``) otherwise."""
    port = int(base_url.rpartition(":")[2])
    request = f"GET {path} HTTP/1.1\r\nhost: {HOST}\r\nconnection: close\r\n\r\n".encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), 1.0) as probe:
            probe.sendall(request)
            probe.settimeout(0.2)
            while time.monotonic() < deadline and process.poll() is None:
                with contextlib.suppress(TimeoutError):
                    if probe.recv(1):
                        return
                    break  # closed without an answer: try again
        time.sleep(0.02)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(2.0)  # a server that closed its socket is exiting
    raise ServerStartError("exited" if process.returncode is not None else "did not start in time")


def stop_process(process: subprocess.Popen[Any]) -> None:
    """Terminate a child process, killing it if it does not end within 10 s."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(5)


def add_child_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the flags :func:`server_process` passes its child: ``--fd`` and ``--lifetime``."""
    parser.add_argument(
        "--fd", type=int, required=True, help="the listening socket the parent bound"
    )
    parser.add_argument("--lifetime", type=float, default=None, help="exit after this many seconds")


def serve_inherited(app: ASGIApp, arguments: argparse.Namespace, **config: Any) -> None:
    """In the child of :func:`server_process`: serve ``app`` with uvicorn on the socket the
    parent passed (``arguments.fd``) until SIGTERM or SIGINT; exit with the parent. ``config``
    goes to ``uvicorn.Config`` (``log_level`` defaults to warning, ``lifespan`` to off, ``ws`` to
    :data:`UVICORN_WS`)."""
    import uvicorn

    exit_with_parent(arguments.lifetime)
    listener = socket.socket(fileno=arguments.fd)
    config = {"log_level": "warning", "lifespan": "off", "ws": UVICORN_WS, **config}
    server = uvicorn.Server(uvicorn.Config(app, **config))
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[listener])


def exit_with_parent(lifetime: float | None = None) -> None:
    """End this process when its parent is gone, or after ``lifetime`` seconds whatever
    happens (a daemon thread watches)."""
    parent = os.getppid()
    deadline = None if lifetime is None else time.monotonic() + lifetime

    def watch() -> None:
        while os.getppid() == parent and (deadline is None or time.monotonic() < deadline):
            time.sleep(PARENT_POLL_SECONDS)
        os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
