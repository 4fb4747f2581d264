"""The kit checks answers, not only requests (`ws_mode.testing._answers`): each socket turn's
answer is compared with the same conversation over HTTP with the full history, wrong input
must be refused as HTTP refuses it, a handler that is not deterministic is named as such, and
strict mode requires the fields the SDKs require. Each bug a server author's handler had
fails the kit; the fixed handler passes."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import Phase, find, settings
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from tests.library.testing.apps import TOOLS, handler, lifecycle, model_app, reference
from ws_mode import turn
from ws_mode.testing import (
    CompatibilityCheck,
    CompatibilityError,
    Conversation,
    NondeterminismError,
    SDKValidationWarning,
    Step,
    check_conversation,
    conversations,
)
from ws_mode.testing._answers import IDS, Answer, difference, same

THREE_TURNS = [Step("fresh"), Step("continue"), Step("continue", form="string")]
UNKNOWN_CALL = [Step("fresh"), Step("continue", wrong="unknown_call")]


def failure(app: Any, program: list[Step], **options: Any) -> CompatibilityError:
    with pytest.raises(CompatibilityError) as caught:
        check_conversation(app, program, **options)
    assert len(str(caught.value)) < 4000
    return caught.value


# The bugs.


def test_a_handler_answering_from_the_last_input_item_only_fails() -> None:
    """It answers the same over both transports; require_history=True asks HTTP with the new
    input alone and finds the same answer."""
    error = failure(model_app(last_item_only=True), THREE_TURNS, require_history=True)
    assert error.turn == 1
    assert "does not depend on the earlier turns" in error.problem
    report = check_conversation(model_app(), THREE_TURNS, require_history=True)
    assert [turn.compared for turn in report.turns] == [True, True, True]


def test_a_cache_aware_handler_that_never_reads_the_turn_fails() -> None:
    error = failure(model_app(read_turn=False), THREE_TURNS, full_context="on_miss")
    assert error.turn == 1  # the first cache hit
    assert "the socket's answer differs from HTTP's" in error.problem
    assert "first difference at output item 0" in error.details
    assert "ws_mode.turn(request)" in error.details
    check_conversation(model_app(), THREE_TURNS, full_context="on_miss")


def test_a_response_completed_without_its_sequence_number_fails() -> None:
    error = failure(model_app(number_completed=False), THREE_TURNS)
    assert error.turn == 0
    assert "event 3 (response.completed) has no sequence_number" in error.problem
    check_conversation(model_app(), THREE_TURNS, strict=True)


def test_accepting_an_output_for_an_unknown_call_fails() -> None:
    error = failure(model_app(refuse_unknown_calls=False), UNKNOWN_CALL)
    assert error.turn == 1
    assert "accepted a function_call_output whose call_id matches no call" in error.problem
    report = check_conversation(model_app(), UNKNOWN_CALL)
    assert report.turns[1].terminal == "error"
    assert report.turns[1].wrong == "unknown_call"


def test_a_handler_whose_randomness_decides_the_tool_call_is_named_not_deterministic() -> None:
    program = [Step("fresh", tools=TOOLS), Step("continue", tools=TOOLS)]
    # With this seed the socket's call makes a tool call and HTTP's first one does not.
    error = failure(model_app(random_tools=random.Random(1)), program)
    assert isinstance(error, NondeterminismError)
    assert "the handler is not deterministic" in error.problem
    assert "seed its randomness" in error.details
    assert "compare_answers=False" in error.details
    check_conversation(model_app(), program)  # deterministic: decided by the context
    # Told not to compare, the kit checks requests and events only.
    check_conversation(model_app(random_tools=random.Random(1)), program, compare_answers=False)


# Wrong input.


@pytest.fixture(scope="module")
def reference_check() -> Any:
    with CompatibilityCheck(reference()) as check:
        yield check


def test_wrong_input_is_answered_as_http_answers_it(reference_check: CompatibilityCheck) -> None:
    """The reference server refuses an unknown call's output (400) and accepts a duplicate
    output or a message instead of the outputs: the socket answers the same."""
    program = [
        Step("fresh", tools=TOOLS),
        Step("continue", tools=TOOLS, wrong="duplicate_output"),
        Step("fresh", tools=TOOLS),
        Step("continue", tools=TOOLS, wrong="missing_outputs"),
        Step("fresh", tools=TOOLS, wrong="unknown_call"),
    ]
    report = reference_check.run(program)
    assert [turn.wrong for turn in report.turns] == [
        None,
        "duplicate_output",
        None,
        "missing_outputs",
        "unknown_call",
    ]
    assert report.turns[4].events[-1]["status"] == 400
    duplicate = report.turns[1].request["input"]
    assert len(duplicate) == 2
    assert duplicate[0] == duplicate[1]
    assert report.turns[3].request["input"] == [{"role": "user", "content": "Hello"}]


def test_wrong_input_without_calls_to_answer_sends_an_unknown_calls_output() -> None:
    report = check_conversation(model_app(), [Step("fresh", wrong="missing_outputs")])
    assert report.turns[0].wrong == "unknown_call"
    with pytest.raises(ValueError, match="must generate"):
        Step(generate=False, wrong="unknown_call")


def test_a_socket_refusal_must_match_http() -> None:
    """A handler that refuses over the socket only differs from HTTP, even with
    allow_errors=True."""

    async def refuse_turns(scope: Scope, receive: Receive, send: Send) -> None:
        if turn(scope) is None:
            await app(scope, receive, send)
            return
        refusal = JSONResponse({"error": {"type": "invalid_request_error", "message": "no"}}, 400)
        await refusal(scope, receive, send)

    app = model_app()
    error = failure(refuse_turns, [Step("fresh")], allow_errors=True)
    assert error.details.startswith("HTTP answered completed [message]; the socket error 400: ")


# Strict mode.


def test_strict_mode_requires_the_fields_the_sdks_require() -> None:
    unnumbered = handler(
        lambda body, n: [
            {k: v for k, v in e.items() if k != "sequence_number"} for e in lifecycle([])
        ]
    )
    check_conversation(unnumbered, [Step("fresh")])  # consistent: no event has one
    error = failure(unnumbered, [Step("fresh")], strict=True)
    assert "event 0 (response.created) has no integer sequence_number" in error.problem

    def bare(body: dict[str, Any], n: int) -> list[dict[str, Any]]:
        events = lifecycle([])
        for event in events:
            event["response"].pop("created_at")
        return events

    error = failure(handler(bare), [Step("fresh")], strict=True)
    assert "lacks fields the SDKs require (strict): response.created_at" in error.problem


def test_the_reference_server_passes_strict_mode(reference_check: CompatibilityCheck) -> None:
    with CompatibilityCheck(reference(), strict=True, require_history=True) as check:
        report = check.run([Step("fresh", tools=TOOLS), Step("continue"), Step("continue")])
    assert all(turn.compared for turn in report.turns)


# Comparing answers.


def test_answers_are_compared_without_ids_and_randomized_fields() -> None:
    item = {"type": "message", "id": "msg_1", "content": [{"type": "output_text", "text": "a"}]}
    other = {**item, "id": "msg_2", "content": [{"type": "output_text", "text": "b"}]}
    assert same(Answer("completed", [item]), Answer("completed", [{**item, "id": "x"}]), IDS)
    assert not same(Answer("completed", [item]), Answer("completed", [other]), IDS)
    assert same(Answer("completed", [item]), Answer("completed", [other]), {*IDS, "text"})
    assert not same(Answer("completed", []), Answer("incomplete", []), IDS)
    assert same(Answer(400, [], "a"), Answer(400, [], "b"), IDS)
    assert difference(Answer(400, []), Answer("completed", [item]), IDS) == (
        "HTTP answered error 400; the socket completed [message]"
    )


def test_a_url_is_refused_with_a_clear_message() -> None:
    with pytest.raises(TypeError, match=r"needs an ASGI app.*ws-mode check URL --all"):
        CompatibilityCheck("http://localhost:8000")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ignore_fields"):
        CompatibilityCheck(reference(), ignore_fields="text")
    with pytest.raises(ValueError, match="require_history needs compare_answers"):
        CompatibilityCheck(reference(), require_history=True, compare_answers=False)


# What a run covered.


def test_a_check_counts_what_its_passing_programs_covered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """And says when the openai SDK's models could not validate output, in a warning and in
    the summary."""
    monkeypatch.setattr("ws_mode.testing._validation._sdk_item_models", lambda: None)
    check = CompatibilityCheck(model_app())
    with pytest.warns(SDKValidationWarning, match="openai SDK is not installed"):
        check.start()
    with check:
        check.run([Step("fresh", lane="main"), Step("continue", wrong="unknown_call")])
        check.run([Step("fresh"), Step("recover", generate=False, form="empty")])
    coverage = check.coverage
    assert (coverage.programs, coverage.turns, coverage.compared) == (2, 4, 3)
    assert coverage.lanes == {"'main'", "default"}
    assert coverage.steps == {"fresh": 2, "continue": 1, "warm-up": 1}
    assert coverage.wrong_inputs == {"unknown_call": 1}
    assert check.summary().splitlines() == [
        "2 programs passed, 4 turns on 2 lanes ('main', default)",
        "steps: 1 continue, 2 fresh, 1 warm-up",
        "wrong-input turns: 1 in 1 programs (1 unknown_call)",
        "answers compared with HTTP's: 3",
        "output items validated with the openai SDK's models: NO: the openai SDK is not "
        "installed (pip install openai)",
        "strict event fields: off",
    ]


@pytest.mark.parametrize(
    ("app", "options", "expected"),
    [
        (model_app(read_turn=False), {"full_context": "on_miss"}, "differs from HTTP's"),
        (model_app(refuse_unknown_calls=False), {}, "matches no call"),
        (model_app(last_item_only=True), {"require_history": True}, "does not depend"),
    ],
    ids=["on-miss-without-turn", "unknown-call-accepted", "last-item-only"],
)
def test_random_programs_find_the_bugs(app: Any, options: Any, expected: str) -> None:
    """As a server author runs the kit: hypothesis's programs find each bug."""

    def fails(program: Conversation) -> bool:
        try:
            check.run(program)
        except CompatibilityError as error:
            return expected in error.problem
        return False

    with CompatibilityCheck(app, **options) as check:
        # Found, not shrunk: shrinking reruns many programs.
        quick = settings(max_examples=100, database=None, phases=[Phase.generate])
        find(conversations(), fails, settings=quick)
