"""A handler that ignores cancellation holds nothing (`Limits.abandon_handler_seconds`): real
uvicorn, a real `websockets` client, a handler that swallows every `CancelledError`
(`tests/stubborn_handler.py`). Once ws_mode has decided a turn is over, the client gets its
terminal event and the lane's next request runs at once: for an interrupt and for
`max_turn_seconds`. When the client leaves, the connection and the memory budget are let go
once the handler is abandoned (counted, logged once); `ws_mode.server.Server` and plain
uvicorn (SIGTERM, in a child process) exit instead of waiting for the handler. A synchronous
handler blocked in a thread (asgiref's `sync_to_async`, as Django runs views) holds the lane no
more than an async one."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect as connect_async
from websockets.sync.client import ClientConnection, connect

from tests.library.test_server import HANG, config, running, until_closed
from tests.servers import serve
from tests.stubborn_handler import Stubborn
from ws_mode import Limits, WebSocketModeMiddleware
from ws_mode.server import Server
from ws_mode.testing._loopback import server_process

#: A bound on what must not hang (never a speed).
RECV = 15.0
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}


def receive(ws: ClientConnection) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(ws.recv(RECV))
    return event


def read_until(ws: ClientConnection, kinds: set[str]) -> list[dict[str, Any]]:
    """The events received up to the first of `kinds`, that one included."""
    seen = [receive(ws)]
    while seen[-1]["type"] not in kinds:
        seen.append(receive(ws))
    return seen


def create(model: str, **fields: Any) -> str:
    return json.dumps({"type": "response.create", "model": model, "input": "hi", **fields})


def wait_for(condition: Any) -> None:
    deadline = time.monotonic() + RECV  # a hang, not a speed
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


@pytest.fixture
def stubborn() -> Iterator[Stubborn]:
    handler = Stubborn()
    yield handler
    handler.release()  # whatever still runs of it ends with the test


def served(
    handler: Stubborn, server: str = "uvicorn", **limits: Any
) -> tuple[WebSocketModeMiddleware, Any]:
    middleware = WebSocketModeMiddleware(handler, limits=Limits(**limits))
    return middleware, serve(middleware, server)


@pytest.mark.parametrize("model", ["stubborn", "threaded"])
def test_an_interrupt_gets_its_terminal_and_the_lane_s_next_create_runs(
    stubborn: Stubborn, model: str
) -> None:
    """Also for a synchronous handler blocked in a thread (asgiref, as under Django), whose
    cancellation asgiref lets through while the thread runs on."""
    # An abandon grace longer than the test: nothing here may wait for it.
    _, server = served(stubborn, abandon_handler_seconds=600)
    with server as base, connect(base.replace("http", "ws") + "/v1/responses") as ws:
        ws.send(create(model, stream_id="main"))
        created = receive(ws)
        assert created["type"] == "response.created"
        target = created["response"]["id"]
        # In its model call (its thread blocked) when the interrupt comes, not before.
        wait_for(lambda: (stubborn.running if model == "stubborn" else stubborn.blocked) == 1)
        ws.send(create("quick", stream_id="main"))  # waits on the lane behind it
        ws.send(json.dumps({"type": "response.interrupt", "response_id": target,
                            "mode": "discard_partial_items"}))  # fmt: skip
        interrupted = read_until(ws, TERMINAL)
        following = read_until(ws, TERMINAL)
        # It still runs (its thread is still blocked): nothing waited for it.
        assert (stubborn.running if model == "stubborn" else stubborn.blocked) == 1
        stubborn.release()  # now it may end: the server stops without waiting for it
    assert [event["type"] for event in interrupted] == [
        "response.interrupt.accepted",
        "response.incomplete",
    ]
    assert interrupted[-1]["response"]["id"] == target
    assert [event["type"] for event in following] == ["response.created", "response.completed"]
    assert following[-1]["response"]["id"] == "resp_quick_2"
    # What it sent after its cancellation went nowhere: no event of its after the terminal.
    assert all(event["response"]["id"] != target for event in following)


def test_max_turn_seconds_sends_its_terminal_and_the_lane_goes_on(stubborn: Stubborn) -> None:
    middleware, server = served(stubborn, max_turn_seconds=1.0, abandon_handler_seconds=600)
    with server as base, connect(base.replace("http", "ws") + "/v1/responses") as ws:
        ws.send(create("stubborn", stream_id="main"))
        ws.send(create("quick", stream_id="main"))
        first = read_until(ws, TERMINAL)
        following = read_until(ws, TERMINAL)
        assert stubborn.running == 1
        stubborn.release()  # now it may end: the server stops without waiting for it
    # (Its response.created comes first, unless a loaded machine let the deadline pass before.)
    assert first[-1]["type"] == "error"
    assert first[-1]["error"]["code"] == "turn_timeout"
    assert [event["type"] for event in following] == ["response.created", "response.completed"]
    assert middleware.stats.errors["turn_timeout"] == 1


@pytest.mark.parametrize("server_name", ["uvicorn", "hypercorn"])
def test_a_client_leaving_frees_its_connection_and_budget_once_the_handler_is_abandoned(
    stubborn: Stubborn, caplog: pytest.LogCaptureFixture, server_name: str
) -> None:
    caplog.set_level(logging.WARNING, logger="ws_mode")
    middleware, server = served(stubborn, server_name, abandon_handler_seconds=0.3)
    stats = middleware.stats
    with server as base:
        with connect(base.replace("http", "ws") + "/v1/responses") as ws:
            ws.send(create("stubborn", stream_id="main"))
            target = receive(ws)["response"]["id"]
            assert stats.snapshot()["memory_held_bytes"] > 0
        # The connection, the handler's request in the budget: all let go, the handler not.
        wait_for(lambda: stats.connections_open == 0)
        wait_for(lambda: stats.snapshot()["memory_held_bytes"] == 0)
        assert stats.handlers_abandoned == 1
        assert stubborn.running == 1
        assert stubborn.cancels >= 1
        if server_name == "hypercorn":
            # The test runner's hypercorn thread closes its loop without cancelling what still
            # runs (hypercorn's own runner, like asyncio.run, cancels it, and the abandoned
            # call's task then ends at once): the handler is let go first.
            stubborn.release()
            wait_for(lambda: stubborn.running == 0)
    said = [record for record in caplog.records if "abandoned the handler" in record.getMessage()]
    assert len(said) == 1
    assert said[0].levelno == logging.WARNING
    assert "/v1/responses" in said[0].getMessage()
    assert target in said[0].getMessage()


@pytest.mark.anyio
async def test_server_drains_and_exits_past_a_handler_that_ignores_cancellation(
    stubborn: Stubborn,
) -> None:
    limits = Limits(shutdown_grace_seconds=0.3, abandon_handler_seconds=0.3)
    middleware = WebSocketModeMiddleware(stubborn, limits=limits)
    server = Server(config(middleware), gc_threshold=None)
    # `running` tells the server to exit on the way out and fails if it does not within HANG.
    async with running(server) as base_url, connect_async(base_url + "/v1/responses") as socket:
        await socket.send(create("stubborn"))
        async with asyncio.timeout(HANG):
            created = json.loads(await socket.recv())
        assert created["type"] == "response.created"
        server.should_exit = True
        kinds, code = await until_closed(socket)
    assert "response.completed" not in kinds
    assert code == 1001
    assert middleware.stats.handlers_abandoned == 1
    assert middleware.stats.connections_open == 0
    assert stubborn.running == 1  # still there: abandoned, not waited for


def _exited(pid: int, seconds: float) -> bool:
    """Whether the child `pid` exited within `seconds` (reaped here)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return True
        time.sleep(0.05)
    return False


def test_plain_uvicorn_exits_on_sigterm_past_a_handler_that_ignores_cancellation(
    tmp_path: Path,
) -> None:
    log = tmp_path / "child.log"
    arguments = ["--log", str(log), "--grace", "0.3", "--abandon", "0.3"]
    with (
        server_process("tests.stubborn_handler", arguments, lifetime=120) as child,
        connect(child.base_url.replace("http", "ws") + "/v1/responses") as ws,
    ):
        ws.send(create("stubborn"))
        assert receive(ws)["type"] == "response.created"
        os.kill(child.pid, signal.SIGTERM)
        # Generous: a hang, not a speed (before, it never exited).
        assert _exited(child.pid, 60), log.read_text()
    output = log.read_text()
    assert "abandoned the handler at /v1/responses" in output
    assert "Task was destroyed" not in output
    assert "Traceback" not in output
    assert "Exception ignored" not in output
