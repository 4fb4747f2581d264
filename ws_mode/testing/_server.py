"""A real ASGI server on loopback, in a background thread, for the compatibility kit."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from typing import Any, Literal

from starlette.types import ASGIApp

__all__ = ["ServerName", "ServerThread"]

ServerName = Literal["uvicorn", "hypercorn"]
SERVERS: tuple[ServerName, ...] = ("uvicorn", "hypercorn")

# Histories grow with every turn; servers' 16 MiB defaults are too small for long programs.
WS_MAX_SIZE = 256 * 1024 * 1024
START_TIMEOUT = 15.0


class ServerThread:
    """Serves `app` with uvicorn or hypercorn on 127.0.0.1 until `stop()`."""

    def __init__(self, app: ASGIApp, server: ServerName = "uvicorn") -> None:
        if server not in SERVERS:
            raise ValueError(f"server must be one of {SERVERS}, got {server!r}")
        self.app = app
        self.server = server
        self.base_url = ""
        self._thread: threading.Thread | None = None
        self._stop: Any = None
        self._failure: BaseException | None = None

    def start(self) -> str:
        """Start serving; return the base URL `http://127.0.0.1:PORT`."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        run = self._uvicorn(sock) if self.server == "uvicorn" else self._hypercorn(sock)

        def target() -> None:
            try:
                run()
            except BaseException as exc:  # reported by start(), the thread ends
                self._failure = exc
            finally:
                sock.close()

        self._thread = threading.Thread(target=target, name=f"ws-mode-check-{port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if not self._thread.is_alive():
                raise RuntimeError(
                    f"{self.server} stopped before serving: {self._failure!r}"
                ) from self._failure
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", port), 0.2),
            ):
                break
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.server} did not start listening on port {port}")
            time.sleep(0.02)
        self.base_url = f"http://127.0.0.1:{port}"
        return self.base_url

    def stop(self) -> None:
        """Stop the server and wait for its thread."""
        if self._stop is not None:
            self._stop()
        if self._thread is not None:
            self._thread.join(15.0)
            self._thread = None

    def _uvicorn(self, sock: socket.socket) -> Any:
        import uvicorn

        sock.listen(128)
        config = uvicorn.Config(
            self.app, log_level="warning", lifespan="auto", ws_max_size=WS_MAX_SIZE
        )
        server = uvicorn.Server(config)

        def stop() -> None:
            server.should_exit = True

        self._stop = stop
        return lambda: server.run(sockets=[sock])

    def _hypercorn(self, sock: socket.socket) -> Any:
        from hypercorn.asyncio import serve
        from hypercorn.config import Config

        sock.listen(128)
        config = Config()
        config.bind = [f"fd://{sock.detach()}"]  # hypercorn owns (and closes) it now
        config.loglevel = "WARNING"
        config.websocket_max_message_size = WS_MAX_SIZE
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
