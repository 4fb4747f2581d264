"""The central property: a conversation driven incrementally over the socket gives the handler
exactly the context, and the client exactly the responses, that the same conversation driven
over plain HTTP with the full history gives.

Random conversations (tool calls and their outputs, forks from older responses, fresh chains,
recoveries with the full context, warm-ups, changing instructions and tools, several lanes) run
against the reference server under uvicorn, once over HTTP and once over a real socket, in both
`full_context` modes. The reference model's answer depends on the whole context it receives,
so equal outputs mean equal contexts; the recorded handler requests are compared too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from websockets.sync.client import ClientConnection, connect

from ws_mode import WebSocketModeMiddleware, turn
from ws_mode.reference import ReferenceConfig, create_app

from .servers import serve

INSTRUCTIONS = [None, "Be brief.", "Use the tools."]
TOOLS: list[list[dict[str, Any]] | None] = [
    None,
    [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}],
    [
        {"type": "function", "name": "grep", "parameters": {"type": "object"}},
        {"type": "function", "name": "read_file", "parameters": {"type": "object"}},
    ],
]
LANES = [None, "main", "side"]


class Recorder:
    """Wraps the handler and records the context each call received, as the handler sees it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = json.loads(b"".join(chunks))
        current = turn(scope)
        raw_input = body.get("input")
        if current is not None and not current.full_context:
            context = current.history()
        elif isinstance(raw_input, str):
            context = [{"role": "user", "content": raw_input}]
        else:
            context = raw_input
        self.calls.append(
            {
                "context": context,
                "instructions": body.get("instructions"),
                "tools": body.get("tools"),
                "model": body.get("model"),
                "stream": body.get("stream"),
            }
        )
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


@dataclass
class Step:
    kind: str  # "continue", "fresh", "recover", "warm_up"
    parent: int  # index among the earlier responses (modulo their count)
    text: str
    as_string: bool  # send a user message as a plain string input
    instructions: str | None
    tools: list[dict[str, Any]] | None
    lane: str | None


steps = st.lists(
    st.builds(
        Step,
        kind=st.sampled_from(["continue", "continue", "continue", "fresh", "recover", "warm_up"]),
        parent=st.integers(0, 50),
        text=st.text(min_size=1, max_size=20),
        as_string=st.booleans(),
        instructions=st.sampled_from(INSTRUCTIONS),
        tools=st.sampled_from(TOOLS),
        lane=st.sampled_from(LANES),
    ),
    min_size=1,
    max_size=8,
)


@dataclass
class Result:
    """What one driver saw of one response."""

    context: list[dict[str, Any]]  # the full context the response was produced from
    output: list[dict[str, Any]]
    events: list[str]
    status: str
    response: dict[str, Any]


def new_input(step: Step, parent: Result | None) -> list[dict[str, Any]] | str:
    """The items the client sends: the tool's output when the parent asked for a tool."""
    calls = [item for item in (parent.output if parent else []) if item["type"] == "function_call"]
    if step.kind == "continue" and calls:
        return [
            {"type": "function_call_output", "call_id": call["call_id"], "output": step.text}
            for call in calls
        ]
    if step.as_string:
        return step.text
    return [{"role": "user", "content": step.text}]


def as_items(value: list[dict[str, Any]] | str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": value}] if isinstance(value, str) else value


def plan(step: Step, results: list[Result]) -> tuple[int | None, list[dict[str, Any]] | str]:
    """The index of the response a step continues (None for a new chain) and its input."""
    if step.kind == "fresh" or not results:
        return None, new_input(step, None)
    index = step.parent % len(results)
    parent = results[index]
    if step.kind == "recover":
        # The documented recovery: the full context, with previous_response_id null.
        return None, [*parent.context, *parent.output, *as_items(new_input(step, parent))]
    return index, new_input(step, parent)


def request_fields(step: Step) -> dict[str, Any]:
    fields: dict[str, Any] = {"model": "reference"}
    if step.instructions is not None:
        fields["instructions"] = step.instructions
    if step.tools is not None:
        fields["tools"] = step.tools
    return fields


def drive_http(base_url: str, program: list[Step]) -> list[Result]:
    results: list[Result] = []
    with httpx.Client(base_url=base_url, timeout=10) as client:
        for step in program:
            index, sent = plan(step, results)
            parent = results[index] if index is not None else None
            context = [*parent.context, *parent.output] if parent else []
            context += as_items(sent)
            if step.kind == "warm_up" and parent is not None:
                # HTTP has no warm-up; its state is the context it would have prepared.
                results.append(Result(context, [], ["warm_up"], "completed", {}))
                continue
            body = {**request_fields(step), "stream": True}
            body["input"] = sent if parent is None else context
            events = []
            with client.stream("POST", "/v1/responses", json=body) as response:
                assert response.status_code == 200
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
            final = events[-1]["response"]
            results.append(
                Result(
                    context, final["output"], [e["type"] for e in events], final["status"], final
                )
            )
    return results


def receive_response(socket: ClientConnection, lane: str | None) -> list[dict[str, Any]]:
    events = []
    while True:
        event = json.loads(socket.recv(timeout=10))
        assert event.get("stream_id") == lane, event
        events.append(event)
        if event["type"] in ("response.completed", "response.failed", "error"):
            return events


def drive_socket(base_url: str, program: list[Step]) -> list[Result]:
    results: list[Result] = []
    ids: list[str] = []
    with connect(base_url.replace("http", "ws", 1) + "/v1/responses", max_size=None) as socket:
        for step in program:
            index, sent = plan(step, results)
            parent = results[index] if index is not None else None
            message: dict[str, Any] = {"type": "response.create", **request_fields(step)}
            message["input"] = sent
            if index is not None:
                message["previous_response_id"] = ids[index]
            if step.lane is not None:
                message["stream_id"] = step.lane
            warm_up = step.kind == "warm_up" and parent is not None
            if warm_up:
                message["generate"] = False
            socket.send(json.dumps(message))
            events = receive_response(socket, step.lane)
            final = events[-1]
            assert final["type"] == "response.completed", final
            response = final["response"]
            assert response["previous_response_id"] == message.get("previous_response_id")
            context = [*parent.context, *parent.output] if parent else []
            context += as_items(sent)
            types = ["warm_up"] if warm_up else [e["type"] for e in events]
            results.append(Result(context, response["output"], types, response["status"], response))
            ids.append(response["id"])
    return results


@pytest.fixture(scope="module", params=["always", "on_miss"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, Recorder]]:
    recorder = Recorder(create_app(ReferenceConfig(tool_calls=2, answer_tokens=6)))
    app = WebSocketModeMiddleware(recorder, full_context=request.param)
    with serve(app, "uvicorn") as base_url:
        yield base_url, recorder


COMPARED = ("status", "instructions", "tools", "tool_choice", "model", "usage", "output")


@settings(max_examples=50)
@given(program=steps)
def test_socket_conversation_equals_http_with_full_history(
    server: tuple[str, Recorder], program: list[Step]
) -> None:
    base_url, recorder = server
    recorder.calls.clear()
    over_http = drive_http(base_url, program)
    http_calls = list(recorder.calls)
    recorder.calls.clear()
    over_socket = drive_socket(base_url, program)
    socket_calls = list(recorder.calls)

    # The handler got exactly the same requests: same contexts, instructions, tools.
    assert socket_calls == http_calls
    # The client got exactly the same responses, event by event type.
    for via_http, via_socket in zip(over_http, over_socket, strict=True):
        assert via_socket.events == via_http.events
        assert via_socket.context == via_http.context
        assert via_socket.output == via_http.output
        if via_http.events == ["warm_up"]:
            continue  # HTTP has no warm-up response to compare with
        for key in COMPARED:
            assert via_socket.response.get(key) == via_http.response.get(key), key


def test_the_property_can_fail(server: tuple[str, Recorder]) -> None:
    """A context that differs by one item changes the reference model's output."""
    base_url, _ = server
    program = [
        Step("fresh", 0, "hello", False, None, TOOLS[1], None),
        Step("continue", 0, "result", False, None, TOOLS[1], None),
    ]
    first = drive_http(base_url, program)
    program[1] = Step("continue", 0, "other result", False, None, TOOLS[1], None)
    second = drive_http(base_url, program)
    assert first[0].output == second[0].output
    assert first[1].output != second[1].output
