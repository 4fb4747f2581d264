"""Real ASGI servers on loopback for the integration tests.

`serve(app, server="uvicorn")` runs the app under a real server in a background thread and
yields its base URL; the server stops when the block exits (and by itself after `lifetime`
seconds, so nothing outlives a crashed test run).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from starlette.types import ASGIApp

SERVERS = ("uvicorn", "hypercorn")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_for_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.02)
    raise RuntimeError(f"the test server did not start listening on port {port}")


@contextlib.contextmanager
def serve(
    app: ASGIApp, server: str = "uvicorn", *, lifetime: float = 600.0, **options: Any
) -> Iterator[str]:
    """Run `app` under `server` on 127.0.0.1; yield `http://127.0.0.1:PORT`."""
    port = free_port()
    stop = threading.Event()
    loop_holder: dict[str, Any] = {}

    if server == "uvicorn":
        import uvicorn

        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan=options.pop("lifespan", "auto"),
            ws_max_size=options.pop("ws_max_size", 256 * 1024 * 1024),
            **options,
        )
        uv_server = uvicorn.Server(config)

        def run() -> None:
            uv_server.run()

        def shutdown() -> None:
            uv_server.should_exit = True

    elif server == "hypercorn":
        from hypercorn.asyncio import serve as hypercorn_serve
        from hypercorn.config import Config

        config_h = Config()
        config_h.bind = [f"127.0.0.1:{port}"]
        config_h.loglevel = "WARNING"
        config_h.websocket_max_message_size = options.pop("ws_max_size", 256 * 1024 * 1024)
        for key, value in options.items():
            setattr(config_h, key, value)

        def run() -> None:
            loop = asyncio.new_event_loop()
            loop_holder["loop"] = loop
            event = asyncio.Event()
            loop_holder["event"] = event
            try:
                loop.run_until_complete(
                    hypercorn_serve(app, config_h, shutdown_trigger=event.wait)  # type: ignore[arg-type]
                )
            finally:
                loop.close()

        def shutdown() -> None:
            loop = loop_holder.get("loop")
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(loop_holder["event"].set)

    else:
        raise ValueError(f"unknown server {server!r}; expected one of {SERVERS}")

    thread = threading.Thread(target=run, name=f"{server}-{port}", daemon=True)
    thread.start()
    timer = threading.Timer(lifetime, shutdown)
    timer.daemon = True
    timer.start()
    try:
        _wait_for_port(port, 15.0)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        timer.cancel()
        shutdown()
        thread.join(15.0)
