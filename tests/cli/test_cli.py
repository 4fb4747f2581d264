"""The ``ws-mode`` command: --version, the demo's table, and ``serve`` in a real subprocess."""

from __future__ import annotations

import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

import ws_mode
from ws_mode.cli import main
from ws_mode.tools import rollout
from ws_mode.tools.clients import connect

NUMBER = r"[\d.]+"
SIZE = rf"{NUMBER} (?:B|KiB|MiB)"
TIME = rf"{NUMBER} (?:µs|ms|s)"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"ws-mode {ws_mode.__version__}"


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "serve" in capsys.readouterr().err
    assert main(["demo", "--turns", "0"]) == 2
    assert "--turns: must be >= 1" in capsys.readouterr().err
    assert main(["serve", "--full-context", "sometimes"]) == 2
    assert main(["serve", "--port", "70000"]) == 2


def _row(out: str, mode: str) -> list[str]:
    """The cells of the table row of `mode`."""
    for line in out.splitlines():
        if line.strip().startswith(mode + "  "):
            return re.split(r"\s{2,}", line.strip())
    raise AssertionError(f"no row for {mode!r} in:\n{out}")


def test_demo_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--turns", "4", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "4 turns, 3 tool calls" in out
    http, always, on_miss = (_row(out, mode) for mode in ("HTTP", "WS always", "WS on_miss"))
    for row in (http, always, on_miss):
        assert len(row) == 8, row
        for cell in row[1:4]:
            assert re.fullmatch(TIME, cell), row
        for cell in row[4:6]:
            assert re.fullmatch(SIZE, cell), row
    assert http[6:] == ["1", "1"]
    for row in (always, on_miss):
        time_ratio, sent_ratio = float(row[6]), float(row[7])
        assert time_ratio > 0
        assert 0 < sent_ratio < 1
        assert row[4] == always[4]  # both socket modes send the same frames
    assert always[5] == http[5]  # drop-in: the handler parses the whole history
    assert on_miss[5] != http[5]
    assert "same answer" in out
    assert "full_context=always" in out
    # The server is gone with the command.
    assert not [t for t in threading.enumerate() if t.name.startswith("ws-mode-demo")]


def test_demo_reports_a_failed_rollout(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: object, **kwargs: object) -> rollout.RolloutResult:
        raise rollout.RolloutError("the server answered an error: boom")

    monkeypatch.setattr(rollout, "run_socket", broken)
    assert main(["demo", "--turns", "2", "--no-progress"]) == 1
    captured = capsys.readouterr()
    assert "ws-mode demo: error: the server answered an error: boom" in captured.err
    assert not [t for t in threading.enumerate() if t.name.startswith("ws-mode-demo")]


def _first_line(process: subprocess.Popen[str], prefix: str, timeout: float) -> str:
    """The first line of the process's output that starts with `prefix`."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.1)
        if ready:
            line = process.stdout.readline()
            if line.startswith(prefix):
                return line
            seen.append(line)
        if process.poll() is not None:
            break
    raise AssertionError(f"no line starting with {prefix!r}; output: {''.join(seen)!r}")


def test_serve_answers_a_socket_and_plain_http(tmp_path: Path) -> None:
    # Started from an unrelated directory: the installed package is all it needs.
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ws_mode.cli",
            "serve",
            "--port",
            "0",
            "--tool-calls",
            "1",
            "--log-level",
            "warning",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = _first_line(process, "ws-mode serve:", timeout=20)
        found = re.search(r"ws://127\.0\.0\.1:(\d+)/v1/responses", line)
        assert found, line
        port = found.group(1)
        assert f'base_url="http://127.0.0.1:{port}/v1"' in line

        with connect(f"http://127.0.0.1:{port}") as socket:
            socket.send({"type": "response.create", "model": "m", "input": "hi"})
            event = socket.receive_turn(timeout=10)[-1]
        assert event["type"] == "response.completed", event
        assert event["response"]["output"][0]["type"] == "function_call"

        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/responses", json={"input": "hi"}, timeout=10
        )
        assert answer.status_code == 200
        assert answer.json()["object"] == "response"

        result = rollout.run_socket(f"http://127.0.0.1:{port}", turns=2, tool_output_bytes=100)
        assert result.tool_calls == 1
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


@pytest.mark.parametrize("store", [None, "memory"])
def test_serve_with_a_store_continues_a_response_on_a_new_socket(
    tmp_path: Path, store: str | None
) -> None:
    flags = ["--store", store] if store else []
    command = [sys.executable, "-m", "ws_mode.cli", "serve", "--port", "0", *flags]
    process = subprocess.Popen(
        [*command, "--log-level", "warning"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = _first_line(process, "ws-mode serve:", timeout=20)
        found = re.search(r"ws://127\.0\.0\.1:(\d+)/v1/responses", line)
        assert found, line
        origin = f"http://127.0.0.1:{found.group(1)}"
        with connect(origin) as first:
            first.send({"type": "response.create", "model": "m", "input": "hi"})
            response = first.receive_turn(timeout=10)[-1]["response"]
        call = response["output"][0]
        answer = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
        with connect(origin) as second:  # a new connection: an empty cache
            second.send(
                {"type": "response.create", "model": "m", "input": [answer],
                 "previous_response_id": response["id"]}
            )  # fmt: skip
            event = second.receive_turn(timeout=10)[-1]
        if store:
            assert event["type"] == "response.completed", event
        else:
            assert event["error"]["code"] == "previous_response_not_found"
    finally:
        process.terminate()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


def test_a_bad_store_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--store", "sqlite:///x"]) == 2
    assert "expected memory or a redis:// URL" in capsys.readouterr().err
