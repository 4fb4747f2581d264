"""Rolling restarts under load: `ws-mode serve --workers N --store redis://...` (real uvicorn
workers, a real Redis) restarted worker by worker while clients run tool-loop rollouts.

A restart is the command's SIGHUP: uvicorn's supervisor starts a new worker, waits until it
serves, then stops an old one, which stops accepting, lets its running turns finish and closes
its sockets with 1001 (`ws_mode.toolkit.cli.workers`). The clients are the openai SDK's
(`examples/client_resume.py`): each keeps one socket, and when it is lost (the close, or a turn
refused as `server_shutting_down`) sends the turn again on a new socket, continuing from the
last response it received, which the store gives to whichever worker the socket reaches.

Every rollout finishes with the answer plain HTTP gives for its whole history, every response
a client received is in Redis, no continuation missed its parent, and every client came back
at least once (all its sockets' workers were replaced). `test_figure` prints the line quoted in
docs/deployment.md (run it with `-s`).
"""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from openai import OpenAI
from openai.types.responses import Response, ResponsesServerEvent

from examples.client_resume import Resend, ResumingAgent
from tests.redis_server import RedisServer
from tests.rolling import http_answer
from tests.serve_workers import listens, replaced, serving_worker, wait_for_workers
from tests.servers import ServeProcess, ws_mode_serve
from ws_mode.testing._client import SocketClosed, connect

TOOL_CALLS = 3
#: Turns of a few tenths of a second: a restart finds turns running.
TOKENS_PER_SECOND = "100"
QUESTION = "Plan the release."


@dataclass
class Client:
    """One client thread: its agent, and what it got."""

    agent: ResumingAgent
    #: Every response received, by id.
    received: list[str] = field(default_factory=list)
    #: Each finished rollout: its history before the last turn, and the final response.
    rollouts: list[tuple[list[dict[str, Any]], Response]] = field(default_factory=list)
    #: What plain HTTP answers for the last rollout's history, asked once the rollouts end.
    http_answer: str | None = None
    failure: BaseException | None = None

    def record(self, event: ResponsesServerEvent) -> None:
        if event.type == "response.completed":
            self.received.append(event.response.id)

    def run(self, origin: str, stop: threading.Event) -> None:
        """Rollouts one after the other on one socket, until `stop` is set; then the last
        one's history over plain HTTP."""
        try:
            while not stop.is_set():
                self.agent.start_over()
                final = self.agent.ask(QUESTION)
                self.rollouts.append((self.agent.context[: -len(final.output)], final))
            self.agent.close()
            self.http_answer = http_answer(origin, self.rollouts[-1][0])
        except BaseException as exc:
            self.failure = exc
        finally:
            self.agent.close()


@dataclass
class Outcome:
    """What a run under restarts gave."""

    workers: int
    restarts: int
    clients: list[Client]
    stored: set[str]

    @property
    def rollouts(self) -> int:
        return sum(len(client.rollouts) for client in self.clients)

    @property
    def resends(self) -> list[Resend]:
        return [resend for client in self.clients for resend in client.agent.resends]

    @property
    def causes(self) -> collections.Counter[str]:
        return collections.Counter(resend.cause for resend in self.resends)

    def figure(self) -> str:
        lost = sum(1 for c in self.clients for id_ in c.received if id_ not in self.stored)
        causes = ", ".join(f"{count} after {cause}" for cause, count in self.causes.most_common())
        return (
            f"{self.rollouts} rollouts of {TOOL_CALLS + 1} turns by {len(self.clients)} "
            f"clients during {self.restarts} rolling restart(s) of {self.workers} workers: "
            f"{lost} lost responses, every rollout finished; "
            f"{len(self.resends)} turns sent again after their socket closed ({causes}), "
            f"{sum(resend.begun for resend in self.resends)} of them begun on the old worker"
        )


def stored_ids(url: str) -> set[str]:
    """The ids of every response in Redis."""
    client = redis.Redis.from_url(url)
    try:
        return {key.decode().rsplit(":r:", 1)[1] for key in client.scan_iter("*:r:*")}
    finally:
        client.close()


def run_under_restarts(
    tmp_path: Path, *, workers: int, clients: int, restarts: int
) -> tuple[Outcome, ServeProcess]:
    flags = ["--workers", str(workers), "--tool-calls", str(TOOL_CALLS)]
    flags += ["--tokens-per-second", TOKENS_PER_SECOND]
    with (
        RedisServer() as redis_server,
        ws_mode_serve(*flags, "--store", redis_server.url, cwd=tmp_path) as served,
    ):
        pid = served.process.pid
        current = wait_for_workers(pid, workers)
        openai = OpenAI(base_url=served.origin + "/v1", api_key="-", max_retries=0, timeout=30)
        runners: list[Client] = []
        for _ in range(clients):
            runner = Client(ResumingAgent(openai, model="m", out=open(os.devnull, "w")))  # noqa: SIM115
            runner.agent.on_event = runner.record
            runners.append(runner)
        stop = threading.Event()
        threads = [
            threading.Thread(target=runner.run, args=(served.origin, stop)) for runner in runners
        ]
        for thread in threads:
            thread.start()
        try:
            # Every client holds a socket on an old worker before the restart begins.
            deadline = time.monotonic() + 60
            while not all(runner.received or runner.failure for runner in runners):
                assert time.monotonic() < deadline, "the clients did not start"
                time.sleep(0.02)
            for _ in range(restarts):
                os.kill(pid, signal.SIGHUP)
                current = replaced(pid, current, timeout=120)
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
            for runner in runners:
                runner.agent.out.close()
        assert not any(thread.is_alive() for thread in threads)
        outcome = Outcome(workers, restarts, runners, stored_ids(redis_server.url))
    return outcome, served


def check(outcome: Outcome) -> None:
    for client in outcome.clients:
        assert client.failure is None, repr(client.failure)
        assert client.rollouts
        for _, final in client.rollouts:
            assert f"answered after {TOOL_CALLS} tool calls" in final.output_text
        # The chain the workers rebuilt from the store is the client's history, item for item.
        assert client.http_answer == client.rollouts[-1][1].output_text
        # Its first socket's worker is gone: it came back at least once.
        assert client.agent.resends
        # Every continuation found its parent (none was sent again with the whole context).
        assert client.agent.whole_context_sends == 0
    assert all(id_ in outcome.stored for c in outcome.clients for id_ in c.received)
    # A cut socket's causes are the drain's: a close with 1001, or a turn refused while the
    # worker drained.
    assert set(outcome.causes) <= {"close 1001", "server_shutting_down"}, outcome.causes
    # The drain let every turn the old workers had begun finish: only turns they never ran
    # were sent again.
    assert not any(resend.begun for resend in outcome.resends), outcome.resends


def test_a_stopped_worker_finishes_its_turn_then_closes_with_1001_and_accepts_no_more(
    tmp_path: Path,
) -> None:
    """One worker told to stop (SIGTERM, as the restart tells it) in the middle of a turn:
    it stops accepting first, so a socket opened during its drain reaches the other worker
    and works (instead of a 426); the running turn finishes, and only then does its socket
    close, with 1001. The supervisor starts a worker in its place."""
    flags = ["--workers", "2", "--tool-calls", "0", "--tokens-per-second", "20"]
    with (
        RedisServer() as redis_server,
        ws_mode_serve(*flags, "--store", redis_server.url, cwd=tmp_path) as served,
    ):
        pid = served.process.pid
        port = int(served.origin.rsplit(":", 1)[1])
        before = wait_for_workers(pid, 2)
        with connect(served.origin) as socket:
            socket.send({"type": "response.create", "model": "m", "input": QUESTION})
            assert socket.receive(timeout=30)["type"] == "response.created"
            stopped = serving_worker(pid, port)
            os.kill(stopped, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while listens(stopped, port):
                assert time.monotonic() < deadline, "the stopped worker still accepts"
                time.sleep(0.01)
            with connect(served.origin) as other:  # the other worker's
                other.send({"type": "response.create", "model": "m", "generate": False})
                assert other.receive_turn(timeout=30)[-1]["type"] == "response.completed"
            events = socket.receive_turn(timeout=30)
            assert events[-1]["type"] == "response.completed"
            with pytest.raises(SocketClosed):
                socket.receive(timeout=30)
            assert socket.connection.close_code == 1001
        after = wait_for_workers(pid, 2, timeout=60, without=stopped)
        assert stopped not in after
        assert set(before) & set(after)  # only the stopped one was replaced


def test_a_rolling_restart_under_load_loses_nothing(tmp_path: Path) -> None:
    outcome, served = run_under_restarts(tmp_path, workers=2, clients=4, restarts=1)
    check(outcome)
    assert served.process.returncode == 0
    print(outcome.figure())


@pytest.mark.slow
def test_figure(tmp_path: Path) -> None:
    """The figure in docs/deployment.md: more clients, three workers, two restarts."""
    outcome, served = run_under_restarts(tmp_path, workers=3, clients=12, restarts=2)
    check(outcome)
    assert served.process.returncode == 0
    print(outcome.figure())
