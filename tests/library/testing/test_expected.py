"""What the handler should receive (`ws_mode.testing._expected`): each turn's request is planned
from the responses the run actually got, and a handler that receives anything else than what
an HTTP client keeping the full history sends fails the check, naming the turn."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import find, settings

from tests.library.testing.apps import (
    SDK_MESSAGE,
    TWO_TURNS,
    BodyEdit,
    WrongParent,
    expect_failure,
    handler,
    lifecycle,
    reference,
)
from ws_mode import WebSocketModeMiddleware
from ws_mode.testing import (
    CompatibilityCheck,
    CompatibilityError,
    Conversation,
    Step,
    check_conversation,
    conversations,
)
from ws_mode.testing._expected import Node, check_calls, new_input, plan_turn
from ws_mode.testing._recorder import RUN_HEADER, RecordedCall
from ws_mode.testing._report import TurnFailed

CALL = {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"}


def drop_first_item(body: dict[str, Any]) -> None:
    if isinstance(body.get("input"), list) and len(body["input"]) > 1:
        del body["input"][0]


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
def test_a_middleware_that_changes_the_request_fails(
    middleware: Callable[[Any], Any], program: list[Step], turn: int, expected: list[str]
) -> None:
    expect_failure(middleware, program, turn, expected)


def test_hypothesis_finds_a_subtle_bug() -> None:
    """A middleware that loses the instructions only when tools are sent too: random programs
    find it, and the error names the turn that sent both."""

    def drop_instructions_with_tools(body: dict[str, Any]) -> None:
        if body.get("tools"):
            body.pop("instructions", None)

    def broken(app: Any) -> Any:
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


def test_a_failed_continuation_drops_its_parent_from_the_program() -> None:
    """docs/protocol.md, "Conversation state": the parent of a failed same-lane continuation is
    evicted; later steps build on what is still cached."""

    def answer(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        if n == 1:
            return [{"type": "error", "code": "server_error", "message": "down"}]
        return lifecycle([SDK_MESSAGE])

    program = [Step("fresh"), Step("continue"), Step("continue")]
    report = check_conversation(handler(answer), program, allow_errors=True, compare_answers=False)
    assert [turn.terminal for turn in report.turns] == [
        "response.completed",
        "error",
        "response.completed",
    ]
    assert "previous_response_id" not in report.turns[2].request  # a fresh chain instead


# Planning, without a server.


def node(response_id: str, lane: str | None = None, output: Any = (), turn: int = 0) -> Node:
    return Node(response_id, lane, [{"role": "user", "content": "hi"}], list(output), turn)


def test_new_input_answers_the_calls_left_unanswered() -> None:
    step = Step(text="42")
    assert new_input(step, [CALL]) == [
        {"type": "function_call_output", "call_id": "call_1", "output": "42"}
    ]
    answered = [CALL, {"type": "function_call_output", "call_id": "call_1", "output": "1"}]
    assert new_input(step, answered) == [{"role": "user", "content": "42"}]
    assert new_input(Step(form="string", text="x"), []) == "x"
    assert new_input(Step(form="empty", generate=False), [CALL]) == []


def test_plan_turn_picks_the_parent_and_builds_the_full_context() -> None:
    nodes = [node("resp_a", lane="main"), node("resp_b", output=[SDK_MESSAGE], turn=1)]
    plan = plan_turn(Step("continue", lane="main", text="more"), nodes)
    assert plan.parent is nodes[0]
    assert plan.request["previous_response_id"] == "resp_a"
    assert plan.request["stream_id"] == "main"
    assert plan.context == [*nodes[0].history(), {"role": "user", "content": "more"}]
    recovery = plan_turn(Step("recover", parent=1, form="string", text="x"), nodes)
    assert recovery.request["previous_response_id"] is None
    assert recovery.request["input"] == recovery.context
    assert recovery.context[-2:] == [SDK_MESSAGE, {"role": "user", "content": "x"}]
    nodes[1].evicted = True
    assert plan_turn(Step("continue"), nodes).parent is nodes[0]  # its own lane has none left
    fresh = plan_turn(Step("fresh", generate=False, form="empty"), nodes)
    assert "previous_response_id" not in fresh.request
    assert fresh.request["generate"] is False


def test_check_calls_names_what_differs() -> None:
    step = Step("fresh", text="hi")
    plan = plan_turn(step, [])
    body = {"model": plan.request["model"], "input": plan.request["input"], "stream": True}
    good = RecordedCall(body, plan.context, True, {RUN_HEADER: "t"}, True)
    check_calls(step, plan, [good], started=True, token="t", mode=None)
    with pytest.raises(TurnFailed, match="called 2 times"):
        check_calls(step, plan, [good, good], started=True, token="t", mode=None)
    with pytest.raises(TurnFailed, match="handshake's headers"):
        check_calls(step, plan, [good], started=True, token="other", mode=None)
    cache_aware = RecordedCall(body, plan.context, False, {RUN_HEADER: "t"}, True)
    with pytest.raises(TurnFailed, match="got only the new items"):
        check_calls(step, plan, [cache_aware], started=True, token="t", mode="always")
    with pytest.raises(TurnFailed, match="called for a warm-up"):
        check_calls(Step(generate=False), plan, [good], started=True, token="t", mode=None)
