"""Steering under random timing: whatever moment each steer arrives at, every submission is
answered at once (accepted or failed), and every accepted one is accounted for exactly once:
applied in a successor the middleware started (its input closes the successor's context, after
the steered response's output), or kept for the client (`response.steer.pending`), or returned
(`response.steer.failed` with its id). Successors continue the response they follow, on its
lane, and every response's events stay on that lane."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route
from websockets.sync.client import ClientConnection, connect

from tests.servers import serve
from ws_mode import WebSocketModeMiddleware

TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}
ANSWERS = {"response.steer.accepted", "response.steer.failed"}
QUIET = 0.5  # seconds without an event after which nothing more is expected


class Script:
    """A handler streaming `items` message items of `deltas` deltas each (a function call
    last when `call`), with a short pause before every delta; it records each context."""

    def __init__(self) -> None:
        self.contexts: list[list[dict[str, Any]]] = []
        self.lock = threading.Lock()
        self.middleware: WebSocketModeMiddleware | None = None

    async def handle(self, request: Request) -> StreamingResponse:
        body = await request.json()
        with self.lock:
            self.contexts.append(body["input"])
            number = len(self.contexts)
        shape = body["metadata"]
        return StreamingResponse(
            self._events(number, int(shape["items"]), int(shape["deltas"]), shape["call"] == "1"),
            media_type="text/event-stream",
        )

    async def _events(self, number: int, items: int, deltas: int, call: bool) -> AsyncIterator[str]:
        response = {"id": f"resp_{number}", "object": "response", "status": "in_progress",
                    "output": []}  # fmt: skip
        sequence = 0

        def event(kind: str, **fields: Any) -> str:
            nonlocal sequence
            data = {"type": kind, "sequence_number": sequence, **fields}
            sequence += 1
            return f"event: {kind}\ndata: {json.dumps(data)}\n\n"

        yield event("response.created", response=response)
        output: list[dict[str, Any]] = []
        for index in range(items):
            text = "w " * deltas
            part = {"type": "output_text", "text": text, "annotations": []}
            item = {"type": "message", "id": f"msg_{number}_{index}", "role": "assistant",
                    "status": "completed", "content": [part]}  # fmt: skip
            yield event("response.output_item.added", output_index=index,
                        item={**item, "content": [], "status": "in_progress"})  # fmt: skip
            for _ in range(deltas):
                await asyncio.sleep(0.002)
                yield event("response.output_text.delta", item_id=item["id"], output_index=index,
                            content_index=0, delta="w ")  # fmt: skip
            yield event("response.output_item.done", output_index=index, item=item)
            output.append(item)
        if call:
            item = {"type": "function_call", "id": f"fc_{number}", "call_id": f"call_{number}",
                    "name": "f", "arguments": "{}", "status": "completed"}  # fmt: skip
            yield event("response.output_item.done", output_index=len(output), item=item)
            output.append(item)
        yield event("response.completed", response={**response, "status": "completed",
                                                     "output": output})  # fmt: skip


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Script, str]]:
    script = Script()
    app = WebSocketModeMiddleware(
        Starlette(routes=[Route("/v1/responses", script.handle, methods=["POST"])])
    )
    script.middleware = app
    with serve(app) as base_url:
        yield script, base_url.replace("http", "ws", 1) + "/v1/responses"


def _read(socket: ClientConnection, timeout: float = 20.0) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(socket.recv(timeout=timeout))
    return event


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    items=st.integers(1, 3),
    deltas=st.integers(1, 6),
    call=st.booleans(),
    steers=st.lists(st.integers(0, 12), min_size=1, max_size=4),
    lane=st.sampled_from([None, "a"]),
)
def test_every_accepted_steer_is_accounted_for_once(
    served: tuple[Script, str],
    items: int,
    deltas: int,
    call: bool,
    steers: list[int],
    lane: str | None,
) -> None:
    script, url = served
    on_lane = {"stream_id": lane} if lane else {}
    metadata = {"items": str(items), "deltas": str(deltas), "call": "1" if call else "0"}
    with connect(url) as socket:
        socket.send(json.dumps({"type": "response.create", "model": "m", "input": "go",
                                "metadata": metadata, **on_lane}))  # fmt: skip
        first = _read(socket)
        assert first["type"] == "response.created"
        target = first["response"]["id"]
        with script.lock:
            start = len(script.contexts)
        events: list[dict[str, Any]] = [first]
        sent: list[str] = []
        waits = sorted(steers)  # steer after this many further events (0: at once)
        seen = 0
        while waits:
            if waits[0] <= seen or _finished(events, target):
                text = f"steer {len(sent)}"
                socket.send(json.dumps({"type": "response.steer", "previous_response_id": target,
                                        "input": text}))  # fmt: skip
                sent.append(text)
                waits.pop(0)
                continue
            events.append(_read(socket))
            seen += 1
        # Then everything that follows, until the socket has been quiet for a while after the
        # target finished and every steer was answered (successors start at once).
        while True:
            try:
                events.append(_read(socket, QUIET))
            except TimeoutError:
                answered = sum(e["type"] in ANSWERS for e in events)
                if _finished(events, target) and answered >= len(sent):
                    break
    answers = [e for e in events if e["type"].startswith("response.steer.")]
    accepted = {e["steer"]["id"] for e in answers if e["type"] == "response.steer.accepted"}
    refused = [
        e for e in answers if e["type"] == "response.steer.failed" and "id" not in e["steer"]
    ]
    # Every submission answered at once: accepted, or refused because the target had finished.
    assert len(accepted) + len(refused) == len(sent)
    assert all(e["error"]["code"] == "response_already_completed" for e in refused)
    pending = {e["steer"]["id"] for e in answers if e["type"] == "response.steer.pending"}
    returned = {e["steer"]["id"] for e in answers if e["type"] == "response.steer.failed"
                and "id" in e["steer"]}  # fmt: skip
    successors = [e["response"] for e in events if e["type"] == "response.created"][1:]
    with script.lock:
        contexts = script.contexts[start - 1 :]
    # What each successor applied: the steering messages closing its context (earlier ones
    # are history by then).
    applied = [text for context in contexts[1:] for text in _trailing_steers(context)]
    # Applied in successors, kept for the client, or returned: each accepted steer once.
    assert len(applied) + len(pending) + len(returned) == len(accepted)
    assert len(set(applied)) == len(applied), applied
    assert not (pending & returned)
    if pending:
        assert call  # only a response waiting for its call keeps input
        assert not successors
    # Each successor continues the response before it, on the lane.
    ids = [target, *(response["id"] for response in successors)]
    for before, response in zip(ids, successors, strict=False):
        assert response["previous_response_id"] == before
    assert all(e.get("stream_id") == lane for e in events)
    # A steered response ended at an item boundary, and its successor's context ends with
    # the steered output, then the steering input.
    for e in events:
        if e["type"] == "response.incomplete":
            assert e["response"]["incomplete_details"] == {"reason": "steered"}
            assert all(item["type"] == "message" for item in e["response"]["output"])
    for context in contexts[1:]:
        assert context[-1]["content"].startswith("steer ")
    # Whatever became of the input, nothing of it (or of the socket) stays reserved in the
    # memory budget once the socket has closed.
    assert script.middleware is not None
    budget = script.middleware.settings.budget
    for _ in range(500):
        if script.middleware.connections == 0 and budget.held == 0:
            break
        time.sleep(0.01)
    assert budget.held == 0


def _finished(events: list[dict[str, Any]], target: str) -> bool:
    return any(e["type"] in TERMINAL and e.get("response", {}).get("id") == target for e in events)


def _trailing_steers(context: list[dict[str, Any]]) -> list[str]:
    texts: list[str] = []
    for item in reversed(context):
        content = item.get("content")
        if item.get("role") != "user" or not str(content).startswith("steer "):
            break
        texts.append(str(content))
    return texts[::-1]
