"""The central property: a conversation driven incrementally over the socket gives the handler
exactly the context, and the client exactly the responses, that the same conversation driven
over plain HTTP with the full history gives.

Random conversations (`ws_mode.testing.conversations()`: tool calls and their outputs, forks
from older responses, fresh chains, recoveries with the full context, warm-ups, changing
instructions and tools, several lanes) run against the reference server under uvicorn, in both
`full_context` modes. The compatibility kit drives each one over a real socket and checks every
turn (the handler got the full-history context built from the outputs returned, the event
stream is valid); then the same turns are replayed over HTTP with the full history. The
reference model's answer depends on the whole context it receives, so equal outputs mean equal
contexts; the handler's requests over both transports are compared too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ws_mode import turn
from ws_mode.testing import DEFAULT_TOOLS, CompatibilityCheck, Conversation, conversations
from ws_mode.toolkit.reference import ReferenceConfig, create_app

COMPARED = ("status", "instructions", "tools", "tool_choice", "model", "usage", "output")
SOCKET_ONLY = ("type", "stream_id", "generate", "previous_response_id", "input")


class HTTPRecorder:
    """Records what the handler receives from plain HTTP requests (the kit records the
    socket's turns)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or turn(scope) is not None:
            await self.app(scope, receive, send)
            return
        message = await receive()
        body = json.loads(message["body"])
        raw_input = body.get("input")
        context = (
            [{"role": "user", "content": raw_input}] if isinstance(raw_input, str) else raw_input
        )
        self.calls.append(handler_request(body, context))
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return message
            return await receive()

        await self.app(scope, replay, send)


def handler_request(body: dict[str, Any], context: Any) -> dict[str, Any]:
    fields = ("instructions", "tools", "model", "stream")
    return {"context": context, **{key: body.get(key) for key in fields}}


def post(client: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = []
    with client.stream("POST", "/v1/responses", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    return events


@pytest.fixture(scope="module", params=["always", "on_miss"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[CompatibilityCheck, HTTPRecorder]]:
    http = HTTPRecorder(create_app(ReferenceConfig(tool_calls=2, answer_tokens=6)))
    with CompatibilityCheck(http, full_context=request.param) as check:
        yield check, http


@pytest.fixture(scope="module")
def client(server: tuple[CompatibilityCheck, HTTPRecorder]) -> Iterator[httpx.Client]:
    """One HTTP client for every example: a new one loads the CA bundle (~45 ms of CPU)."""
    check, _ = server
    with httpx.Client(base_url=check.base_url, timeout=10) as client:
        yield client


@settings(max_examples=50)
@given(program=conversations(models=["reference"], wrong_inputs=False))
def test_socket_conversation_equals_http_with_full_history(
    server: tuple[CompatibilityCheck, HTTPRecorder], client: httpx.Client, program: Conversation
) -> None:
    check, http = server
    # Over the socket: every turn's handler request is checked against the full history.
    over_socket = check.run(program)
    http.calls.clear()
    for via_socket in over_socket.turns:
        if not via_socket.step.generate:
            continue  # HTTP has no warm-up; its state is the context it prepared
        request = via_socket.request
        body = {key: value for key, value in request.items() if key not in SOCKET_ONLY}
        continued = request.get("previous_response_id") is not None
        body["input"] = via_socket.context if continued else request["input"]
        events = post(client, body)
        via_http = events[-1]["response"]
        # The client got the same response, event by event type.
        assert [event["type"] for event in events] == [e["type"] for e in via_socket.events]
        assert via_http["output"] == via_socket.output
        assert via_socket.response is not None
        for key in COMPARED:
            assert via_socket.response.get(key) == via_http.get(key), key
        # The handler got the same request over both transports.
        (socket_call,) = via_socket.calls
        assert http.calls == [handler_request(socket_call.body, socket_call.context)]
        http.calls.clear()


def test_the_property_can_fail(server: tuple[CompatibilityCheck, HTTPRecorder]) -> None:
    """A context that differs by one item changes the reference model's output."""
    check, _ = server
    tools = DEFAULT_TOOLS[1]
    request = {"model": "reference", "tools": tools, "input": "hello"}
    with httpx.Client(base_url=check.base_url, timeout=10) as client:
        outputs = []
        for result in ("result", "other result", "result"):
            first = post(client, request)[-1]["response"]["output"]
            (call,) = first
            answer = {"type": "function_call_output", "call_id": call["call_id"], "output": result}
            context = [{"role": "user", "content": "hello"}, *first, answer]
            outputs.append((first, post(client, {**request, "input": context})[-1]["response"]))
    (first_a, a), (first_b, b), (_, again) = outputs
    assert first_a == first_b
    assert a["output"] != b["output"]
    assert again["output"] == a["output"]
