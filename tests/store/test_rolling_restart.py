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

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.redis_server import RedisServer
from tests.rolling import Rolled, converse, http_answer
from tests.serve_workers import listens, replaced, serving_worker, wait_for_workers
from tests.servers import ServeProcess, ws_mode_serve
from ws_mode.testing._client import SocketClosed, connect

TOOL_CALLS = 3
#: Turns of a few tenths of a second: a restart finds turns running.
TOKENS_PER_SECOND = "100"
QUESTION = "Plan the release."


@dataclass
class Outcome:
    """What a run under restarts gave: the conversations (one question each, answered after
    the tool calls), and the ids of the responses in Redis."""

    workers: int
    restarts: int
    rolled: Rolled
    stored: set[str]
    #: What plain HTTP answers for each client's last conversation, asked after the restarts.
    http_answers: list[str]

    def figure(self) -> str:
        lost = sum(1 for id_ in self.rolled.received if id_ not in self.stored)
        resends = self.rolled.resends
        causes = ", ".join(f"{n} after {cause}" for cause, n in self.rolled.causes.most_common())
        return (
            f"{self.rolled.finished} rollouts of {TOOL_CALLS + 1} turns by "
            f"{len(self.rolled.clients)} clients during {self.restarts} rolling restart(s) of "
            f"{self.workers} workers: {lost} lost responses, every rollout finished; "
            f"{len(resends)} turns sent again after their socket closed ({causes}), "
            f"{sum(resend.begun for resend in resends)} of them begun on the old worker"
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

        def roll() -> None:  # every client holds a socket on an old worker by now
            nonlocal current
            for _ in range(restarts):
                os.kill(pid, signal.SIGHUP)
                current = replaced(pid, current, timeout=120)

        rolled = converse(served.origin, clients=clients, turns=1, roll=roll)
        answers = [
            http_answer(served.origin, client.conversations[-1].history)
            for client in rolled.clients
            if client.conversations
        ]
        outcome = Outcome(workers, restarts, rolled, stored_ids(redis_server.url), answers)
    return outcome, served


def check(outcome: Outcome) -> None:
    rolled = outcome.rolled
    assert not rolled.lost, rolled.lost
    assert len(outcome.http_answers) == len(rolled.clients)  # each client finished one
    for client, answer in zip(rolled.clients, outcome.http_answers, strict=True):
        for conversation in client.conversations:
            assert f"answered after {TOOL_CALLS} tool calls" in conversation.final.output_text
        # The chain the workers rebuilt from the store is the client's history, item for item.
        assert answer == client.conversations[-1].final.output_text
        # Its first socket's worker is gone: it came back at least once.
        assert client.agent.resends
        # Every continuation found its parent (none was sent again with the whole context).
        assert client.agent.whole_context_sends == 0
    assert all(id_ in outcome.stored for id_ in rolled.received)
    # A cut socket's causes are the drain's: a close with 1001, or a turn refused while the
    # worker drained.
    assert set(rolled.causes) <= {"close 1001", "server_shutting_down"}, rolled.causes
    # The drain let every turn the old workers had begun finish: only turns they never ran
    # were sent again.
    assert not any(resend.begun for resend in rolled.resends), rolled.resends


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
