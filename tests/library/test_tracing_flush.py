"""The spans of the last seconds before a restart reach the exporter: uvicorn ends its process
with the signal it got once it shut down, so exit hooks never run and a `BatchSpanProcessor`
would drop its queue; the end of the drain flushes the tracer provider ws_mode was given.
A real server in a child process (`ws-mode serve --app`, which drains, and plain uvicorn, whose
lifespan shutdown drains), a real client, SIGTERM; the exporter holds spans for ten minutes
unless flushed (tests/span_flush_app.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import ROOT, first_line, free_port, stop
from ws_mode.testing._client import connect

#: Each server's command, and the line it prints once it listens.
LAUNCHERS = {
    "ws-mode serve --app": ([sys.executable, "-m", "ws_mode.toolkit.cli", "serve", "--app",
                             "tests.span_flush_app:app"], "ws-mode serve:"),
    "uvicorn": ([sys.executable, "-m", "uvicorn", "tests.span_flush_app:app",
                 "--ws", "ws_mode.server:BatchingWebSocketProtocol"], "INFO:     Uvicorn running"),
}  # fmt: skip


def turn_then_sigterm(launcher: str, tmp_path: Path, **env_extra: str) -> Path:
    """Serve tests/span_flush_app.py under `launcher`, run one turn, send SIGTERM and wait
    for the process to end; the file the spans were exported to."""
    spans = tmp_path / "spans.txt"
    port = free_port()
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "SPAN_FILE": str(spans), "PYTHONPATH": path, **env_extra}
    command, ready = LAUNCHERS[launcher]
    process = subprocess.Popen(
        [*command, "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        first_line(process, ready, timeout=60)
        with connect(f"http://127.0.0.1:{port}", open_timeout=30) as socket:
            socket.send({"type": "response.create", "model": "m", "input": "Hello"})
            events = socket.receive_turn(timeout=30)
            assert events[-1]["type"] == "response.completed", events[-1]
            process.send_signal(signal.SIGTERM)
            process.wait(60)
    finally:
        stop(process)
    return spans


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_the_spans_of_turns_before_a_sigterm_are_exported(launcher: str, tmp_path: Path) -> None:
    spans = turn_then_sigterm(launcher, tmp_path)
    exported = spans.read_text().splitlines() if spans.exists() else []
    assert "response.create" in exported, exported
    assert "WebSocket /v1/responses" in exported, exported


def test_a_flush_that_never_returns_keeps_no_process_from_ending(tmp_path: Path) -> None:
    # An exporter that never returns, and a processor whose flush ignores its timeout: the
    # drain waits FLUSH_SECONDS for the flush, in a daemon thread of its own, then the process
    # ends (a TimeoutExpired from the wait in turn_then_sigterm fails the test).
    turn_then_sigterm("uvicorn", tmp_path, SPAN_EXPORT_HANGS="1")
