"""Interrupting a running answer of ``ws-mode serve --tool-calls 0 --tokens-per-second 10`` (a
slow, 40-word answer) with ``response.interrupt`` exactly as Codex sends it, directly and
through ``ws-mode proxy`` in front of it (real servers in child processes, a ``websockets``
client): three deltas in, the interrupt brings the acceptance, the open message interrupted and
``response.incomplete`` (reason ``interrupted``), never ``response.completed``; a continuation
completes on the same socket; unknown and finished ids fail with their codes; an unknown mode
gets an error and the response completes; the socket serves turns afterwards. Orderings are
asserted, not times (the interrupt takes 1 to 3 ms on loopback: docs/protocol.md)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

from tests.servers import ServeProcess, ws_mode_proxy, ws_mode_serve

RECV = 30.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    flags = ("--tool-calls", "0", "--tokens-per-second", "10")
    with ws_mode_serve(*flags, cwd=tmp_path_factory.mktemp("interrupt")) as process:
        yield process


class Socket:
    """A socket that records every event it receives."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.log: list[dict[str, Any]] = []

    def send(self, **frame: Any) -> None:
        self.ws.send(json.dumps(frame))

    def next(self) -> dict[str, Any]:
        event: dict[str, Any] = json.loads(self.ws.recv(RECV))
        self.log.append(event)
        return event

    def until(self, kind: str, count: int = 1) -> list[dict[str, Any]]:
        """The events up to the `count`-th of `kind`."""
        seen = []
        while sum(event["type"] == kind for event in seen) < count:
            seen.append(self.next())
        return seen


def interrupt(response_id: str, mode: str = "discard_partial_items") -> dict[str, Any]:
    return {"type": "response.interrupt", "response_id": response_id, "mode": mode}


def scenario(origin: str) -> list[dict[str, Any]]:
    """The whole story on one socket; every event it received."""
    with connect(origin.replace("http", "ws") + "/v1/responses") as ws:
        socket = Socket(ws)
        socket.send(type="response.create", model="m", input="Tell me a story.")
        seen = socket.until("response.output_text.delta", 3)
        target = seen[0]["response"]["id"]
        message = next(e["item"]["id"] for e in seen if e["type"] == "response.output_item.added")
        socket.send(**interrupt(target))
        ended = socket.until("response.incomplete")
        assert [event["type"] for event in ended] == [
            "response.interrupt.accepted",
            "response.output_item.interrupted",
            "response.incomplete",
        ]
        assert ended[0]["response_id"] == target
        assert (ended[1]["response_id"], ended[1]["item_id"]) == (target, message)
        response = ended[2]["response"]
        assert (response["id"], response["status"]) == (target, "incomplete")
        assert response["incomplete_details"] == {"reason": "interrupted"}
        assert response["output"] == []  # the one message was open: discarded

        # The continuation, with an interrupt of an unknown mode while it streams.
        socket.send(type="response.create", model="m", input="Go on.", previous_response_id=target)
        seen = socket.until("response.output_text.delta")
        follow = seen[0]["response"]["id"]
        assert seen[0]["response"]["previous_response_id"] == target
        socket.send(**interrupt(follow, mode="keep_partial_items"))
        seen = socket.until("response.completed")
        errors = [event for event in seen if event["type"] == "error"]
        assert [(e["error"]["code"], e["error"]["param"]) for e in errors] == [
            ("invalid_value", "mode")
        ]
        assert seen[-1]["response"]["id"] == follow

        # Refusals, and a socket that serves on.
        answers = []
        for response_id in ("resp_unknown", follow, target):
            socket.send(**interrupt(response_id))
            answers.append(socket.next())
        assert [(a["type"], a["error"]["code"], a["response_id"]) for a in answers] == [
            ("response.interrupt.failed", "response_not_found", "resp_unknown"),
            ("response.interrupt.failed", "response_already_completed", follow),
            ("response.interrupt.failed", "response_already_completed", target),
        ]
        socket.send(type="response.create", model="m", input="Again.", previous_response_id=follow)
        last = socket.until("response.output_text.delta")[0]["response"]["id"]
        socket.send(**interrupt(last))
        assert socket.until("response.incomplete")[-1]["response"]["id"] == last
    return socket.log


@pytest.mark.timeout(120)
def test_interrupts_against_ws_mode_serve_and_through_ws_mode_proxy(served: ServeProcess) -> None:
    with ws_mode_proxy("--upstream", served.origin + "/v1") as proxied:
        logs: dict[str, list[dict[str, Any]]] = {}
        failures: list[BaseException] = []

        def run(name: str, origin: str) -> None:
            try:
                logs[name] = scenario(origin)
            except BaseException as exc:  # reported below, from the test's own thread
                failures.append(exc)

        # Both at once: each waits for one 40-word answer at 10 tokens per second.
        threads = [
            threading.Thread(target=run, args=(name, origin))
            for name, origin in (("serve", served.origin), ("proxy", proxied.origin))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if failures:
        raise failures[0]
    for log in logs.values():
        interrupted = {
            event["response"]["id"]
            for event in log
            if event["type"] == "response.incomplete"
            and event["response"]["incomplete_details"] == {"reason": "interrupted"}
        }
        completed = {e["response"]["id"] for e in log if e["type"] == "response.completed"}
        assert len(interrupted) == 2
        assert len(completed) == 1
        assert not interrupted & completed  # never response.completed for them
        assert not [event for event in log if event["type"] == "response.failed"]
