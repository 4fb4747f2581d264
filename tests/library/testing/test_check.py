"""`CompatibilityCheck` and `check_conversation`: the kit passes on correct apps, deterministic
or not, in both `full_context` modes and under each server, and leaves the app it checked as
it found it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings

from tests.library.testing.apps import PROGRAM, random_app, reference
from ws_mode import WebSocketModeMiddleware
from ws_mode.testing import (
    CompatibilityCheck,
    CompatibilityError,
    Conversation,
    Step,
    check_conversation,
    conversations,
)


@pytest.fixture(scope="module", params=["always", "on_miss"])
def reference_check(request: pytest.FixtureRequest) -> Iterator[CompatibilityCheck]:
    with CompatibilityCheck(reference(), full_context=request.param) as check:
        yield check


@pytest.fixture(scope="module", params=["always", "on_miss"])
def random_check(request: pytest.FixtureRequest) -> Iterator[CompatibilityCheck]:
    # Its answers change from call to call: they cannot be compared with HTTP's.
    with CompatibilityCheck(
        random_app(), full_context=request.param, compare_answers=False
    ) as check:
        yield check


@settings(max_examples=100)
@given(program=conversations())
def test_reference_server_passes(
    reference_check: CompatibilityCheck, program: Conversation
) -> None:
    report = reference_check.run(program)
    assert len(report.turns) == len(program)


# Against a handler that answers at random, the programs' variety matters less than against the
# reference server above: 50 conversations over a real socket each.
@settings(max_examples=50)
@given(program=conversations(wrong_inputs=False))
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
    with CompatibilityCheck(random_app(seed=1), compare_answers=False) as check:
        first, second = check.run(PROGRAM), check.run(PROGRAM)
    assert [t.output for t in first.turns] != [t.output for t in second.turns]


@pytest.mark.parametrize("server", ["uvicorn", "hypercorn"])
def test_check_conversation_under_each_server(server: Any) -> None:
    report = check_conversation(reference(), PROGRAM, server=server)
    assert len(report.turns) == len(PROGRAM)
    assert "turn 5: continue" in str(report)


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


def test_a_refused_socket_fails_without_a_turn() -> None:
    with (
        CompatibilityCheck(reference(), path="/elsewhere") as check,
        pytest.raises(CompatibilityError, match="refused the socket") as caught,
    ):
        check.run([Step("fresh")])
    assert caught.value.turn is None


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="full_context"):
        CompatibilityCheck(reference(), full_context="never")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="builds the served app itself"):
        CompatibilityCheck(reference(), middleware=WebSocketModeMiddleware, full_context="always")
    with pytest.raises(ValueError, match="turn_timeout"):
        CompatibilityCheck(reference(), turn_timeout=0)
    with pytest.raises(ValueError, match="at least one step"):
        CompatibilityCheck(reference()).run([])
