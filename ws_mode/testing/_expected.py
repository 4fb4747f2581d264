"""The HTTP side of the comparison: what the client sends each turn, the request an HTTP client
keeping the full history would send instead, and whether the handler received exactly that.

The expected context of every turn is built from the outputs the socket actually returned on
earlier turns, so handlers whose answers change from run to run (a real model) are checked as
well as deterministic ones: nothing is compared against a second run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._protocol import SOCKET_ONLY_FIELDS
from .._settings import FullContext
from ._diff import diff_fields, diff_items, short
from ._items import Item, as_items, copy_json, pending_calls
from ._program import Step, WrongInput
from ._recorder import RUN_HEADER, RecordedCall
from ._report import TurnFailed

# Fields of a create the handler never receives as they are.
NOT_FORWARDED = SOCKET_ONLY_FIELDS | {"input", "previous_response_id"}
#: The call id of the output a wrong-input step sends for a call no response made.
UNKNOWN_CALL_ID = "call_ws_mode_check_unknown"


@dataclass
class Node:
    """A finished response the program can build on."""

    id: str
    lane: str | None
    context: list[Item]
    output: list[Item]
    turn: int
    evicted: bool = False

    def history(self) -> list[Item]:
        """The context a continuation of this response builds on: its own, then its output."""
        return [*self.context, *self.output]


@dataclass
class Plan:
    """One turn: the response it builds on, what the client sends, and the whole context an
    HTTP client would send."""

    parent: Node | None
    request: dict[str, Any]
    context: list[Item]
    #: The wrong input the turn sends, as it applied to the parent (None: right input).
    wrong: WrongInput | None = None

    def http_request(self, *, history: bool = True) -> dict[str, Any]:
        """The request an HTTP client sends for this turn: the same fields, the whole context
        (or, with `history=False`, the new input alone) and no previous_response_id."""
        body = {key: value for key, value in self.request.items() if key not in NOT_FORWARDED}
        body["stream"] = True
        new = self.context[len(self.context) - len(as_items(self.request["input"])) :]
        body["input"] = copy_json(self.context if history else new)
        return body


def plan_turn(step: Step, nodes: list[Node]) -> Plan:
    """The turn `step` makes of the responses so far."""
    live = [node for node in nodes if not node.evicted]
    parent: Node | None = None
    if step.action != "fresh" and live:
        if step.action == "continue":
            own = [node for node in live if node.lane == step.lane]
            parent = (own or live)[-1]
        else:
            parent = live[step.parent % len(live)]
    prefix = parent.history() if parent is not None else []
    new, wrong = new_input(step, prefix), None
    if step.wrong is not None:
        new, wrong = wrong_input(step, step.wrong, prefix)
    request: dict[str, Any] = {"type": "response.create", "model": step.model}
    request.update(copy_json(dict(step.fields)))
    if step.instructions is not None:
        request["instructions"] = step.instructions
    if step.tools is not None:
        request["tools"] = copy_json([dict(tool) for tool in step.tools])
    if step.action == "recover" and parent is not None:
        # The documented recovery: the whole context, previous_response_id null.
        request["input"] = copy_json([*prefix, *as_items(new)])
        request["previous_response_id"] = None
        context = copy_json(request["input"])
    else:
        request["input"] = new
        if parent is not None:
            request["previous_response_id"] = parent.id
        context = copy_json([*prefix, *as_items(new)])
    if step.lane is not None:
        request["stream_id"] = step.lane
    if not step.generate:
        request["generate"] = False
    return Plan(parent, request, context, wrong)


def new_input(step: Step, prefix: list[Item]) -> str | list[Item]:
    """What the client sends this turn: outputs for the tool calls left unanswered, else a
    user message in the step's form."""
    if step.form == "empty":
        return []
    pending = pending_calls(prefix)
    if pending:
        return [
            {"type": "function_call_output", "call_id": call_id, "output": step.text}
            for call_id in pending
        ]
    if step.form == "string":
        return step.text
    if step.form == "parts":
        content = [{"type": "input_text", "text": step.text}]
        return [{"type": "message", "role": "user", "content": content}]
    if step.form == "developer":
        developer = {"role": "developer", "content": "Answer in one short sentence."}
        return [developer, {"role": "user", "content": step.text}]
    return [{"role": "user", "content": step.text}]


def wrong_input(step: Step, wrong: WrongInput, prefix: list[Item]) -> tuple[list[Item], WrongInput]:
    """The wrong input `step` sends after `prefix`, and which wrong input it is: duplicate or
    missing outputs need calls left unanswered; without them, an unknown call's output."""
    pending = pending_calls(prefix)
    outputs = [
        {"type": "function_call_output", "call_id": call_id, "output": step.text}
        for call_id in pending
    ]
    if pending and wrong == "duplicate_output":
        return [*outputs, copy_json(outputs[0])], wrong
    if pending and wrong == "missing_outputs":
        return [{"role": "user", "content": step.text}], wrong
    unknown = {"type": "function_call_output", "call_id": UNKNOWN_CALL_ID, "output": step.text}
    return [*outputs, unknown], "unknown_call"


def check_calls(
    step: Step,
    plan: Plan,
    calls: list[RecordedCall],
    *,
    started: bool,
    token: str,
    mode: FullContext | None,
) -> None:
    """Raise `TurnFailed` unless the handler was called once (never for a warm-up) with the
    request an HTTP client keeping the full history sends. `started`: the turn began with
    `response.created`; `token`: the run's handshake tag; `mode`: the middleware's
    `full_context`, when known."""
    if not step.generate:
        if calls:
            raise TurnFailed("the handler was called for a warm-up (generate: false)")
        return
    if len(calls) > 1 or (started and not calls):
        raise TurnFailed(f"the handler was called {len(calls)} times for one turn, expected once")
    if not calls:
        return  # refused before the handler ran (allow_errors)
    call = calls[0]
    body = call.body
    if not isinstance(body, dict):
        raise TurnFailed("the handler's request body is not a JSON object", short(body))
    if call.headers.get(RUN_HEADER) != token:
        raise TurnFailed(
            "the handler's request does not carry the socket handshake's headers",
            f"{RUN_HEADER} was sent on the handshake and is missing on the handler call",
        )
    expected = {key: value for key, value in plan.request.items() if key not in NOT_FORWARDED}
    expected["stream"] = True
    received = {key: value for key, value in body.items() if key not in NOT_FORWARDED}
    if received != expected:
        raise TurnFailed(
            "the handler's request fields differ from the HTTP request's",
            diff_fields(expected, received),
        )
    if call.context != plan.context:
        what = "body's input" if call.full_context else "Turn.history()"
        raise TurnFailed(
            "the handler did not receive the context an HTTP client with the full "
            f"history sends (compared with the {what})",
            diff_items(plan.context, call.context),
        )
    if call.full_context:
        if body.get("previous_response_id") is not None:
            raise TurnFailed(
                "a full-context request carries a previous_response_id",
                f"previous_response_id: {body['previous_response_id']!r}",
            )
        return
    _check_cache_aware(plan, body, mode)


def _check_cache_aware(plan: Plan, body: dict[str, Any], mode: FullContext | None) -> None:
    """A cache-aware request carries the client's `previous_response_id` and new input."""
    sent_previous = plan.request.get("previous_response_id")
    if mode == "always":
        raise TurnFailed("full_context='always', but the handler got only the new items")
    if sent_previous is None:
        raise TurnFailed(
            "a request without previous_response_id reached the handler without the whole context"
        )
    if body.get("previous_response_id") != sent_previous:
        raise TurnFailed(
            "the cache-aware request's previous_response_id differs from the client's",
            f"sent {sent_previous!r}, the handler got {body.get('previous_response_id')!r}",
        )
    if body.get("input") != plan.request["input"]:
        raise TurnFailed(
            "the cache-aware request's input is not the new input the client sent",
            diff_items(as_items(plan.request["input"]), as_items(body.get("input"))),
        )
