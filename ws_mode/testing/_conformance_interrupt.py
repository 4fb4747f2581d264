"""Conformance cases of ``response.interrupt`` (as Codex sends it): accepted with the open item
interrupted and the response ended ``incomplete`` (reason ``interrupted``), continued on the
same socket, each refusal, an unknown mode, pending steering input returned, and the race with
the response's own end.

A server may legitimately not interrupt: ``response.interrupt.failed`` with
``interrupt_not_supported`` skips a case. A generic ``error`` in answer to the interrupt (an
unknown event) fails it: Codex drops the socket on one and resends the whole history. An
interrupt needs a response still streaming when it arrives: a case waits for a message to
start streaming (answering tool calls first, as a client does) and skips, saying to slow the
stream down, when the response ends first (``response_already_completed``)."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any, Final

from .._protocol import TERMINAL_EVENTS
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
from ._conformance_steering import steer

SOURCE: Final = "Codex's WebSocket client (openai/codex); docs/protocol.md, response.interrupt"
MODE: Final = "discard_partial_items"
#: The events that answer an interrupt.
ANSWERS: Final = frozenset({"response.interrupt.accepted", "response.interrupt.failed"})
TOO_FAST: Final = (
    "the response finished before the interrupt arrived (response_already_completed): the "
    "endpoint streams too fast to interrupt (ws-mode serve: --tokens-per-second)"
)


def interrupt(response_id: str, mode: str = MODE) -> dict[str, Any]:
    """A ``response.interrupt`` of ``response_id``, exactly as Codex sends it."""
    return {"type": "response.interrupt", "response_id": response_id, "mode": mode}


def _lane(name: str) -> str:
    return f"conform-{name}-{secrets.token_hex(3)}"


def _answer_problem(event: Mapping[str, Any]) -> None:
    """Fail on a generic error in answer to an interrupt; skip when interrupts are off."""
    if event["type"] == "error":
        raise CaseFailed(
            f"an interrupt was answered with {describe(event)}: a server that does not "
            "interrupt answers response.interrupt.failed (interrupt_not_supported); Codex "
            "drops the socket on a generic error"
        )
    if event["type"] == "response.interrupt.failed" and failed_code(event) == (
        "interrupt_not_supported"
    ):
        raise CaseSkipped("the server does not interrupt (interrupt_not_supported), as it may")


def failed_code(event: Mapping[str, Any]) -> str | None:
    """The code of a ``response.interrupt.failed``; None for any other event."""
    if event.get("type") != "response.interrupt.failed":
        return None
    error = event.get("error")
    if not isinstance(error, dict) or not isinstance(error.get("code"), str):
        raise CaseFailed(f"response.interrupt.failed without a string error.code: {event}")
    return str(error["code"])


def interrupted(
    probe: Probe, socket: SyncSocket, lane: str | None = None, extra: Mapping[str, Any] = {}
) -> tuple[Turn, str, list[dict[str, Any]]]:
    """Interrupt a response while a message streams in it (on ``lane``, a steer sent just
    before when ``extra`` says so): its turn (the interrupt's events among them), the id of the
    message that was open, and the steering events read. Skips when the response ended first
    or the server does not interrupt; fails on any answer but an acceptance."""
    fields = {"stream_id": lane} if lane is not None else {}
    request, seen = message_streaming(probe, socket, probe.create(LONG_ANSWER, **fields))
    target = str(seen[0]["response"]["id"])
    open_item = str((seen[-1].get("item") or {}).get("id"))
    if extra.get("steer"):
        socket.send(steer(target))
    socket.send(interrupt(target))
    steers: list[dict[str, Any]] = []
    answer: dict[str, Any] | None = None
    events = list(seen)
    while True:
        event = _past_steering(probe, socket, steers)
        if event["type"] in ANSWERS or event["type"] == "error":
            if answer is None:
                _answer_problem(event)
                if failed_code(event) == "response_already_completed":
                    raise CaseSkipped(TOO_FAST)
                if event["type"] != "response.interrupt.accepted":
                    raise CaseFailed(f"an interrupt was answered with {describe(event)}")
                answer = event
            elif event["type"] != "response.interrupt.accepted":
                raise CaseFailed(f"after the acceptance came {describe(event)}")
        events.append(event)
        if event["type"] in TERMINAL_EVENTS:
            break
    if answer is None:
        _answer_after_the_end(probe, socket, events[-1], steers)
    return probe.checked(request, events), open_item, steers


def _past_steering(
    probe: Probe, socket: SyncSocket, steers: list[dict[str, Any]]
) -> dict[str, Any]:
    """The next event that is no steering event (those read on the way go to ``steers``)."""
    event = probe.read_until(socket, lambda event: event["type"] not in STEER_EVENTS, steers)
    steers.pop()  # read_until keeps the event it stops at too
    return event


def _answer_after_the_end(
    probe: Probe, socket: SyncSocket, last: Mapping[str, Any], steers: list[dict[str, Any]]
) -> None:
    """The response ended before the interrupt was answered: read its answer, which must come
    (steering events on the way go to ``steers``). ``response_already_completed`` means the
    endpoint finished first, which skips the case; any other answer fails it."""
    event = _past_steering(probe, socket, steers)
    while event["type"] not in ANSWERS and event["type"] != "error":
        event = _past_steering(probe, socket, steers)
    _answer_problem(event)
    if failed_code(event) == "response_already_completed":
        raise CaseSkipped(TOO_FAST)
    raise CaseFailed(
        f"the response ended ({describe(last)}) before the interrupt was answered, then came "
        f"{describe(event)}"
    )


def _check_interrupted(turn: Turn, open_item: str) -> str:
    """The turn ended as an interrupt ends it; what was seen."""
    kinds = [event["type"] for event in turn.events]
    target = turn.id
    after = kinds[kinds.index("response.interrupt.accepted") :]
    accepted = turn.events[kinds.index("response.interrupt.accepted")]
    if accepted.get("response_id") != target:
        raise CaseFailed(f"response.interrupt.accepted names {accepted.get('response_id')!r}")
    if not isinstance(accepted.get("sequence_number"), int):
        raise CaseFailed("response.interrupt.accepted has no integer sequence_number")
    if "response.completed" in kinds:
        raise CaseFailed("response.completed came for the interrupted response")
    if turn.last["type"] != "response.incomplete":
        raise CaseFailed(f"the interrupted response ended with {describe(turn.last)}")
    reason = (turn.response or {}).get("incomplete_details") or {}
    if reason.get("reason") != "interrupted":
        raise CaseFailed(f"the interrupted response ended incomplete for {reason!r}")
    marked = [
        event
        for event in turn.events
        if event["type"] == "response.output_item.interrupted" and event.get("item_id") == open_item
    ]
    finished = [item for item in turn.output if item.get("id") == open_item]
    if not marked and not finished:
        raise CaseFailed(
            f"the message {open_item} that was streaming got neither "
            "response.output_item.interrupted nor response.output_item.done"
        )
    if marked and finished:
        raise CaseFailed(f"the interrupted item {open_item} is in the response's output")
    for event in marked:
        if event.get("response_id") != target or not isinstance(event.get("output_index"), int):
            raise CaseFailed(
                f"response.output_item.interrupted lacks response_id or index: {event}"
            )
    how = "interrupted" if marked else "finished"
    return f"{' -> '.join(after)}; the open message {how}"


def accepted(probe: Probe) -> str:
    socket = probe.socket()
    lane = _lane("interrupt")
    turn, open_item, _ = interrupted(probe, socket, lane)
    return _check_interrupted(turn, open_item) + f" (lane {lane})"


def continued(probe: Probe) -> str:
    socket = probe.socket()
    turn, _, _ = interrupted(probe, socket)
    follow = probe.create(probe.follow_up(turn, "Go on."), previous_response_id=turn.id)
    after = probe.finished_turn(socket, follow, "the continuation of the interrupted response")
    return f"{after.id} continued the interrupted {turn.id} on the same socket"


def _refused(probe: Probe, socket: SyncSocket, target: str, code: str, what: str) -> str:
    socket.send(interrupt(target))
    answer = probe.read_until(
        socket, lambda event: event["type"] in ANSWERS or event["type"] == "error"
    )
    _answer_problem(answer)
    if failed_code(answer) != code:
        raise CaseFailed(f"an interrupt of {what} was answered with {describe(answer)}")
    if answer.get("response_id") != target:
        raise CaseFailed(f"response.interrupt.failed names {answer.get('response_id')!r}")
    if answer.get("status") not in (None, 400):
        raise CaseFailed(f"response.interrupt.failed with status {answer.get('status')!r}")
    probe.still_works(socket, f"the refused interrupt ({code})")
    return f"response.interrupt.failed, {code}; the socket serves on"


def response_not_found(probe: Probe) -> str:
    socket = probe.socket()
    unknown = "resp_conform_" + secrets.token_hex(8)
    return _refused(probe, socket, unknown, "response_not_found", "an unknown response")


def already_completed(probe: Probe) -> str:
    socket = probe.socket()
    turn = probe.finished_turn(socket, probe.create(), "the response")
    return _refused(probe, socket, turn.id, "response_already_completed", "a finished response")


def unknown_mode(probe: Probe) -> str:
    socket = probe.socket()
    request, seen = message_streaming(probe, socket, probe.create(LONG_ANSWER), "interrupt")
    target = str(seen[0]["response"]["id"])
    socket.send(interrupt(target, mode="conform_unknown_mode"))
    errors: list[dict[str, Any]] = []
    events = list(seen)
    while True:
        event = probe.read_until(socket, lambda event: True)
        if event["type"] in ANSWERS:
            if failed_code(event) == "interrupt_not_supported":
                raise CaseSkipped("the server does not interrupt (interrupt_not_supported)")
            raise CaseFailed(f"an interrupt of an unknown mode was answered with {event['type']}")
        if event["type"] == "error" and (event.get("error") or {}).get("param") == "mode":
            errors.append(event)
            continue
        events.append(event)
        if event["type"] in TERMINAL_EVENTS:
            break
    if not errors:
        # The response ended first: the refusal of the mode must still come.
        event = probe.read_until(
            socket, lambda event: event["type"] in ANSWERS or event["type"] == "error"
        )
        if failed_code(event) == "response_already_completed":
            raise CaseSkipped(TOO_FAST)
        if event["type"] != "error" or (event.get("error") or {}).get("param") != "mode":
            raise CaseFailed(f"an interrupt of an unknown mode was answered with {describe(event)}")
        errors.append(event)
    if len(errors) != 1:
        raise CaseFailed(f"{len(errors)} error events with param 'mode', not one")
    if (errors[0].get("error") or {}).get("type") != "invalid_request_error":
        raise CaseFailed(f"the unknown mode was answered with {describe(errors[0])}")
    turn = probe.checked(request, events)
    if turn.last["type"] != "response.completed":
        raise CaseFailed(f"after the refused interrupt the response ended {describe(turn.last)}")
    return f"{describe(errors[0])[:60]}...; the response ran on and completed"


def steering_rejected(probe: Probe) -> str:
    socket = probe.socket()
    _, _, steers = interrupted(probe, socket, extra={"steer": True})
    accepted_steers = [event for event in steers if event["type"] == "response.steer.accepted"]
    if not accepted_steers:
        raise CaseSkipped(f"the steer was not accepted: {[describe(e) for e in steers]}")
    steer_id = accepted_steers[0]["steer"]["id"]
    # The rest: the returned input, and nothing else before a warm-up's events.
    socket.send(probe.create("Still there?", generate=False))
    later: list[dict[str, Any]] = []
    probe.read_until(socket, lambda event: event["type"] in TERMINAL_EVENTS, later)
    returned = [
        event
        for event in steers + later
        if event["type"] == "response.steer.failed"
        and (event.get("steer") or {}).get("id") == steer_id
    ]
    if len(returned) != 1:
        raise CaseFailed(f"the steer's input came back {len(returned)} times, not once")
    created = [event for event in later if event["type"] == "response.created"]
    if len(created) != 1 or later[-1]["type"] != "response.completed":
        raise CaseFailed("a response started after the interrupt besides the client's warm-up")
    if (returned[0].get("steer") or {}).get("input") is None:
        raise CaseFailed("response.steer.failed does not return the input")
    code = (returned[0].get("error") or {}).get("code")
    return f"the interrupted response's pending steer came back once ({code}); no successor"


def race(probe: Probe) -> str:
    socket = probe.socket()
    request = probe.create("Say hello.")
    target, seen = probe.start_streaming(socket, request)
    socket.send(interrupt(target))
    answer: dict[str, Any] | None = None
    events = list(seen)
    while answer is None or events[-1]["type"] not in TERMINAL_EVENTS:
        event = probe.read_until(socket, lambda event: True)
        is_answer = event["type"] in ANSWERS or (event["type"] == "error" and answer is None)
        if not is_answer:
            events.append(event)
            continue
        _answer_problem(event)
        if answer is not None:
            raise CaseFailed(f"a second answer to one interrupt: {describe(event)}")
        answer = event
        if event["type"] == "response.interrupt.accepted":
            events.append(event)  # one of the response's events
        elif failed_code(event) != "response_already_completed" or (
            events[-1]["type"] not in TERMINAL_EVENTS
        ):
            raise CaseFailed(f"the interrupt racing the response's end got {describe(event)}")
    turn = probe.checked(request, events)
    kinds = [event["type"] for event in turn.events]
    if answer["type"] == "response.interrupt.accepted":
        if "response.completed" in kinds:
            raise CaseFailed("response.completed came after response.interrupt.accepted")
        won = "the interrupt won: " + describe(turn.last)
    else:
        won = "the response's end won: " + describe(turn.last) + ", then response_already_completed"
    probe.still_works(socket, "the race")
    return won + "; the socket serves on"


CASES: Final = (
    ConformanceCase(
        "interrupt.accepted",
        "a response.interrupt of a streaming response is answered with "
        "response.interrupt.accepted (response_id, sequence_number, on its lane), the message "
        "streaming gets response.output_item.interrupted (or its done), and the response ends "
        "with response.incomplete, reason interrupted; never response.completed",
        SOURCE,
        accepted,
    ),
    ConformanceCase(
        "interrupt.continued",
        "a response.create with previous_response_id the interrupted response continues it on "
        "the same socket",
        SOURCE,
        continued,
    ),
    ConformanceCase(
        "interrupt.response_not_found",
        "an interrupt of an id no response of the connection has fails with "
        "response.interrupt.failed (response_not_found); the socket serves on",
        SOURCE,
        response_not_found,
    ),
    ConformanceCase(
        "interrupt.response_already_completed",
        "an interrupt of a finished response fails with response.interrupt.failed "
        "(response_already_completed); the socket serves on",
        SOURCE,
        already_completed,
    ),
    ConformanceCase(
        "interrupt.unknown_mode",
        "an interrupt with an unknown mode gets an invalid_request_error with param mode, and "
        "the response runs on to response.completed",
        SOURCE,
        unknown_mode,
    ),
    ConformanceCase(
        "interrupt.steering_rejected",
        "steering input pending in an interrupted response comes back once in "
        "response.steer.failed, and no successor starts",
        SOURCE,
        steering_rejected,
    ),
    ConformanceCase(
        "interrupt.race",
        "an interrupt racing the response's end gets one answer: accepted (and no "
        "response.completed), or response_already_completed after the end; the socket serves on",
        SOURCE,
        race,
    ),
)
