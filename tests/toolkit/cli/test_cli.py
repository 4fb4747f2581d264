"""The ``ws-mode`` command: --version, the demo's table, and ``serve`` in a real subprocess
(with ``--workers`` on a real redis-server)."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

import ws_mode
from tests.redis_server import RedisServer
from tests.servers import first_line, serve, ws_mode_serve
from ws_mode._store import MemoryStore
from ws_mode.testing._client import connect
from ws_mode.toolkit import rollout
from ws_mode.toolkit.cli import main
from ws_mode.toolkit.cli.serve import ENVIRONMENT, ServeSettings, app_from_environment

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


def test_serve_answers_a_socket_and_plain_http(tmp_path: Path) -> None:
    # Started from an unrelated directory: the installed package is all it needs.
    with ws_mode_serve("--tool-calls", "1", cwd=tmp_path) as served:
        origin = served.origin
        assert f'base_url="{origin}/v1"' in served.banner

        with connect(origin) as socket:
            socket.send({"type": "response.create", "model": "m", "input": "hi"})
            event = socket.receive_turn(timeout=10)[-1]
        assert event["type"] == "response.completed", event
        assert event["response"]["output"][0]["type"] == "function_call"

        answer = httpx.post(f"{origin}/v1/responses", json={"input": "hi"}, timeout=10)
        assert answer.status_code == 200
        assert answer.json()["object"] == "response"

        result = rollout.run_socket(origin, turns=2, tool_output_bytes=100)
        assert result.tool_calls == 1


@pytest.mark.parametrize("store", [None, "memory"])
def test_serve_with_a_store_continues_a_response_on_a_new_socket(
    tmp_path: Path, store: str | None
) -> None:
    flags = ["--store", store] if store else []
    with ws_mode_serve(*flags, cwd=tmp_path) as served:
        with connect(served.origin) as first:
            first.send({"type": "response.create", "model": "m", "input": "hi"})
            response = first.receive_turn(timeout=10)[-1]["response"]
        call = response["output"][0]
        answer = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
        with connect(served.origin) as second:  # a new connection: an empty cache
            second.send(
                {"type": "response.create", "model": "m", "input": [answer],
                 "previous_response_id": response["id"]}
            )  # fmt: skip
            event = second.receive_turn(timeout=10)[-1]
    if store:
        assert event["type"] == "response.completed", event
        assert "a store every caller shares" in served.banner  # it authenticates nobody
    else:
        assert event["error"]["code"] == "previous_response_not_found"


def test_serve_prints_ws_modes_warnings_in_uvicorns_style(tmp_path: Path) -> None:
    # The library configures no logging; the command does. A Redis that is down gives the
    # client a generic error and the operator the address, on the command's output.
    redis_server = RedisServer().start()
    redis_server.stop()
    flags = ("--store", redis_server.url, "--start-degraded")
    with ws_mode_serve(*flags, cwd=tmp_path) as served:
        with connect(served.origin) as socket:
            socket.send(
                {"type": "response.create", "model": "m", "input": "hi",
                 "previous_response_id": "resp_gone"}
            )  # fmt: skip
            event = socket.receive_turn(timeout=10)[-1]
        assert event["error"]["code"] == "store_unavailable"
        assert str(redis_server.port) not in event["error"]["message"]
        line = first_line(served.process, "WARNING:  ws_mode._persistence: ", timeout=10)
    assert "'resp_gone'" in line
    assert f"127.0.0.1:{redis_server.port}" in line


def _installed_only_without(monkeypatch: pytest.MonkeyPatch, missing: set[str]) -> None:
    """Make the command line find every module installed but those of ``missing``."""
    find_spec = importlib.util.find_spec

    def find_spec_without(name: str, package: str | None = None) -> Any:
        return None if name in missing else find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec_without)


def test_proxy_runs_with_the_proxy_extra_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # What the cli extra adds to the proxy extra: `ws-mode proxy` starts without it (and
    # fails only on its bad upstream here), the other commands ask for the cli extra.
    _installed_only_without(monkeypatch, {"rich", "starlette", "tokenizers"})
    assert main(["proxy", "--upstream", "ftp://upstream/v1"]) == 1
    err = capsys.readouterr().err
    assert "upstream must be an http:// or https:// URL" in err
    assert "needs" not in err
    assert main(["demo", "--turns", "2"]) == 1
    assert capsys.readouterr().err.endswith(
        "this command needs rich, starlette, tokenizers; install them with: "
        'pip install ".[cli]" in a clone of ws_mode (it is not published yet)\n'
    )


def test_proxy_without_uvicorn_asks_for_the_proxy_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _installed_only_without(monkeypatch, {"uvicorn"})
    assert main(["proxy", "--upstream", "http://127.0.0.1:9/v1"]) == 1
    assert 'needs uvicorn; install them with: pip install ".[proxy]"' in capsys.readouterr().err


def test_proxy_store_needs_an_explicit_scope(capsys: pytest.CaptureFixture[str]) -> None:
    upstream = ["proxy", "--upstream", "http://127.0.0.1:9/v1", "--store", "memory"]
    assert main(upstream) == 1
    assert "--store needs --store-scope: key" in capsys.readouterr().err
    assert main([*upstream, "--store-scope", "key", "--api-key", "sk-proxy"]) == 1
    assert "drop --api-key" in capsys.readouterr().err


def test_proxy_store_scope_key_keeps_each_keys_responses_apart() -> None:
    """`--store-scope key`: a digest of the client's bearer token scopes the store (the
    upstream checks the key itself); no key gets 401, another key cannot continue."""
    from ws_mode import WebSocketModeMiddleware
    from ws_mode.toolkit.cli.proxy import _store_scoping
    from ws_mode.toolkit.reference import create_app

    args = argparse.Namespace(store=MemoryStore(), store_scope="key")
    scoping, said = _store_scoping(args, None)
    assert "scoped by each client's API key" in said
    app = WebSocketModeMiddleware(create_app(), store=args.store, **scoping)
    with serve(app) as origin:

        def turn(token: str | None, **fields: Any) -> dict[str, Any]:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            with connect(origin, headers=headers) as socket:
                socket.send({"type": "response.create", "model": "m", **fields})
                event: dict[str, Any] = socket.receive_turn(timeout=10)[-1]
                return event

        mine = turn("sk-alice", input="hi")["response"]
        call = mine["output"][0]
        answer = [{"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}]
        theirs = turn("sk-bob", input=answer, previous_response_id=mine["id"])
        assert theirs["error"]["code"] == "previous_response_not_found"
        again = turn("sk-alice", input=answer, previous_response_id=mine["id"])
        assert again["type"] == "response.completed"
        with pytest.raises(Exception, match="401"):
            turn(None, input="hi")


def test_a_bad_store_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--store", "sqlite:///x"]) == 2
    assert "expected memory or a Redis URL (redis://" in capsys.readouterr().err
    assert main(["serve", "--store", "redis+sentinel://127.0.0.1:26379"]) == 2  # no service
    assert "names the service" in capsys.readouterr().err
    assert main(["serve", "--store", "redis+cluster://127.0.0.1:7000/3"]) == 2
    assert "database 0 only" in capsys.readouterr().err


# --- serve --workers ---------------------------------------------------------------------------


def test_workers_need_a_redis_store(capsys: pytest.CaptureFixture[str]) -> None:
    for flags in ([], ["--store", "memory"]):
        assert main(["serve", "--workers", "2", *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: ws-mode serve")
        assert "--workers 2 needs --store redis://" in err
        assert "per process" in err
    assert main(["serve", "--workers", "0"]) == 2
    assert "--workers: must be >= 1" in capsys.readouterr().err


def test_the_workers_settings_go_through_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = ServeSettings(
        tool_calls=5, tokens_per_second=250.5, full_context="on_miss",
        max_connection_seconds=12.5, store="memory", rate_limited_model="limited",
    )  # fmt: skip
    variables = settings.environment()
    assert set(variables) == set(ENVIRONMENT.values())
    assert ServeSettings.from_environment(variables) == settings
    assert ServeSettings.from_environment({}) == ServeSettings()  # unset: the defaults
    for name, value in [
        ("WS_MODE_SERVE_TOOL_CALLS", "-1"),
        ("WS_MODE_SERVE_FULL_CONTEXT", "sometimes"),
        ("WS_MODE_SERVE_STORE", "sqlite:///x"),
    ]:
        with pytest.raises(ValueError, match=name):
            ServeSettings.from_environment({**variables, name: value})
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    app = app_from_environment()
    assert isinstance(app.settings.store, MemoryStore)
    assert app.settings.full_context == "on_miss"
    assert app.settings.limits.max_connection_seconds == 12.5


def _workers_of(pid: int, count: int, timeout: float = 20.0) -> list[int]:
    """The pids of the uvicorn worker processes (multiprocessing spawn children) of `pid`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        workers = [
            int(child)
            for child in children
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes()
        ]
        if len(workers) == count:
            return workers
        time.sleep(0.05)
    raise AssertionError(f"process {pid} did not start {count} workers")


@contextlib.contextmanager
def _only(worker: int, workers: list[int]) -> Iterator[None]:
    """Every worker but `worker` stopped (SIGSTOP): a new connection lands on `worker`."""
    others = [pid for pid in workers if pid != worker]
    for pid in others:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in others:
            with contextlib.suppress(ProcessLookupError):  # replaced by uvicorn's supervisor
                os.kill(pid, signal.SIGCONT)


def test_serve_workers_share_a_redis_store(tmp_path: Path) -> None:
    flags = ("--workers", "2", "--tool-calls", "3")
    with (
        RedisServer() as redis_server,
        ws_mode_serve(*flags, "--store", redis_server.url, cwd=tmp_path) as served,
    ):
        keys = redis.Redis.from_url(redis_server.url)
        try:
            assert "2 workers" in served.banner
            origin = served.origin
            history: list[dict[str, Any]] = [{"role": "user", "content": "Plan it."}]
            new_input = list(history)
            previous: str | None = None
            # Each turn on a new socket, alternately on each worker: only the new items.
            for turn in range(4):
                # Read each turn: uvicorn's supervisor replaces a worker that missed its health
                # check while it was stopped (a loaded machine).
                workers = _workers_of(served.process.pid, 2)
                with _only(workers[turn % 2], workers), connect(origin) as socket:
                    socket.send(
                        {"type": "response.create", "model": "m", "input": new_input,
                         "previous_response_id": previous}
                    )  # fmt: skip
                    event = socket.receive_turn(timeout=20)[-1]
                assert event["type"] == "response.completed", event
                response = event["response"]
                direct = httpx.post(
                    origin + "/v1/responses", json={"model": "m", "input": history}, timeout=20
                ).json()
                assert response["output"] == direct["output"]  # the whole history's answer
                history += response["output"]
                previous = response["id"]
                call = response["output"][0]
                if call["type"] != "function_call":
                    break
                new_input = [
                    {"type": "function_call_output", "call_id": call["call_id"],
                     "output": f"step {turn}"}
                ]  # fmt: skip
                history += new_input
                # Written in the background after the terminal event: in Redis before the
                # worker that wrote it is stopped.
                deadline = time.monotonic() + 10
                while not keys.keys(f"*:r:{previous}"):
                    assert time.monotonic() < deadline, "the response never reached Redis"
                    time.sleep(0.01)
            assert history[-1]["type"] == "message"
            assert "answered after 3 tool" in history[-1]["content"][0]["text"]
        finally:
            keys.close()
    assert served.process.returncode == 0
