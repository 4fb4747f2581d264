"""Apps and stacks the kit's tests check: correct handlers (the reference server, a random one
that answers like a real model), handlers streaming given events, and layers that break a
stack the ways users' stacks break."""

from __future__ import annotations

import hashlib
import json
import random
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ws_mode import Turn, turn
from ws_mode._handler_call import replay_body
from ws_mode.testing import CompatibilityError, Conversation, Step, check_conversation
from ws_mode.toolkit.reference import ReferenceConfig, create_app

TOOLS = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}, "strict": False}]

# Fresh, continued with tool outputs, forked, recovered, warmed up, on two lanes.
PROGRAM = Conversation(
    (
        Step("fresh", tools=TOOLS, lane="main"),
        Step("continue", tools=TOOLS, lane="main", form="string"),
        Step("fork", parent=0, form="parts", instructions="Be brief."),
        Step("recover", parent=1, generate=False, form="empty", tools=TOOLS),
        Step("continue", form="developer", lane="side"),
        Step("continue", fields={"store": False, "metadata": {"k": "v"}}),
    )
)
TWO_TURNS = [Step("fresh", tools=TOOLS), Step("continue", tools=TOOLS)]

SDK_MESSAGE = {
    "type": "message",
    "id": "msg_1",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_text", "text": "hi", "annotations": []}],
}


def reference() -> ASGIApp:
    return create_app(ReferenceConfig(tool_calls=2, answer_tokens=6))


def expect_failure(
    middleware: Callable[[ASGIApp], ASGIApp], program: list[Step], turn: int, expected: list[str]
) -> None:
    """Checking the reference server under `middleware` fails at `turn`, with a message that
    names the turn and contains each of `expected`."""
    with pytest.raises(CompatibilityError) as caught:
        check_conversation(reference(), program, middleware=middleware)
    error = caught.value
    assert isinstance(error, AssertionError)
    assert error.turn == turn, str(error)
    message = str(error)
    assert message.startswith(f"ws_mode compatibility check failed at turn {turn} (from 0) of ")
    for words in expected:
        assert words in message, message
    assert len(message) < 4000


# A handler whose answers change from call to call, like a real model.


def random_app(*, seed: int | None = None) -> Starlette:
    """A stateless handler answering at random: text or tool calls with fresh ids, streamed or
    as one JSON object, sometimes incomplete."""
    rng = random.Random(seed)

    async def create(request: Request) -> Response:
        body = await request.json()
        tools = [tool for tool in body.get("tools") or [] if tool.get("type") == "function"]
        output: list[dict[str, Any]] = []
        if tools and rng.random() < 0.5:
            for _ in range(rng.randint(1, 2)):
                output.append(
                    {
                        "type": "function_call",
                        "id": "fc_" + secrets.token_hex(6),
                        "call_id": "call_" + secrets.token_hex(6),
                        "name": rng.choice(tools)["name"],
                        "arguments": json.dumps({"word": secrets.token_hex(3)}),
                        "status": "completed",
                    }
                )
        else:
            words = [secrets.token_hex(rng.randint(1, 4)) for _ in range(rng.randint(1, 6))]
            text = " ".join(words)
            output.append(
                {
                    "type": "message",
                    "id": "msg_" + secrets.token_hex(6),
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            )
        status = "incomplete" if rng.random() < 0.1 else "completed"
        response = {
            "id": "resp_" + secrets.token_hex(12),
            "object": "response",
            "created_at": int(time.time()),
            "status": status,
            "model": body.get("model"),
            "output": output,
            "previous_response_id": None,
            "instructions": body.get("instructions"),
            "tools": body.get("tools") or [],
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status != "completed"
            else None,
        }
        if rng.random() < 0.2:
            return JSONResponse(response)  # ws_mode synthesizes the lifecycle events
        return StreamingResponse(sse(response), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/responses", create, methods=["POST"])])


async def sse(response: dict[str, Any]) -> AsyncIterator[str]:
    started = {**response, "status": "in_progress", "output": []}
    events: list[dict[str, Any]] = [{"type": "response.created", "response": started}]
    for index, item in enumerate(response["output"]):
        events.append({"type": "response.output_item.added", "output_index": index, "item": item})
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": f"response.{response['status']}", "response": response})
    for number, event in enumerate(events):
        event["sequence_number"] = number
        yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


# Handlers streaming given events.


def handler(answer: Callable[[dict[str, Any], int], list[dict[str, Any]]]) -> Starlette:
    """A handler streaming the events `answer(body, call_number)` returns."""
    calls = 0

    async def create(request: Request) -> Response:
        nonlocal calls
        body = await request.json()
        events = answer(body, calls)
        calls += 1

        async def stream() -> AsyncIterator[str]:
            for event in events:
                yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/responses", create, methods=["POST"])])


def lifecycle(
    output: list[dict[str, Any]],
    *,
    response_id: str | None = None,
    numbers: tuple[int, int] = (0, 1),
) -> list[dict[str, Any]]:
    """`response.created` then `response.completed` with `output`."""
    done = {
        "id": response_id or "resp_" + secrets.token_hex(8),
        "object": "response",
        "created_at": 0,
        "status": "completed",
        "model": "m",
        "output": output,
    }
    return [
        {
            "type": "response.created",
            "sequence_number": numbers[0],
            "response": {**done, "output": []},
        },
        {"type": "response.completed", "sequence_number": numbers[1], "response": done},
    ]


# Layers that break a stack.


class BodyEdit:
    """Sits between the middleware and the handler and edits each request body."""

    def __init__(self, app: ASGIApp, edit: Callable[[dict[str, Any]], None]) -> None:
        self.app, self.edit = app, edit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        message = await receive()
        body = json.loads(message["body"])
        self.edit(body)
        await self.app(scope, replay_body(json.dumps(body).encode(), receive), send)


class FrameEdit:
    """Wraps the middleware and rewrites each event frame it sends into zero or more frames."""

    def __init__(self, app: ASGIApp, edit: Callable[[dict[str, Any]], list[Any]]) -> None:
        self.app, self.edit = app, edit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return

        async def edited(message: Message) -> None:
            if message["type"] != "websocket.send" or message.get("text") is None:
                await send(message)
                return
            for frame in self.edit(json.loads(message["text"])):
                text = frame if isinstance(frame, str) else json.dumps(frame)
                await send({"type": "websocket.send", "text": text})

        await self.app(scope, receive, edited)


class WrongParent:
    """Sits between a cache-aware middleware and the handler and hands it the Turn of the
    grandparent, as a cache that resolved the wrong response would."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        current = turn(scope)
        if current is not None and current.previous is not None and not current.full_context:
            wrong = Turn(
                previous=current.previous.parent,
                new_input=current.new_input,
                full_context=False,
            )
            scope = {**scope, "extensions": {**scope["extensions"], "ws_mode": wrong}}
        await self.app(scope, receive, send)


# A small deterministic model, with switches for the bugs the kit must catch.


def model_app(
    *,
    last_item_only: bool = False,
    read_turn: bool = True,
    refuse_unknown_calls: bool = True,
    number_completed: bool = True,
    random_tools: random.Random | None = None,
) -> Starlette:
    """A handler answering from a digest of its whole context, as a model would: a tool call
    when tools are offered and the digest (or `random_tools`, shared by every call) says so
    after a user message, else a message naming the digest. The switches are bugs: answer
    from the `last_item_only`, never `read_turn` (a cache-aware handler that ignores
    `ws_mode.turn()`), accept outputs of unknown calls (`refuse_unknown_calls=False`), and
    send `response.completed` without its `sequence_number` (`number_completed=False`)."""

    async def create(request: Request) -> Response:
        body = await request.json()
        raw = body.get("input")
        context = [{"role": "user", "content": raw}] if isinstance(raw, str) else list(raw)
        current = turn(request)
        if read_turn and current is not None and not current.full_context:
            context = current.history()
        calls = {item.get("call_id") for item in context if item.get("type") == "function_call"}
        for item in context:
            if (
                refuse_unknown_calls
                and item.get("type") == "function_call_output"
                and item.get("call_id") not in calls
            ):
                message = (
                    f"No tool call found for function call output with call_id {item['call_id']}."
                )
                error = {"type": "invalid_request_error", "code": None, "message": message}
                return JSONResponse({"error": {**error, "param": "input"}}, status_code=400)
        if last_item_only:
            context = context[-1:]
        digest = hashlib.sha256(json.dumps(context, sort_keys=True).encode()).hexdigest()[:12]
        tools = [tool for tool in body.get("tools") or [] if tool.get("type") == "function"]
        asked = context[-1].get("role") == "user" if context else False
        wants_tool = random_tools.random() < 0.5 if random_tools else int(digest, 16) % 2 == 0
        if tools and asked and wants_tool:
            item: dict[str, Any] = {
                "type": "function_call",
                "id": "fc_" + secrets.token_hex(6),
                "call_id": "call_" + secrets.token_hex(6),
                "name": tools[0]["name"],
                "arguments": json.dumps({"word": digest}),
                "status": "completed",
            }
        else:
            item = {**SDK_MESSAGE, "id": "msg_" + secrets.token_hex(6)}
            item["content"] = [{"type": "output_text", "text": f"[{digest}]", "annotations": []}]
        response = {
            "id": "resp_" + secrets.token_hex(12),
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": body.get("model"),
            "output": [item],
            "previous_response_id": None,
            "tools": body.get("tools") or [],
            "tool_choice": "auto",
            "parallel_tool_calls": True,
        }

        async def stream() -> AsyncIterator[str]:
            async for chunk in sse(response):
                if not number_completed and chunk.startswith("event: response.completed"):
                    event = json.loads(chunk.split("data: ", 1)[1])
                    del event["sequence_number"]
                    chunk = f"event: response.completed\ndata: {json.dumps(event)}\n\n"
                yield chunk

        return StreamingResponse(stream(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/responses", create, methods=["POST"])])
