"""Rolling restarts of the documented worker deployments on a real Redis store, under
conversations of examples/client_resume.py's client (tests/rolling.py): uvicorn's own workers
as docs/deployment.md shows them (`uvicorn --factory
ws_mode.toolkit.cli.serve:app_from_environment --workers 2 --timeout-worker-healthcheck 30`)
and `ws-mode serve --workers 2`; two servers behind nginx are tests/toolkit/cli/
test_rolling_nginx.py.

uvicorn's workers do not drain: a stopping one closes its sockets with 1012 at once and cancels
the turns running on them. examples/client_sdk.py, on the SDK's `responses.connect()`, comes
back after its worker is stopped that way in the middle of a turn: a new socket, the whole
context, no `previous_response_id` (the fast test). `test_figure` (`--run-slow`, with `-s`)
restarts each deployment (`kill -HUP`) under 40 conversations of 6 questions: every
conversation finishes with the answer plain HTTP gives for its history, and no upgrade is
answered 426; it prints the lines docs/deployment.md quotes.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from examples import client_sdk
from tests.redis_server import RedisServer
from tests.rolling import converse, http_answer
from tests.serve_workers import replaced, serving_worker, wait_for_workers
from tests.servers import ROOT, free_port, stop, ws_mode_serve
from ws_mode.testing._loopback import UVICORN_WS, ws_max_size
from ws_mode.toolkit.cli.serve import APP_FACTORY, ENVIRONMENT

#: How long the workers may take to start, on a busy machine.
START = 60.0


@dataclass
class Uvicorn:
    """Worker processes serving `ws-mode serve`'s app: their supervisor, and the port."""

    process: subprocess.Popen[Any]
    port: int

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.contextmanager
def uvicorn_workers(tokens_per_second: str) -> Iterator[Uvicorn]:
    """The command docs/deployment.md gives for uvicorn's own workers, on a real Redis."""
    with RedisServer() as redis_server:
        port = free_port()
        env = {
            **os.environ,
            ENVIRONMENT["store"]: redis_server.url,
            ENVIRONMENT["tool_calls"]: "0",
            ENVIRONMENT["tokens_per_second"]: tokens_per_second,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        command = [sys.executable, "-m", "uvicorn", "--factory", APP_FACTORY, "--workers", "2"]
        command += ["--timeout-worker-healthcheck", "30", "--ws", UVICORN_WS]
        command += ["--ws-max-size", str(ws_max_size())]
        command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
        process = subprocess.Popen(
            command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            served = Uvicorn(process, port)
            wait_for_workers(process.pid, 2, timeout=START)
            deadline = time.monotonic() + START
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(served.origin + "/v1/models", timeout=5).status_code < 500:
                        break
                assert time.monotonic() < deadline, "uvicorn did not serve"
                time.sleep(0.05)
            yield served
        finally:
            stop(process, 30)


@contextlib.contextmanager
def serve_workers(tokens_per_second: str) -> Iterator[Uvicorn]:
    """`ws-mode serve --workers 2` on a real Redis, as docs/deployment.md gives it."""
    flags = ["--workers", "2", "--tool-calls", "0", "--tokens-per-second", tokens_per_second]
    with (
        tempfile.TemporaryDirectory() as directory,
        RedisServer() as redis_server,
        ws_mode_serve(*flags, "--store", redis_server.url, cwd=Path(directory)) as served,
    ):
        yield Uvicorn(served.process, int(served.origin.rsplit(":", 1)[1]))


DEPLOYMENTS = {"uvicorn --workers 2": uvicorn_workers, "ws-mode serve --workers 2": serve_workers}


@pytest.mark.slow
@pytest.mark.parametrize("deployment", list(DEPLOYMENTS))
def test_figure(deployment: str) -> None:
    """The figures in docs/deployment.md: a rolling restart (SIGHUP) under 40 conversations
    of 6 questions."""
    with DEPLOYMENTS[deployment](tokens_per_second="100") as served:
        workers = wait_for_workers(served.process.pid, 2)

        def roll() -> None:
            os.kill(served.process.pid, signal.SIGHUP)
            replaced(served.process.pid, workers, timeout=120)

        rolled = converse(served.origin, clients=40, turns=6, roll=roll)
        print(f"{deployment}: {rolled.figure()}")
        assert not rolled.lost, rolled.lost
        assert rolled.refused_426 == 0, rolled.causes
        for client in rolled.clients:
            assert client.conversations, rolled.figure()
            last = client.conversations[-1]
            assert last.final.output_text == http_answer(served.origin, last.history)


class Streamed(io.StringIO):
    """The agent's output, telling when its first text arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.text = threading.Event()

    def write(self, text: str) -> int:
        if text and not text.startswith("["):
            self.text.set()
        return super().write(text)


def test_the_sdk_example_sends_a_turn_cut_by_1012_again_with_the_whole_context() -> None:
    with uvicorn_workers(tokens_per_second="40") as served:
        client = OpenAI(base_url=served.origin + "/v1", api_key="-", max_retries=0, timeout=30)

        def connect() -> Any:
            return client.responses.connect().enter()

        out = Streamed()
        agent = client_sdk.Agent(connect(), model="m", out=out, reconnect=connect)
        answers: list[str] = []
        try:
            agent.warm_up()
            asking = threading.Thread(target=lambda: answers.append(agent.ask("Plan it.")))
            asking.start()
            assert out.text.wait(START), "no text streamed"
            os.kill(serving_worker(served.process.pid, served.port), signal.SIGTERM)  # 1012
            asking.join(START)
            assert not asking.is_alive()
        finally:
            agent.close()
        assert answers, out.getvalue()
        log = out.getvalue()
        assert "[socket closed: resending the whole context on a new one]" in log
        assert agent.reconnects == 1
        history = agent.context[:-1]  # the answer's one message is last
        assert answers[0] == http_answer(
            served.origin, history, client_sdk.INSTRUCTIONS, client_sdk.TOOLS
        )
