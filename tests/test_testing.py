"""The compatibility kit (`ws_mode.testing`): it passes on correct apps, deterministic or not,
in both `full_context` modes and on the examples, and it fails, naming the turn and the
difference, on middlewares and handlers broken in the ways users' stacks break."""

from __future__ import annotations

import json
import random
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ws_mode import Turn, WebSocketModeMiddleware, turn
from ws_mode.reference import ReferenceConfig, create_app
from ws_mode.testing import (
    DEFAULT_LANES,
    CompatibilityCheck,
    CompatibilityChecks,
    CompatibilityError,
    Conversation,
    Step,
    check_conversation,
    conversations,
)

# The kit's fixture, loaded the way a user's project without the entry point loads it.
pytest_plugins = ["pytester", "ws_mode.testing"]

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


def reference() -> ASGIApp:
    return create_app(ReferenceConfig(tool_calls=2, answer_tokens=6))


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


# The kit on correct apps.


@pytest.fixture(scope="module", params=["always", "on_miss"])
def reference_check(request: pytest.FixtureRequest) -> Iterator[CompatibilityCheck]:
    with CompatibilityCheck(reference(), full_context=request.param) as check:
        yield check


@pytest.fixture(scope="module", params=["always", "on_miss"])
def random_check(request: pytest.FixtureRequest) -> Iterator[CompatibilityCheck]:
    with CompatibilityCheck(random_app(), full_context=request.param) as check:
        yield check


@settings(max_examples=100)
@given(program=conversations())
def test_reference_server_passes(
    reference_check: CompatibilityCheck, program: Conversation
) -> None:
    report = reference_check.run(program)
    assert len(report.turns) == len(program)


@settings(max_examples=100)
@given(program=conversations())
def test_non_deterministic_handler_passes(
    random_check: CompatibilityCheck, program: Conversation
) -> None:
    report = random_check.run(program)
    assert [turn.index for turn in report.turns] == list(range(len(program)))


def test_a_program_covers_every_kind_of_turn(reference_check: CompatibilityCheck) -> None:
    report = reference_check.run(PROGRAM)
    kinds = [turn.terminal for turn in report.turns]
    assert kinds == ["response.completed"] * len(PROGRAM)
    calls = [len(turn.calls) for turn in report.turns]
    assert calls == [1, 1, 1, 0, 1, 1]  # the warm-up never reaches the handler
    first, second = report.turns[0], report.turns[1]
    # The second turn answered the tool call the first one actually returned.
    call_id = first.output[0]["call_id"]
    assert second.request["input"][0] == {
        "type": "function_call_output",
        "call_id": call_id,
        "output": "Hello",
    }
    assert second.request["previous_response_id"] == first.response["id"]  # type: ignore[index]
    # The recovery resent the whole context, previous_response_id null.
    recovery = report.turns[3].request
    assert recovery["previous_response_id"] is None
    assert recovery["input"][: len(second.context)] == second.context
    cache_aware = reference_check.mode == "on_miss"
    assert [call.full_context for call in second.calls] == [not cache_aware]


def test_the_same_program_passes_against_different_answers() -> None:
    """Two runs of one program against a random handler differ, and both pass: the expected
    contexts are built from what each run returned."""
    with CompatibilityCheck(random_app(seed=1)) as check:
        first, second = check.run(PROGRAM), check.run(PROGRAM)
    assert [t.output for t in first.turns] != [t.output for t in second.turns]


@pytest.mark.parametrize("server", ["uvicorn", "hypercorn"])
def test_check_conversation_under_each_server(server: Any) -> None:
    report = check_conversation(reference(), PROGRAM, server=server)
    assert len(report.turns) == len(PROGRAM)
    assert "turn 5: continue" in str(report)


# The kit on broken stacks.


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
        encoded = json.dumps(body).encode()
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": encoded, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


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


def drop_first_item(body: dict[str, Any]) -> None:
    if isinstance(body.get("input"), list) and len(body["input"]) > 1:
        del body["input"][0]


def extra_after_terminal(event: dict[str, Any]) -> list[Any]:
    if event["type"] == "response.completed":
        return [event, {"type": "response.output_text.delta", "delta": "late"}]
    return [event]


def without_stream_id(event: dict[str, Any]) -> list[Any]:
    if event["type"] == "response.completed":
        event.pop("stream_id", None)
    return [event]


def wrong_previous_id(event: dict[str, Any]) -> list[Any]:
    if event["type"] == "response.completed":
        event["response"]["previous_response_id"] = None
    return [event]


def sse_framing(event: dict[str, Any]) -> list[Any]:
    return [f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"]


def stream_id_on_default_lane(event: dict[str, Any]) -> list[Any]:
    return [{**event, "stream_id": "main"}]


TWO_TURNS = [Step("fresh", tools=TOOLS), Step("continue", tools=TOOLS)]
ON_A_LANE = [Step("fresh", lane="main")]


@pytest.mark.parametrize(
    ("middleware", "program", "turn", "expected"),
    [
        pytest.param(
            lambda app: WebSocketModeMiddleware(BodyEdit(app, drop_first_item)),
            TWO_TURNS,
            1,
            ["did not receive the context", "expected 3 items, the handler received 2", "item 0"],
            id="drops-the-first-context-item",
        ),
        pytest.param(
            lambda app: WebSocketModeMiddleware(WrongParent(app), full_context="on_miss"),
            TWO_TURNS,
            1,
            ["compared with the Turn.history()", "expected 3 items, the handler received 1"],
            id="cache-aware-turn-with-the-wrong-parent",
        ),
        pytest.param(
            lambda app: FrameEdit(WebSocketModeMiddleware(app), extra_after_terminal),
            TWO_TURNS,
            0,
            ["after the turn's terminal event", '"delta":"late"'],
            id="event-after-the-terminal-one",
        ),
        pytest.param(
            lambda app: FrameEdit(WebSocketModeMiddleware(app), extra_after_terminal),
            [Step("fresh")],
            0,
            ["after the turn's terminal event"],
            id="event-after-the-last-terminal-one",
        ),
        pytest.param(
            lambda app: FrameEdit(WebSocketModeMiddleware(app), without_stream_id),
            ON_A_LANE,
            0,
            ["does not carry its lane's stream_id", "expected 'main', got None"],
            id="loses-the-stream-id",
        ),
        pytest.param(
            lambda app: FrameEdit(WebSocketModeMiddleware(app), stream_id_on_default_lane),
            [Step("fresh")],
            0,
            ["carries a stream_id on the default lane"],
            id="stream-id-on-the-default-lane",
        ),
        pytest.param(
            lambda app: FrameEdit(WebSocketModeMiddleware(app), wrong_previous_id),
            TWO_TURNS,
            1,
            ["does not echo the client's previous_response_id", "the response says None"],
            id="wrong-previous-response-id",
        ),
        pytest.param(
            lambda app: FrameEdit(WebSocketModeMiddleware(app), sse_framing),
            [Step("fresh")],
            0,
            ["SSE framing leaked onto the socket"],
            id="sse-framing",
        ),
        pytest.param(
            lambda app: WebSocketModeMiddleware(
                BodyEdit(app, lambda body: body.update(temperature=0))
            ),
            [Step("fresh")],
            0,
            ["request fields differ", "'temperature' is unexpected"],
            id="adds-a-field",
        ),
    ],
)
def test_a_broken_middleware_fails(
    middleware: Callable[[ASGIApp], ASGIApp],
    program: list[Step],
    turn: int,
    expected: list[str],
) -> None:
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


def test_hypothesis_finds_a_subtle_bug() -> None:
    """A middleware that loses the instructions only when tools are sent too: random programs
    find it, and the error names the turn that sent both."""

    def drop_instructions_with_tools(body: dict[str, Any]) -> None:
        if body.get("tools"):
            body.pop("instructions", None)

    def broken(app: ASGIApp) -> ASGIApp:
        return WebSocketModeMiddleware(BodyEdit(app, drop_instructions_with_tools))

    def fails(program: Conversation) -> bool:
        try:
            check.run(program)
        except CompatibilityError as error:
            return "'instructions' is missing" in str(error)
        return False

    with CompatibilityCheck(reference(), middleware=broken) as check:
        smallest = find(conversations(), fails, settings=settings(max_examples=500, database=None))
        with pytest.raises(CompatibilityError) as caught:
            check.run(smallest)
    step = caught.value.step
    assert step is not None
    assert step.instructions is not None
    assert step.tools


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


SDK_MESSAGE = {
    "type": "message",
    "id": "msg_1",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_text", "text": "hi", "annotations": []}],
}


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        pytest.param(
            lambda body, n: lifecycle([SDK_MESSAGE], numbers=(3, 2)),
            "sequence numbers do not increase",
            id="sequence-numbers-go-back",
        ),
        pytest.param(
            lambda body, n: lifecycle([SDK_MESSAGE], response_id="resp_same"),
            "the response id is not new",
            id="reuses-a-response-id",
        ),
        pytest.param(
            lambda body, n: lifecycle([{**SDK_MESSAGE, "id": None, "status": "done"}]),
            "does not validate with the openai SDK's ResponseOutputMessage",
            id="output-item-the-sdk-rejects",
        ),
        pytest.param(
            lambda body, n: lifecycle([SDK_MESSAGE])[1:],
            "does not start with response.created",
            id="no-response-created",
        ),
        pytest.param(
            lambda body, n: [
                {"type": "error", "code": "server_error", "message": "the model is down"}
            ],
            "the turn ended with error",
            id="answers-with-an-error",
        ),
    ],
)
def test_a_broken_handler_fails(
    answer: Callable[[dict[str, Any], int], list[dict[str, Any]]], expected: str
) -> None:
    program = [Step("fresh"), Step("continue")]
    with pytest.raises(CompatibilityError, match=expected):
        check_conversation(handler(answer), program)


def test_validation_and_errors_can_be_relaxed() -> None:
    invalid = handler(lambda body, n: lifecycle([{"type": "message", "role": "assistant"}]))
    program = [Step("fresh"), Step("continue")]
    check_conversation(invalid, program, validate_output=False)
    failing = handler(lambda body, n: [{"type": "error", "code": "x", "message": "down"}])
    report = check_conversation(failing, program, allow_errors=True)
    assert [turn.terminal for turn in report.turns] == ["error", "error"]
    # Nothing succeeded, so the second step had nothing to continue.
    assert "previous_response_id" not in report.turns[1].request


def test_a_failed_continuation_drops_its_parent_from_the_program() -> None:
    """PROTOCOL.md §4: the parent of a failed same-lane continuation is evicted; later steps
    build on what is still cached."""

    def answer(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        if n == 1:
            return [{"type": "error", "code": "server_error", "message": "down"}]
        return lifecycle([SDK_MESSAGE])

    program = [Step("fresh"), Step("continue"), Step("continue")]
    report = check_conversation(handler(answer), program, allow_errors=True)
    assert [turn.terminal for turn in report.turns] == [
        "response.completed",
        "error",
        "response.completed",
    ]
    assert "previous_response_id" not in report.turns[2].request  # a fresh chain instead


# The examples, through the pytest fixture (the app's own middleware is used).


def test_fastapi_example(ws_mode_check: CompatibilityChecks) -> None:
    from examples.fastapi_app import app

    report = ws_mode_check(app, PROGRAM)
    assert [len(turn.calls) for turn in report.turns] == [1, 1, 1, 0, 1, 1]


def test_starlette_example_with_auth(ws_mode_check: CompatibilityChecks) -> None:
    from examples.starlette_app import create_app as create_example

    app = create_example(api_key="secret")
    report = ws_mode_check(app, PROGRAM, headers={"Authorization": "Bearer secret"})
    assert report.turns[0].output[0]["type"] == "function_call"
    with pytest.raises(CompatibilityError, match="the turn ended with error"):
        ws_mode_check(app, PROGRAM, headers={"Authorization": "Bearer wrong"})


def test_an_embedded_middleware_is_restored() -> None:
    inner = reference()
    app = WebSocketModeMiddleware(inner, full_context="on_miss")
    with CompatibilityCheck(app) as check:
        assert check.mode == "on_miss"
        assert app.settings.app is not inner
        with pytest.raises(RuntimeError, match="already under a check"):
            CompatibilityCheck(app).start()
    assert app.settings.app is inner
    with pytest.raises(ValueError, match="configure it there"):
        CompatibilityCheck(app, middleware_options={"path": "/x"}).start()


# The strategy.


@settings(max_examples=50)
@given(program=conversations(lanes=(None,), instructions=("Hi.",), warm_ups=False, max_steps=3))
def test_conversations_draws_from_the_pools(program: Conversation) -> None:
    assert 1 <= len(program) <= 3
    for step in program.steps:
        assert step.lane is None
        assert step.instructions == "Hi."
        assert step.generate
        assert step.form != "empty"
        assert step.describe()


@given(data=st.data())
def test_conversations_rejects_bad_pools(data: st.DataObject) -> None:
    bad = data.draw(
        st.sampled_from(
            [
                {"lanes": ("no spaces",)},
                {"fields": ({"input": "x"},)},
                {"models": ()},
                {"min_steps": 0},
                {"tools": ()},
            ]
        )
    )
    with pytest.raises(ValueError):  # noqa: PT011
        conversations(**bad)
    assert None in DEFAULT_LANES


# The plugin, as a user's project loads it.


def test_the_plugin_loads_with_pytest_plugins(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from hypothesis import given, settings
        from ws_mode.reference import ReferenceConfig, create_app
        from ws_mode.testing import conversations

        pytest_plugins = ["ws_mode.testing"]
        app = create_app(ReferenceConfig(tool_calls=1, answer_tokens=3))

        @settings(max_examples=5, deadline=None)
        @given(program=conversations(max_steps=3))
        def test_compatible(ws_mode_check, program):
            ws_mode_check(app, program)

        def test_broken(ws_mode_check):
            from ws_mode.testing import Step
            ws_mode_check(app, [Step("fresh")], middleware=lambda inner: inner)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:asyncio")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*CompatibilityError*refused the socket*"])
