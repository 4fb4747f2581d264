"""Real ASGI servers on loopback for the integration tests.

`serve(app, server="uvicorn")` runs the app under a real server in a background thread and
yields its base URL; the server stops when the block exits (and by itself after `lifetime`
seconds, so nothing outlives a crashed test run).

`ALL_SERVERS` adds the servers that run in a child process, when they are installed: daphne
(Twisted's reactor is process-wide and runs once) and granian (a Rust server with its own
worker processes). They take the app as an import string (`"package.module:attribute"`), plus
`env` and `pythonpath` options for the child; uvicorn and hypercorn take an app or a string.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp

SERVERS = ("uvicorn", "hypercorn")
#: Servers run in a child process; only those installed here are listed.
PROCESS_SERVERS = tuple(
    name for name in ("daphne", "granian") if importlib.util.find_spec(name) is not None
)
ALL_SERVERS = SERVERS + PROCESS_SERVERS

ROOT = Path(__file__).resolve().parent.parent


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
    app: ASGIApp | str, server: str = "uvicorn", *, lifetime: float = 600.0, **options: Any
) -> Iterator[str]:
    """Run `app` under `server` on 127.0.0.1; yield `http://127.0.0.1:PORT`."""
    if server in PROCESS_SERVERS:
        if not isinstance(app, str):
            raise TypeError(f"{server} runs in a child process: pass the app as 'module:attr'")
        with _serve_in_child(app, server, lifetime=lifetime, **options) as base_url:
            yield base_url
        return
    if isinstance(app, str):
        app = import_app(app)
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
        raise ValueError(f"unknown server {server!r}; expected one of {ALL_SERVERS}")

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


def import_app(target: str) -> Any:
    """The object an import string `"package.module:attribute"` names."""
    module_name, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module_name), attribute or "app")


def _child_command(
    target: str, server: str, port: int, ws_max_size: int, options: dict[str, Any]
) -> list[str]:
    if server == "daphne":
        command = [
            *("-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "-v", "0"),
            *("--websocket-max-message-size", str(ws_max_size)),
            *("--websocket-max-frame-size", str(ws_max_size)),
        ]
    else:  # granian: its WebSocket message size limit is fixed (tungstenite's defaults)
        command = [
            *("-m", "granian", "--interface", options.pop("interface", "asgi")),
            *("--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"),
            "--no-access-log",
        ]
    for key, value in options.items():
        command.append("--" + key.replace("_", "-"))
        if value is not True:
            command.append(str(value))
    command.append(target)
    return [sys.executable, *command]


@contextlib.contextmanager
def _serve_in_child(
    target: str,
    server: str,
    *,
    lifetime: float,
    env: dict[str, str] | None = None,
    pythonpath: tuple[str | Path, ...] = (),
    ws_max_size: int = 256 * 1024 * 1024,
    **options: Any,
) -> Iterator[str]:
    """Run `target` under `server` in a child process that lives at most `lifetime` seconds."""
    port = free_port()
    command = _child_command(target, server, port, ws_max_size, options)
    # Even if this process dies without cleaning up, the child ends by itself.
    timeout = shutil.which("timeout")
    if timeout is not None:
        command = [timeout, "--signal=TERM", "--kill-after=5", str(int(lifetime)), *command]
    child_env = {**os.environ, **(env or {})}
    paths = [str(path) for path in pythonpath] + [str(ROOT)]
    if child_env.get("PYTHONPATH"):
        paths.append(child_env["PYTHONPATH"])
    child_env["PYTHONPATH"] = os.pathsep.join(paths)
    with tempfile.TemporaryFile() as log:
        child = subprocess.Popen(
            command, cwd=ROOT, env=child_env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 20.0
            while True:
                if child.poll() is not None:
                    log.seek(0)
                    output = log.read().decode(errors="replace")
                    raise RuntimeError(f"{server} exited with {child.returncode}:\n{output}")
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", port), 0.2),
                ):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{server} did not start listening on port {port}")
                time.sleep(0.05)
            yield f"http://127.0.0.1:{port}"
        finally:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait(5)
