"""Conformance cases of steering (``response.steer``): accepted with a ``steer_`` id, applied by a
successor, pending while a response waits for tool output, and each failure code.

A server may legitimately not steer: ``response.steer.failed`` with ``steering_not_supported``
skips every case. Steering needs a response that is still streaming when the steer arrives:
a case asks for a long answer and steers right after ``response.created`` (or, for the
successor, when a message starts streaming); an endpoint that finishes first
(``response_already_completed``) skips the case, and says to slow the stream down."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Final

from ._client import SyncSocket
from ._conformance import (
    LONG_ANSWER,
    STEER_EVENTS,
    CaseFailed,
    CaseSkipped,
    ConformanceCase,
    Probe,
    Turn,
    describe,
    message_streaming,
)
from ._conformance_state import FAILING_FIELDS
from ._program import LOOKUP_TOOL
from ._validation import steer_accepted_problems, steer_event_problems

STEERING_GUIDE: Final = "OpenAI steering guide"
STEER_SOURCE: Final = f"{STEERING_GUIDE}; docs/protocol.md, response.steer"
STEER_TEXT: Final = "Also mention a cat."
TOO_FAST: Final = (
    "the response finished before the steer arrived (response_already_completed): the "
    "endpoint streams too fast to steer into (ws-mode serve: --tokens-per-second)"
)
#: What a case's set-up names when the response ends before it could be steered into.
INTO: Final = "the response to steer into"


def steer(target: str, input: Any = STEER_TEXT, **extra: Any) -> dict[str, Any]:
    """A ``response.steer`` of ``input`` into ``target``, with ``extra`` fields."""
    return {"type": "response.steer", "previous_response_id": target, "input": input, **extra}


def _lane(name: str) -> str:
    return f"conform-{name}-{secrets.token_hex(3)}"


def steer_accepted(
    probe: Probe, socket: SyncSocket, target: str, seen: list[dict[str, Any]], into: str
) -> dict[str, Any]:
    """Steer into ``target`` (``into`` says what it is while it streams) and return the
    ``response.steer.accepted``: skips the case when the response finished first, fails it on
    any other answer."""
    socket.send(steer(target))
    answer = steer_answer(probe, socket, seen)
    if failed_code(answer) == "response_already_completed":
        raise CaseSkipped(TOO_FAST)
    if answer["type"] != "response.steer.accepted":
        raise CaseFailed(f"a steer into {into} was answered with {describe(answer)}")
    return answer


def steer_answer(probe: Probe, socket: SyncSocket, seen: list[dict[str, Any]]) -> dict[str, Any]:
    """The next steering event; the response events read meanwhile go to ``seen``. Skips the
    case when steering is not supported, fails it when an ``error`` came instead."""
    while True:
        event = probe.read_until(socket, lambda event: True)
        if event["type"] in STEER_EVENTS:
            break
        if event["type"] == "error":
            raise CaseFailed(
                f"got {describe(event)} while waiting for the steer's answer; a server that "
                "cannot steer answers response.steer.failed with steering_not_supported"
            )
        seen.append(event)
    if event["type"] == "response.steer.failed":
        error = event.get("error")
        if not isinstance(error, dict) or not isinstance(error.get("code"), str):
            raise CaseFailed(f"response.steer.failed without a string error.code: {event}")
        if error["code"] == "steering_not_supported":
            raise CaseSkipped("the server does not steer (steering_not_supported), as it may")
    check_steer_event(event)
    return event


def check_steer_event(event: dict[str, Any]) -> None:
    """Fail the case when a steering answer lacks what its SDK model requires."""
    problems = steer_event_problems(event)
    if problems:
        raise CaseFailed(
            f"{event['type']} is not what the SDKs type: {'; '.join(problems)} ({describe(event)})"
        )


def failed_code(event: dict[str, Any]) -> str | None:
    """The code of a ``response.steer.failed``; None for any other event."""
    if event["type"] != "response.steer.failed":
        return None
    return str(event["error"]["code"])


def accepted(probe: Probe) -> str:
    socket = probe.socket()
    lane = _lane("steer")
    target, seen = probe.start_streaming(socket, probe.create(LONG_ANSWER, stream_id=lane), INTO)
    answer = steer_accepted(probe, socket, target, seen, "a streaming response")
    problems = steer_accepted_problems(answer, target, lane)
    if problems:
        raise CaseFailed("response.steer.accepted: " + "; ".join(problems))
    return f"accepted as {answer['steer']['id']} on lane {lane}"


def successor(probe: Probe) -> str:
    socket = probe.socket()
    # On the default lane: the rule is not about lanes.
    request, seen = message_streaming(probe, socket, probe.create(LONG_ANSWER))
    target = str(seen[0]["response"]["id"])
    steer_accepted(probe, socket, target, seen, "a streaming message")
    steers: list[dict[str, Any]] = []
    steered = probe.turn(socket, request, send=False, before=seen, steers=steers)
    if steered.last["type"] == "response.incomplete":
        reason = (steered.response or {}).get("incomplete_details") or {}
        if reason.get("reason") != "steered":
            raise CaseFailed(f"the steered response ended incomplete for {reason!r}, not 'steered'")
    elif steered.last["type"] != "response.completed":
        raise CaseFailed(f"the steered response ended with {describe(steered.last)}")
    if steered.calls():
        raise CaseSkipped("the steered response ended with a tool call (see steering.pending)")
    follow = {"type": "response.create", "previous_response_id": target}
    after = probe.turn(socket, follow, send=False, steers=steers)
    if not after.finished:
        raise CaseFailed(f"the successor ended with {describe(after.last)}")
    how = steered.last["type"].removeprefix("response.")
    return f"{target} ended {how}; its successor {after.id} continued it on its lane"


@dataclass
class Pending:
    """A steer left pending: the response it was sent into (ended waiting for tool output),
    the ``response.steer.accepted`` and the ``response.steer.pending`` that answered it."""

    turn: Turn
    accepted: dict[str, Any]
    pending: dict[str, Any]


def steer_left_pending(probe: Probe, socket: SyncSocket) -> Pending:
    """Ask for a tool call, steer into the response while it streams, and read up to the
    ``response.steer.pending`` after its ``response.completed`` (skips: no steering, too
    fast, no tool call)."""
    request = probe.create(
        "Look up the word 'lighthouse' with the lookup tool.",
        tools=[LOOKUP_TOOL],
        tool_choice="required",
    )
    target, seen = probe.start_streaming(socket, request, INTO)
    answer = steer_accepted(probe, socket, target, seen, "a streaming response")
    steers: list[dict[str, Any]] = []
    turn = probe.turn(socket, request, send=False, before=seen, steers=steers)
    calls = turn.calls()
    if not calls:
        raise CaseSkipped("the model did not call the tool, though tool_choice was required")
    if turn.last["type"] != "response.completed":
        raise CaseFailed(f"the response with a tool call ended with {describe(turn.last)}")
    if not steers:
        steers.append(probe.read_until(socket, lambda event: True))
    waiting = steers[0]
    if waiting["type"] != "response.steer.pending":
        raise CaseFailed(
            f"after a response ending with a tool call came {describe(waiting)}, not "
            "response.steer.pending"
        )
    check_steer_event(waiting)
    return Pending(turn, answer, waiting)


def pending(probe: Probe) -> str:
    socket = probe.socket()
    left = steer_left_pending(probe, socket)
    waiting, calls = left.pending, left.turn.calls()
    if waiting.get("reason") != "waiting_for_required_input":
        raise CaseFailed(f"response.steer.pending with reason {waiting.get('reason')!r}")
    required = waiting.get("required_input")
    ids = {item.get("call_id") for item in required} if isinstance(required, list) else set()
    if ids != {call["call_id"] for call in calls}:
        raise CaseFailed(f"required_input {required!r} does not name the calls {sorted(ids)}")
    follow = probe.create(probe.follow_up(left.turn), previous_response_id=left.turn.id)
    after = probe.finished_turn(socket, follow, "the continuation with the tool output")
    return (
        f"pending after response.completed (waiting_for_required_input, {len(calls)} call(s)); "
        f"the tool output's continuation {after.id} took the input"
    )


def successor_creation_failed(probe: Probe) -> str:
    socket = probe.socket()
    left = steer_left_pending(probe, socket)
    steer_id = (left.accepted.get("steer") or {}).get("id")
    bad = probe.create(
        probe.follow_up(left.turn), previous_response_id=left.turn.id, **FAILING_FIELDS
    )
    steers: list[dict[str, Any]] = []
    turn = probe.turn(socket, bad, steers=steers)
    if turn.finished:
        raise CaseSkipped(
            "the endpoint accepted a continuation with metadata {'conform': 1} (a non-string "
            "metadata value), so no continuation could be made to fail"
        )
    if not steers:
        steers.append(probe.read_until(socket, lambda event: True))
    returned = steers[0]
    if failed_code(returned) != "successor_creation_failed":
        raise CaseFailed(
            f"after the continuation carrying the steered input failed came {describe(returned)}, "
            "not response.steer.failed (successor_creation_failed)"
        )
    check_steer_event(returned)
    if (returned.get("steer") or {}).get("id") != steer_id:
        raise CaseFailed(f"successor_creation_failed without the steer's id {steer_id!r}")
    return f"the failed continuation gave the input back: successor_creation_failed ({steer_id})"


def response_not_found(probe: Probe) -> str:
    socket = probe.socket()
    unknown = "resp_conform_" + secrets.token_hex(8)
    socket.send(steer(unknown))
    answer = steer_answer(probe, socket, [])
    if failed_code(answer) != "response_not_found":
        raise CaseFailed(f"a steer into an unknown response was answered with {describe(answer)}")
    return "response.steer.failed, response_not_found"


def already_completed(probe: Probe) -> str:
    socket = probe.socket()
    turn = probe.finished_turn(socket, probe.create(), "the response")
    socket.send(steer(turn.id))
    answer = steer_answer(probe, socket, [])
    if failed_code(answer) != "response_already_completed":
        raise CaseFailed(f"a steer into a finished response was answered with {describe(answer)}")
    return "response.steer.failed, response_already_completed"


def _refused_while_streaming(
    probe: Probe, steers: list[dict[str, Any]], what: str
) -> list[dict[str, Any]]:
    """Send each of ``steers`` (built for the target id) into a streaming response; their
    answers, each of which must be ``invalid_input``."""
    socket = probe.socket()
    target, seen = probe.start_streaming(socket, probe.create(LONG_ANSWER), INTO)
    for event in steers:
        socket.send({**event, "previous_response_id": target})
    answers = [steer_answer(probe, socket, seen) for _event in steers]
    for event, answer in zip(steers, answers, strict=True):
        code = failed_code(answer)
        if code == "response_already_completed":
            raise CaseSkipped(TOO_FAST)
        if code != "invalid_input":
            raise CaseFailed(f"{what} {event!r} was answered with {describe(answer)}")
    return answers


def invalid_input(probe: Probe) -> str:
    bad = [
        steer("", input=[]),
        steer("", input=[{"type": "function_call_output", "call_id": "c", "output": "x"}]),
        steer("", input=[{"type": "message", "role": "assistant", "content": "hi"}]),
    ]
    _refused_while_streaming(probe, bad, "a steer with input")
    return "an empty array, a tool output and an assistant message: invalid_input"


def extra_fields(probe: Probe) -> str:
    bad = [steer("", model="gpt-4o"), steer("", stream_id="lane"), steer("", foo=1)]
    answers = _refused_while_streaming(probe, bad, "a steer with the extra field of")
    unnamed = [
        field
        for field, answer in zip(("model", "stream_id", "foo"), answers, strict=True)
        if field not in str(answer["error"].get("message")) + str(answer["error"].get("param"))
    ]
    if unnamed:
        raise CaseFailed(f"invalid_input does not name the field {unnamed[0]!r}")
    return "model, stream_id and foo: invalid_input, each named"


CASES: Final = (
    ConformanceCase(
        "steering.accepted",
        "a steer sent after response.created of a streaming response is answered with "
        "response.steer.accepted: steer.id steer_ and 32 hex digits, steer.previous_response_id "
        "the response, on its lane",
        STEER_SOURCE,
        accepted,
    ),
    ConformanceCase(
        "steering.successor",
        "an accepted steer ends the response at a safe boundary (response.incomplete, reason "
        "steered) or at its end, and a successor continuing it starts by itself on its lane",
        STEER_SOURCE,
        successor,
    ),
    ConformanceCase(
        "steering.pending",
        "a steer into a response that ends waiting for tool output gets "
        "response.steer.pending (waiting_for_required_input, required_input naming the calls) "
        "after its response.completed; the client's continuation takes the input",
        STEER_SOURCE,
        pending,
    ),
    ConformanceCase(
        "steering.successor_creation_failed",
        "when the continuation that would take pending steered input fails before its "
        "response.created, the input comes back in response.steer.failed "
        "(successor_creation_failed, with the steer's id)",
        STEER_SOURCE,
        successor_creation_failed,
    ),
    ConformanceCase(
        "steering.response_not_found",
        "a steer into an id no response of the connection has fails with response_not_found",
        STEER_SOURCE,
        response_not_found,
    ),
    ConformanceCase(
        "steering.response_already_completed",
        "a steer into a finished response fails with response_already_completed",
        STEER_SOURCE,
        already_completed,
    ),
    ConformanceCase(
        "steering.invalid_input",
        "steering input is a string or a non-empty array of user messages; anything else "
        "fails with invalid_input",
        STEER_SOURCE,
        invalid_input,
    ),
    ConformanceCase(
        "steering.extra_fields_refused",
        "response.steer takes type, previous_response_id and input only: another field fails "
        "with invalid_input naming it",
        STEER_SOURCE,
        extra_fields,
    ),
)
