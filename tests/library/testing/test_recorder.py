"""The recorder (`ws_mode.testing._recorder`): it records a run's handler calls, whole body and
context, passes them on unchanged, and leaves other traffic alone."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from ws_mode.testing._recorder import RUN_HEADER, Recorder


class Echo:
    """Answers each request with the body it received."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        self.bodies.append(message["body"])


def call(app: Recorder, body: Any, headers: dict[str, str], method: str = "POST") -> None:
    raw = json.dumps(body).encode()
    chunks = [raw[:5], raw[5:]]
    scope: dict[str, Any] = {
        "type": "http",
        "method": method,
        "headers": [(name.encode(), value.encode()) for name, value in headers.items()],
        "extensions": {},
    }

    async def receive() -> Message:
        chunk = chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message: Message) -> None:
        pass

    asyncio.run(app(scope, receive, send))


def test_a_runs_calls_are_recorded_and_passed_on_whole() -> None:
    inner = Echo()
    recorder = Recorder(inner)
    body = {"model": "m", "input": "hi"}
    call(recorder, body, {"X-WS-Mode-Check": "run1"})
    call(recorder, body, {RUN_HEADER: "run2"})
    [recorded] = recorder.take("run1")
    assert recorded.body == body
    assert recorded.context == [{"role": "user", "content": "hi"}]  # a string is one message
    assert recorded.full_context
    assert not recorded.has_turn
    assert recorded.headers == {RUN_HEADER: "run1"}
    assert recorder.take("run1") == []  # taken once
    assert len(recorder.take("run2")) == 1
    assert [json.loads(raw) for raw in inner.bodies] == [body, body]


def test_other_traffic_is_not_recorded() -> None:
    inner = Echo()
    recorder = Recorder(inner)
    call(recorder, {"input": []}, {})  # no run's header, no ws_mode turn
    call(recorder, {"input": []}, {RUN_HEADER: "run"}, method="GET")
    assert recorder.take("run") == []
    assert len(inner.bodies) == 2
