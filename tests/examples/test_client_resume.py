"""`examples/client_resume.py`, the client that comes back, against `ws-mode serve --workers 2
--store redis://...` on a real Redis: the worker serving it is killed (SIGKILL) in the middle of
a turn, and the client sends that turn again on a new socket, from the last response it
received, which the other worker finds in the store; the rollout ends with the answer plain
HTTP gives for its whole history. Beside it, what the openai SDK's own `on_reconnecting` does
in the same spot: it reopens a socket, and the turn in flight is never answered on it.
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from openai import OpenAI
from openai.types.responses import ResponsesServerEvent
from openai.types.websocket_reconnection import ReconnectingEvent, ReconnectingOverrides

from examples.client_resume import RETRY_STATUSES, TOOLS, Resend, ResumingAgent
from tests.redis_server import RedisServer
from tests.rolling import http_answer
from tests.serve_workers import serving_worker, wait_for_workers
from tests.servers import ROOT, ws_mode_serve

TOOL_CALLS = 3
#: Slow enough that a turn is still running when the test reacts to its first event.
TOKENS_PER_SECOND = "40"
QUESTION = "Plan the release."


@dataclass
class Served:
    """`ws-mode serve` with two workers on one Redis."""

    pid: int
    port: int
    origin: str
    redis: redis.Redis

    def openai(self) -> OpenAI:
        return OpenAI(base_url=self.origin + "/v1", api_key="-", max_retries=0, timeout=20)

    def stored(self, response_id: str) -> bool:
        return bool(self.redis.keys(f"*:r:{response_id}"))

    def wait_stored(self, response_id: str, timeout: float = 10.0) -> None:
        """Until the response's background write has landed in Redis."""
        deadline = time.monotonic() + timeout
        while not self.stored(response_id):
            assert time.monotonic() < deadline, f"{response_id} never reached Redis"
            time.sleep(0.01)

    def kill_serving_worker(self) -> int:
        """SIGKILL the worker holding the (one) open client socket; its pid."""
        worker = serving_worker(self.pid, self.port)
        os.kill(worker, signal.SIGKILL)
        return worker


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    flags = ["--workers", "2", "--tool-calls", str(TOOL_CALLS)]
    flags += ["--tokens-per-second", TOKENS_PER_SECOND]
    with (
        RedisServer() as redis_server,
        ws_mode_serve(*flags, "--store", redis_server.url, cwd=tmp_path_factory.mktemp("w")) as s,
    ):
        wait_for_workers(s.process.pid, 2)
        client = redis.Redis.from_url(redis_server.url)
        try:
            port = int(s.origin.rsplit(":", 1)[1])
            yield Served(s.process.pid, port, s.origin, client)
        finally:
            client.close()


def test_a_turn_cut_by_a_killed_worker_is_sent_again_and_the_rollout_finishes(
    served: Served,
) -> None:
    killed: list[int] = []
    out = io.StringIO()

    def kill_during_turn_2(event: ResponsesServerEvent) -> None:
        if event.type == "response.created" and agent.turns == 2 and not killed:
            assert agent.last_id is not None
            served.wait_stored(agent.last_id)  # turn 1 is in Redis: only turn 2 is cut
            killed.append(served.kill_serving_worker())

    with ResumingAgent(served.openai(), model="m", on_event=kill_during_turn_2, out=out) as agent:
        final = agent.ask(QUESTION)
        history = agent.context[: -len(final.output)]

    assert killed, "the worker was never killed"
    # The socket dropped without a close frame in the middle of turn 2; sent once more, it
    # continued from turn 1's response, found in Redis by the other worker.
    assert agent.resends == [Resend(turn=2, attempt=1, cause="close 1006", begun=True)]
    assert agent.turns == TOOL_CALLS + 1
    assert f"answered after {TOOL_CALLS} tool calls" in final.output_text
    assert final.output_text == http_answer(served.origin, history)
    log = out.getvalue()
    assert log.count("[tool] lookup(") == TOOL_CALLS  # no tool ran twice
    assert agent.whole_context_sends == 0


def test_the_sdks_own_reconnect_opens_a_socket_but_never_resends_the_turn(
    served: Served,
) -> None:
    """`on_reconnecting` after the same kill: the SDK reopens (close 1006 is recoverable), but
    the new socket never hears of the turn in flight: the first thing it answers is a warm-up
    sent after the reconnect, and nothing of the cut turn ever comes."""
    reconnects: list[ReconnectingEvent] = []

    def on_reconnecting(event: ReconnectingEvent) -> ReconnectingOverrides | None:
        if not reconnects:  # sent while the SDK reconnects: queued, then sent on the new socket
            connection.response.create(model="m", input="warm-up", generate=False)
        reconnects.append(event)
        return None

    client = served.openai()
    with client.responses.connect(on_reconnecting=on_reconnecting) as connection:
        connection.response.create(model="m", input=QUESTION, tools=TOOLS, store=True)
        cut_id: str | None = None
        after: list[Any] = []
        for event in connection:
            if cut_id is None:
                if event.type == "response.created":
                    cut_id = event.response.id
                    served.kill_serving_worker()
                continue
            if reconnects:
                after.append(event)
                if event.type in ("response.completed", "response.failed", "error"):
                    break
    assert [event.close_code for event in reconnects] == [1006]
    assert [event.type for event in after] == ["response.created", "response.completed"]
    warm_up = after[-1].response
    assert warm_up.id != cut_id
    assert warm_up.output == []  # the warm-up: the cut turn was not sent again


def test_a_continuation_the_store_does_not_have_is_sent_with_the_whole_context(
    served: Served,
) -> None:
    out = io.StringIO()
    with ResumingAgent(served.openai(), model="m", out=out) as agent:
        agent.turn([{"role": "user", "content": QUESTION}])
        agent.last_id = "resp_unknown"  # as after the store lost it
        response = agent.turn([{"role": "user", "content": "Go on."}])
    assert "[previous response not found: sending the whole context]" in out.getvalue()
    assert agent.resends == []
    assert response.previous_response_id is None


def test_the_example_runs_from_the_command_line(served: Served) -> None:
    command = [sys.executable, str(Path(ROOT, "examples", "client_resume.py"))]
    command += ["--base-url", served.origin + "/v1", QUESTION]
    env = {**os.environ, "OPENAI_API_KEY": "-"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"> {QUESTION}"
    assert sum(line.startswith("[tool] lookup(") for line in lines) == TOOL_CALLS
    assert f"answered after {TOOL_CALLS} tool calls" in lines[-2]
    assert lines[-1] == f"[{TOOL_CALLS + 1} turns, 0 sent again]"


def test_the_docs_retry_the_statuses_the_example_retries() -> None:
    # docs/deployment.md's two lists of refused handshakes worth another try are the example's,
    # and neither names 426 (WebSocket mode off: the client goes on over HTTP, as Codex does).
    text = " ".join((ROOT / "docs" / "deployment.md").read_text().split())
    listed = re.findall(r"(?:answered|HTTP) ((?:\d{3}, )+\d{3},? (?:or )?\d{3})", text)
    assert len(listed) == 2, listed
    for statuses in listed:
        assert {int(code) for code in re.findall(r"\d{3}", statuses)} == RETRY_STATUSES
    assert "An upgrade answered 426 is not retried" in text
