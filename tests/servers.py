"""Real ASGI servers on loopback for the integration tests.

`serve(app, server="uvicorn")` runs the app under a real server in a background thread (the
tools' runner, `ws_mode.testing._loopback.ServerThread`) and yields its base URL; the server stops
when the block exits (and by itself after `lifetime` seconds, so nothing outlives a crashed test
run).

`ALL_SERVERS` adds the servers that run in a child process, when they are installed: daphne
(Twisted's reactor is process-wide and runs once) and granian (a Rust server with its own
worker processes). They take the app as an import string (`"package.module:attribute"`), plus
`env` and `pythonpath` options for the child; uvicorn and hypercorn take an app or a string.
Daphne serves on a socket bound here and passed down (`--fd`), like every server the tools
start; granian cannot take one, so it binds a port found free.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp

from ws_mode.testing._loopback import (
    WS_MAX_SIZE,
    ServerStartError,
    ServerThread,
    bind_loopback,
    origin,
    wait_answering,
)

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
    if server not in SERVERS:
        raise ValueError(f"unknown server {server!r}; expected one of {ALL_SERVERS}")
    if isinstance(app, str):
        app = import_app(app)
    if server == "hypercorn":
        # Once a WebSocket has closed, hypercorn keeps its connection's task until shutdown's
        # graceful_timeout (3 s by default) has passed: each server stopped after a socket
        # waited 3 s for nothing. A test that needs a longer grace passes its own.
        options.setdefault("graceful_timeout", 0.5)
    with ServerThread(
        app,
        "uvicorn" if server == "uvicorn" else "hypercorn",
        ws_max_size=options.pop("ws_max_size", WS_MAX_SIZE),
        lifespan=options.pop("lifespan", "auto"),
        lifetime=lifetime,
        name=server,
        options=options,
    ) as base_url:
        yield base_url


def import_app(target: str) -> Any:
    """The object an import string `"package.module:attribute"` names."""
    module_name, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module_name), attribute or "app")


def _child_command(
    target: str, server: str, where: str, ws_max_size: int, options: dict[str, Any]
) -> list[str]:
    """The child's command line; `where` is daphne's listening fd, or granian's port."""
    if server == "daphne":
        command = [
            *("-m", "daphne", "--fd", where, "-v", "0"),
            *("--websocket-max-message-size", str(ws_max_size)),
            *("--websocket-max-frame-size", str(ws_max_size)),
        ]
    else:  # granian: its WebSocket message size limit is fixed (tungstenite's defaults)
        command = [
            *("-m", "granian", "--interface", options.pop("interface", "asgi")),
            *("--host", "127.0.0.1", "--port", where, "--log-level", "warning"),
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
    ws_max_size: int = WS_MAX_SIZE,
    **options: Any,
) -> Iterator[str]:
    """Run `target` under `server` in a child process that lives at most `lifetime` seconds."""
    listener = bind_loopback() if server == "daphne" else None  # bound here, served there
    if listener is not None:
        base_url, where = origin(listener), str(listener.fileno())
    else:  # granian
        port = free_port()
        base_url, where = f"http://127.0.0.1:{port}", str(port)
    command = _child_command(target, server, where, ws_max_size, options)
    # Even if this process dies without cleaning up, the child ends by itself.
    timeout = shutil.which("timeout")
    if timeout is not None:
        command = [timeout, "--signal=TERM", "--kill-after=5", str(int(lifetime)), *command]
    child_env = {**os.environ, **(env or {})}
    paths = [str(path) for path in pythonpath] + [str(ROOT)]
    if child_env.get("PYTHONPATH"):
        paths.append(child_env["PYTHONPATH"])
    child_env["PYTHONPATH"] = os.pathsep.join(paths)
    keep = () if listener is None else (listener.fileno(),)
    with tempfile.TemporaryFile() as log:
        try:
            child = subprocess.Popen(
                command, cwd=ROOT, env=child_env, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=keep,
            )  # fmt: skip
        finally:
            if listener is not None:
                listener.close()  # the child holds its copy
        try:
            try:
                wait_answering(base_url, child, timeout=20.0)
            except ServerStartError as exc:
                log.seek(0)
                output = log.read().decode(errors="replace")
                raise RuntimeError(f"{server} {exc} ({child.returncode}):\n{output}") from None
            yield base_url
        finally:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait(5)


def first_line(process: subprocess.Popen[str], prefix: str, timeout: float) -> str:
    """The first line of the process's output that starts with `prefix`. Read line by line in
    a thread of its own, which stops at that line (what follows stays in the stream for its
    next reader): waiting on the pipe with `select` missed the lines the stream had already
    buffered with an earlier one (a server printing its four start lines in one write)."""
    stdout = process.stdout
    assert stdout is not None
    seen: list[str] = []
    found: list[str] = []

    def read() -> None:
        for line in iter(stdout.readline, ""):
            if line.startswith(prefix):
                found.append(line)
                return
            seen.append(line)

    reader = threading.Thread(target=read, name="first-line", daemon=True)
    reader.start()
    reader.join(timeout)
    if found:
        return found[0]
    raise AssertionError(f"no line starting with {prefix!r}; output: {''.join(seen)!r}")


def stop(process: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """Terminate `process`, killing it if it does not end within `timeout` seconds."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout)
    if process.stdout is not None:
        process.stdout.close()


@dataclass
class ServeProcess:
    """A running `ws-mode serve`: its process, its banner line and its origin."""

    process: subprocess.Popen[str]
    banner: str
    origin: str


@contextlib.contextmanager
def ws_mode_serve(*flags: str, cwd: Path, timeout: float = 15.0) -> Iterator[ServeProcess]:
    """Run `ws-mode serve --port 0 FLAGS` from `cwd` (the installed package is all it needs);
    yield it once its banner names the port, stop it after."""
    with _ws_mode_command("serve", flags, cwd=cwd, timeout=timeout) as process:
        yield process


@contextlib.contextmanager
def ws_mode_proxy(*flags: str, timeout: float = 10.0) -> Iterator[ServeProcess]:
    """Run `ws-mode proxy --port 0 FLAGS`; yield it once its banner names the port, stop it
    after."""
    with _ws_mode_command("proxy", flags, cwd=None, timeout=timeout) as process:
        yield process


@contextlib.contextmanager
def uvicorn_command(
    arguments: list[str], *, env: dict[str, str] | None = None, timeout: float = 60.0
) -> Iterator[ServeProcess]:
    """Run `uvicorn ARGUMENTS --port 0` as a command line does, from the repository's root
    (its output, standard error included, on `process.stdout`); yield it once it names its
    port, stop it after. `timeout` ends it by itself, should the test die first."""
    command = [sys.executable, "-m", "uvicorn", *arguments, "--port", "0"]
    if (limit := shutil.which("timeout")) is not None:
        command = [limit, str(int(timeout)), *command]
    process = subprocess.Popen(
        command, cwd=ROOT, env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        banner = first_line(process, "INFO:     Uvicorn running on", timeout=20)
        found = re.search(r"http://127\.0\.0\.1:\d+", banner)
        assert found, banner
        yield ServeProcess(process, banner, found.group(0))
    finally:
        stop(process)


@contextlib.contextmanager
def _ws_mode_command(
    command: str, flags: tuple[str, ...], *, cwd: Path | None, timeout: float
) -> Iterator[ServeProcess]:
    process = subprocess.Popen(
        [sys.executable, "-m", "ws_mode.toolkit.cli", command, "--port", "0", *flags,
         "--log-level", "warning"],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        banner = first_line(process, f"ws-mode {command}:", timeout=60)  # a loaded machine
        found = re.search(r"ws://127\.0\.0\.1:(\d+)/v1/responses", banner)
        assert found, banner
        yield ServeProcess(process, banner, f"http://127.0.0.1:{found.group(1)}")
    finally:
        stop(process, timeout)
