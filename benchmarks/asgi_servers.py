"""What each ASGI server costs per WebSocket frame, with and without permessage-deflate.

Every server runs the same app in its own process on loopback: ``ws-mode bench``'s forwarding
endpoints (:mod:`ws_mode.toolkit.bench.server`): a bare Starlette WebSocket sending ``--events``
encoded ``response.output_text.delta`` frames, the same stream through
:class:`~ws_mode.WebSocketModeMiddleware` from a handler writing SSE, and from one handing its
events as objects (``Turn.send_event``). One websockets client streams each endpoint in turn
(the order rotated every repetition), asking for permessage-deflate or not, and the server
process's CPU time per event (read from outside, children included) is the median over the
repetitions::

    python -m benchmarks.asgi_servers
    python -m benchmarks.asgi_servers --servers uvicorn hypercorn --events 5000

The servers: uvicorn with ws_mode's :class:`~ws_mode.server.BatchingWebSocketProtocol`
(``uvicorn-batched``, the one ws_mode's servers use) and each of its own WebSocket implementations
(``websockets-sansio``, which that protocol extends, ``websockets`` and ``wsproto``), Hypercorn,
Granian and Daphne, each one that is installed. A server that does not negotiate
permessage-deflate measures the same with and without it. No number here is a goal: the report
is for choosing a server.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from starlette.types import ASGIApp, Receive, Scope, Send

from ws_mode.toolkit.bench.control import process_cpu
from ws_mode.toolkit.bench.forward import ForwardError, run_forward
from ws_mode.toolkit.measure import median

__all__ = ["SERVERS", "ServerRun", "app", "main", "measure_server", "server_command"]

_EVENTS_ENV: Final = "WS_MODE_ASGI_SERVERS_EVENTS"
_APP: Final = "benchmarks.asgi_servers:app"
#: The servers compared, in the report's order.
SERVERS: Final = (
    "uvicorn-batched",
    "uvicorn-websockets-sansio",
    "uvicorn-websockets",
    "uvicorn-wsproto",
    "hypercorn",
    "granian",
    "daphne",
)


class _BenchApp:
    """The benchmark server's app, built on its first call in the server's process (each
    server imports ``app`` by name; the events come from the environment)."""

    def __init__(self) -> None:
        self.inner: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.inner is None:
            from ws_mode.toolkit.bench.server import ServerSpec, build_bench_app

            events = int(os.environ.get(_EVENTS_ENV, "2000"))
            self.inner = build_bench_app(ServerSpec(tool_calls=1, forward_events=events))
        await self.inner(scope, receive, send)


#: What each server serves: ``python -m ... `` imports it by name.
app = _BenchApp()


def server_command(server: str, port: int) -> list[str]:
    """The command that serves :data:`app` with ``server`` on ``127.0.0.1:port``."""
    python = sys.executable
    if server == "uvicorn-batched":
        # ws_mode's own protocol (websockets-sansio writing a pass's frames at once), the one
        # ws_mode's servers start by default.
        ws = "ws_mode.server:BatchingWebSocketProtocol"
        return [python, "-m", "uvicorn", _APP, "--port", str(port), "--ws", ws]
    if server.startswith("uvicorn-"):
        ws = server.removeprefix("uvicorn-")
        return [python, "-m", "uvicorn", _APP, "--port", str(port), "--ws", ws]
    if server == "hypercorn":
        return [python, "-m", "hypercorn", _APP, "--bind", f"127.0.0.1:{port}"]
    if server == "granian":
        granian = os.path.join(os.path.dirname(python), "granian")
        return [granian, "--interface", "asgi", "--port", str(port), "--workers", "1", _APP]
    if server == "daphne":
        return [python, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), _APP]
    raise ValueError(f"unknown server {server!r}; expected one of {SERVERS}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ForwardError(f"the server exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.1)
    raise ForwardError(f"the server did not listen on port {port} within {timeout:g} s")


def _tree_cpu(pid: int) -> float:
    """The CPU seconds of process ``pid`` and its children (a server's workers)."""
    children = subprocess.run(
        ["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False
    ).stdout.split()
    return sum(process_cpu(int(each)) or 0.0 for each in [str(pid), *children])


class _TreeCpu:
    """The forwarding benchmark's stats control, reading the server's CPU from outside."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def reset(self) -> dict[str, Any]:
        return self.read()

    def read(self) -> dict[str, Any]:
        return {"cpu_seconds": _tree_cpu(self.pid)}

    def start_profile(self, name: str) -> None:
        return None

    def stop_profile(self) -> None:
        return None


@contextlib.contextmanager
def _serving(server: str, events: int) -> Iterator[tuple[str, int]]:
    port = _free_port()
    environment = {**os.environ, _EVENTS_ENV: str(events)}
    process = subprocess.Popen(
        server_command(server, port),
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_port(port, process, timeout=30.0)
        yield f"http://127.0.0.1:{port}", process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class ServerRun:
    """One server's server CPU seconds per event, per endpoint, with and without deflate."""

    server: str
    cpu: dict[str, list[float]] = field(default_factory=dict)
    error: str | None = None

    def per_event(self, endpoint: str, compression: bool) -> float:
        """The median server CPU seconds per event (nan when not measured)."""
        return median(self.cpu.get(f"{endpoint}/{'deflate' if compression else 'plain'}", []))


def measure_server(server: str, *, events: int, repeat: int) -> ServerRun:
    """Stream ``events`` events from each endpoint under ``server``, ``repeat`` times each, with
    and without permessage-deflate."""
    run = ServerRun(server)
    try:
        with _serving(server, events) as (base_url, pid):
            control = _TreeCpu(pid)
            for round_number in range(repeat):
                order = (False, True) if round_number % 2 == 0 else (True, False)
                for compression in order:
                    result = run_forward(
                        base_url,
                        events=events,
                        repeat=1,
                        control=control,
                        warmup=round_number == 0,
                        compression=compression,
                    )
                    kind = "deflate" if compression else "plain"
                    for endpoint, values in (
                        ("bare", result.bare_cpu),
                        ("sse", result.middleware_cpu),
                        ("objects", result.objects_cpu),
                    ):
                        run.cpu.setdefault(f"{endpoint}/{kind}", []).extend(values)
    except (ForwardError, OSError) as exc:
        run.error = str(exc) or type(exc).__name__
    return run


def _installed(server: str) -> bool:
    module = {"hypercorn": "hypercorn", "granian": "granian", "daphne": "daphne"}.get(
        server, "uvicorn"
    )
    try:
        __import__(module)
    except ImportError:
        return False
    if server == "uvicorn-wsproto":
        try:
            __import__("wsproto")
        except ImportError:
            return False
    return True


def report(runs: Sequence[ServerRun]) -> list[str]:
    """The table: server CPU per event, µs, per endpoint, without and with deflate."""
    lines = [
        "server CPU per event (µs, median); ratio = through ws_mode / bare, same server",
        f"{'server':28s} {'deflate':8s} {'bare':>7s} {'SSE':>7s} {'objects':>8s} "
        f"{'SSE/bare':>9s} {'obj/bare':>9s}",
    ]
    for run in runs:
        if run.error is not None:
            lines.append(f"{run.server:28s} did not run: {run.error}")
            continue
        for compression in (False, True):
            bare = run.per_event("bare", compression)
            sse = run.per_event("sse", compression)
            objects = run.per_event("objects", compression)
            lines.append(
                f"{run.server:28s} {'yes' if compression else 'no':8s} {bare * 1e6:7.1f} "
                f"{sse * 1e6:7.1f} {objects * 1e6:8.1f} {sse / bare:9.2f} {objects / bare:9.2f}"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.asgi_servers``: measure, print the table."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.asgi_servers")
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    parser.add_argument("--events", type=int, default=5000, help="events per stream")
    parser.add_argument("--repeat", type=int, default=3, help="streams per endpoint and mode")
    args = parser.parse_args(argv)
    runs = []
    for server in args.servers:
        if not _installed(server):
            runs.append(ServerRun(server, error="not installed"))
            continue
        print(f"asgi_servers: {server}", file=sys.stderr)
        runs.append(measure_server(server, events=args.events, repeat=args.repeat))
    print("\n".join(report(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
