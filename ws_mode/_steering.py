"""Steering: `response.steer` input queued into a response while it streams, for any handler.

A steer targets an active response by id. It is acknowledged (`response.steer.accepted`: the
input is queued, nothing more) and kept in the response's :class:`SteerInbox`. Then, for a
handler that knows nothing of steering:

- at the next safe output boundary (an output item finished that is not a call the client
  must answer) the response ends with `response.incomplete`, `incomplete_details.reason:
  "steered"`, and the rest of the handler's output is dropped;
- a successor turn starts by itself on the same lane, through the same handler, with the
  steered response's settings, continuing from it with the queued input (its
  `response.created` is the commit point; a successor that fails before it returns the input
  in `response.steer.failed`, `successor_creation_failed`);
- a response that ends waiting for the client's tool output keeps the input queued and says
  so with `response.steer.pending` (`required_input`: the calls to answer); the client's next
  `response.create` continuing that response gets the queued input prepended to its own (its
  `response.created` commits it too; a continuation that fails before it returns the input in
  `response.steer.failed`, `successor_creation_failed`).

Input waiting in any of these places counts at its decoded size (as the cache counts items)
against `Limits.max_steer_bytes` per connection and the process's memory budget, from its
acceptance until it is committed, returned or dropped.

A handler may take the input itself instead: `Turn.claim_steering()` early in the turn, then
`Turn.take_steering()` between tokens. Steering input lives on the connection only.

The turn runner is the one caller of a connection's :class:`Steering`: it has steers answered
there, opens each steerable response's :class:`SteerInbox` there, and asks it what follows a
response that had input queued. The rest ask the inbox: the response's stream whether to cut
the response (`SteerInbox.cut`), the handler's `Turn` for the input it claimed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from ._budget import MemoryBudget
from ._cache import decoded_size
from ._client_events import CreateEvent, SteerEvent, text_input
from ._items import Items
from ._limits import Limits
from ._protocol import (
    SERVER_IS_OVERLOADED,
    SERVER_SHUTTING_DOWN,
    SERVER_SHUTTING_DOWN_MESSAGE,
    client_call_answer,
    memory_budget_message,
    quoted_id,
)
from ._tap import ResponseTap

#: Responses that may hold steering input waiting for the client's tool output; past this
#: many, the oldest one's input is dropped (a client that never continued it). What that
#: input may cost is bounded by `Limits.max_steer_bytes`; this only bounds the bookkeeping.
MAX_WAITING_RESPONSES: Final = 256

#: The message of each `response.steer.failed` code.
STEER_MESSAGES = {
    "invalid_input": "The steering input is invalid: {detail}",
    "response_not_found": "Response with id '{id}' is not available on this connection.",
    "steering_not_supported": "Steering is switched off on this server.",
    "not_steerable": "Responses bound to a conversation or using automatic compaction "
    "(context_management) cannot be steered.",
    "response_already_completed": "Response with id '{id}' has completed and no longer accepts "
    "steering input.",
    "too_many_pending_steers": "Too much steering input is pending: at most {limit} submissions "
    "for one response (Limits.max_pending_steers), {bytes} bytes for the connection counted "
    "decoded (Limits.max_steer_bytes).",
    SERVER_IS_OVERLOADED: memory_budget_message("this steering input"),
    "response_not_active": "The response ended before the steering input could be applied.",
    "response_interrupted": "The response was interrupted (response.interrupt) before the "
    "steering input could be applied; no response continues with it.",
    "successor_creation_failed": "The response continuing with the steering input could not "
    "be created.",
    SERVER_SHUTTING_DOWN: SERVER_SHUTTING_DOWN_MESSAGE,
}


_STEER_PART_TYPES = frozenset({"input_text", "input_image", "input_file"})


def steer_input_problem(value: Any) -> str | None:
    """Why `value` is not valid steering input (user messages only), or None when it is."""
    if isinstance(value, str):
        return None if value else "the input string is empty."
    if not isinstance(value, list) or not value:
        return "'input' must be a string or a non-empty array of user messages."
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            return f"input[{index}] is not an object."
        if item.get("type", "message") != "message" or item.get("role") != "user":
            return f"input[{index}] is not a user message; only user messages can steer."
        if set(item) - {"type", "role", "content"}:
            return f"input[{index}] may only have 'type', 'role' and 'content'."
        content = item.get("content")
        if isinstance(content, str):
            continue
        if not isinstance(content, list) or not all(
            isinstance(part, dict) and part.get("type") in _STEER_PART_TYPES for part in content
        ):
            return (
                f"input[{index}].content must be a string or an array of input_text, "
                "input_image and input_file parts."
            )
    return None


@dataclass(slots=True)
class Steer:
    """One accepted steering submission."""

    id: str
    target: str
    input: Any  # as the client sent it: returned as is when it cannot be committed
    items: list[dict[str, Any]]
    size: int = 0  # what the input costs held decoded (`ws_mode._cache.decoded_size`)


def _items(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return text_input(value)
    return list(value)


@dataclass(slots=True)
class SteerInbox:
    """The steering input queued for one response: shared by its stream (which cuts the
    response at a boundary) and its Turn (a handler that claimed steering takes it)."""

    steers: list[Steer] = field(default_factory=list)
    #: The handler takes the input itself: the response is not cut for it.
    claimed: bool = False
    #: Set while input waits; a claiming handler may wait on it.
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    #: Called with what a handler took (applied: it no longer waits).
    applied: Callable[[list[Steer]], None] | None = None

    def put(self, steer: Steer) -> None:
        """Queue one accepted steer."""
        self.steers.append(steer)
        self.arrived.set()

    def claim(self) -> None:
        """The handler takes the input itself (`take`): the response is not cut for it."""
        self.claimed = True

    def take(self) -> list[Steer]:
        """Everything queued, in submission order, for a handler that applies it itself; the
        inbox is empty afterwards."""
        steers = self.drain()
        if steers and self.applied is not None:
            self.applied(steers)
        return steers

    def drain(self) -> list[Steer]:
        """Everything queued, in submission order, still waiting to be committed."""
        steers, self.steers = self.steers, []
        self.arrived.clear()
        return steers

    @property
    def cuts(self) -> bool:
        """Whether the response is to end at its next safe boundary."""
        return bool(self.steers) and not self.claimed

    def cut(self, tap: ResponseTap, number: Callable[[], int]) -> dict[str, Any] | None:
        """Asked after an output item finished: the `response.incomplete` (numbered by
        `number`, called only for it) that ends the response here for the input queued, or
        None when it goes on: nothing waits for it to end, an item the client must answer is
        out (steering never cancels tools), or the response has not started or has ended."""
        if not self.cuts or tap.client_calls or tap.started is None or tap.finished:
            return None
        response = {
            **tap.started,
            "status": "incomplete",
            "incomplete_details": {"reason": "steered"},
            "output": tap.items_so_far(),
        }
        return {
            "type": "response.incomplete",
            "sequence_number": number(),
            "response": response,
        }


def required_input(output: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stubs of what the client owes for `output`: one per call it must answer."""
    stubs = []
    for item in output:
        answer = client_call_answer(item)
        if answer is None:
            continue
        if answer == "mcp_approval_response":
            stubs.append({"type": answer, "approval_request_id": item.get("id")})
            continue
        stub: dict[str, Any] = {"type": answer, "call_id": item.get("call_id")}
        if answer == "function_call_output":
            stub["name"] = item.get("name")
        elif answer == "tool_search_output":
            stub["execution"] = "client"
        stubs.append(stub)
    return stubs


class Steering:
    """One connection's steering: accepting steers into active responses' inboxes, and the
    input still queued behind responses that wait for the client."""

    def __init__(
        self, *, enabled: bool, limits: Limits | None = None, budget: MemoryBudget | None = None
    ) -> None:
        self.enabled = enabled
        self.limits = limits if limits is not None else Limits()
        self.budget = budget
        #: Responses that ended waiting for the client, and the steers queued behind them.
        self.pending: dict[str, list[Steer]] = {}
        #: The steers accepted and not yet committed, returned or dropped: what they cost.
        self._held: dict[str, int] = {}

    @property
    def bytes(self) -> int:
        """What the steering input waiting on this connection costs (`max_steer_bytes`)."""
        return sum(self._held.values())

    def inbox_for(self, create: CreateEvent) -> SteerInbox | None:
        """The inbox of the response `create` asks for, where steers for it are queued (what
        its handler takes there stops counting); None when steering is off or that response
        may not be steered."""
        if not self.enabled or not self.steerable(create):
            return None
        return SteerInbox(applied=self.release)

    def release(self, steers: Iterable[Steer]) -> None:
        """`steers` no longer wait (committed, returned or dropped): give back what they held.
        Releasing one twice is harmless."""
        for steer in steers:
            size = self._held.pop(steer.id, None)
            if size is not None and self.budget is not None:
                self.budget.release(size)

    def close(self) -> None:
        """The connection ended: everything still waiting is dropped with it."""
        self.pending.clear()
        held, self._held = self._held, {}
        if self.budget is not None:
            self.budget.release(sum(held.values()))

    def accept(
        self,
        steer: SteerEvent,
        active: SteerInbox | None,
        lane: str | None,
        *,
        streaming: bool,
        known: bool,
        draining: bool = False,
    ) -> Steer | dict[str, Any]:
        """The accepted :class:`Steer` (already queued in `active`, the inbox of the response
        streaming now), or the `response.steer.failed` event to answer with. `streaming`: the
        target is streaming (with no inbox: it cannot be steered); `known`: it is a response
        this connection has finished; `draining`: the connection drains, and starts no turn
        (`server_shutting_down`, as a create gets meanwhile)."""
        target = steer.previous_response_id

        def failed(code: str, message: str) -> dict[str, Any]:
            return steer_failed_event(code, target, steer.input, message, stream_id=lane)

        if not self.enabled:
            return failed("steering_not_supported", STEER_MESSAGES["steering_not_supported"])
        if draining:
            return failed(SERVER_SHUTTING_DOWN, STEER_MESSAGES[SERVER_SHUTTING_DOWN])
        if steer.unexpected:
            names = ", ".join(repr(name[:64]) for name in steer.unexpected[:5])
            problem: str | None = (
                f"response.steer takes only 'type', 'previous_response_id' and 'input'; "
                f"unexpected: {names}."
            )
        else:
            problem = steer_input_problem(steer.input)
        if problem is not None:
            return failed("invalid_input", STEER_MESSAGES["invalid_input"].format(detail=problem))
        if active is None and streaming:
            return failed("steering_not_supported", STEER_MESSAGES["not_steerable"])
        if active is None:
            if known:
                message = STEER_MESSAGES["response_already_completed"].format(id=quoted_id(target))
                return failed("response_already_completed", message)
            return failed(
                "response_not_found",
                STEER_MESSAGES["response_not_found"].format(id=quoted_id(target)),
            )
        size = decoded_size(orjson.dumps(steer.input))
        limits = self.limits
        if (
            len(active.steers) >= limits.max_pending_steers
            or self.bytes + size > limits.max_steer_bytes
        ):
            message = STEER_MESSAGES["too_many_pending_steers"].format(
                limit=limits.max_pending_steers, bytes=limits.max_steer_bytes
            )
            return failed("too_many_pending_steers", message)
        if self.budget is not None and not self.budget.reserve(size):
            return failed(SERVER_IS_OVERLOADED, STEER_MESSAGES[SERVER_IS_OVERLOADED])
        accepted = Steer(
            id="steer_" + secrets.token_hex(16),  # 32 hex digits, as OpenAI's
            target=target,
            input=steer.input,
            items=_items(steer.input),
            size=size,
        )
        self._held[accepted.id] = size
        active.put(accepted)
        return accepted

    @staticmethod
    def steerable(create: CreateEvent) -> bool:
        """Whether the response `create` asks for may be steered: not one bound to a
        conversation or compacting automatically (as OpenAI's API has it)."""
        fields = create.fields
        return fields.get("conversation") is None and fields.get("context_management") is None

    def prepend_pending(self, create: CreateEvent) -> tuple[CreateEvent, list[Steer]]:
        """`create` with the input queued behind its parent prepended, in submission order
        (the parent waited for the client's tool output), and the steers it is to commit:
        its `response.created` commits them; if it fails before, they are returned
        (`settle`), never lost."""
        parent = create.previous_response_id
        steers = self.pending.pop(parent, None) if parent is not None else None
        if not steers:
            return create, []
        items = [item for steer in steers for item in steer.items]
        items.extend(create.new_input)
        return _with_input(create, items), steers

    async def follow(
        self,
        create: CreateEvent,
        outcome: Outcome,
        send: Callable[[dict[str, Any]], Awaitable[None]],
        *,
        draining: bool = False,
    ) -> tuple[CreateEvent, list[Steer]] | None:
        """After a response ended: the successor turn to run for the input still queued in its
        inbox (and the steers it commits), or None. A response that waits for the client keeps
        the input queued and says so (`response.steer.pending`); one that failed returns it
        (`response.steer.failed`, `response_not_active`), and so does one the client
        interrupted (`response_interrupted`): nothing continues it by itself. On a connection
        `draining` no successor starts: the input goes back (`server_shutting_down`)."""
        steers = outcome.inbox.drain()
        if not steers:
            return None
        lane = create.stream_id
        if outcome.response_id is None or outcome.output is None or outcome.interrupted or draining:
            self.release(steers)
            code = (
                "response_interrupted"
                if outcome.interrupted
                else SERVER_SHUTTING_DOWN
                if draining
                else "response_not_active"
            )
            for steer in steers:
                await send(outcome.numbered(not_committed(steer, code, lane)))
            return None
        stubs = required_input(outcome.output)
        if stubs:
            self.pending.setdefault(outcome.response_id, []).extend(steers)
            while len(self.pending) > MAX_WAITING_RESPONSES:
                # The oldest: never continued.
                self.release(self.pending.pop(next(iter(self.pending))))
            for steer in steers:
                await send(outcome.numbered(pending_event(steer, stubs, lane)))
            return None
        items = [item for steer in steers for item in steer.items]
        return _with_input(create, items, previous_response_id=outcome.response_id), steers

    async def settle(
        self,
        steers: list[Steer],
        created: bool,
        lane: str | None,
        send: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> None:
        """The response that was to commit `steers` (a successor, or the client's continuation
        they were prepended to) ended: `created` (it sent `response.created`) commits them;
        otherwise their input is returned (`successor_creation_failed`). Either way they no
        longer wait."""
        self.release(steers)
        if not created:
            for steer in steers:
                await send(not_committed(steer, "successor_creation_failed", lane))


@dataclass(slots=True)
class Outcome:
    """How a response that had a steering inbox ended: its id once `response.created` went out
    (None when it never started), its output when it finished well (None when it failed), and
    the inbox."""

    inbox: SteerInbox
    response_id: str | None
    output: list[dict[str, Any]] | None
    #: The events the response's stream sent: the next one's sequence number.
    sent: int = 0
    #: The client interrupted the response (`response.interrupt`).
    interrupted: bool = False

    def numbered(self, event: dict[str, Any]) -> dict[str, Any]:
        """`event` numbered after the response's events."""
        event["sequence_number"] = self.sent
        self.sent += 1
        return event


def _with_input(
    create: CreateEvent, items: list[dict[str, Any]], *, previous_response_id: str | None = None
) -> CreateEvent:
    return dataclasses.replace(
        create,
        items=Items(items),
        input_text=None,
        input_sent=True,
        previous_response_id=previous_response_id or create.previous_response_id,
        generate=True,
    )


def _steer_event(
    kind: str, lane: str | None, sequence_number: int, **fields: Any
) -> dict[str, Any]:
    """A `response.steer.*` event of `kind`, on `lane` when it has one."""
    event: dict[str, Any] = {"type": kind, "sequence_number": sequence_number, **fields}
    if lane is not None:
        event["stream_id"] = lane
    return event


def accepted_event(steer: Steer, lane: str | None, sequence_number: int) -> dict[str, Any]:
    """`response.steer.accepted`: the input is queued (not yet applied); numbered among the
    events of the response it steers."""
    target = {"id": steer.id, "previous_response_id": steer.target}
    return _steer_event("response.steer.accepted", lane, sequence_number, steer=target)


def pending_event(steer: Steer, stubs: list[dict[str, Any]], lane: str | None) -> dict[str, Any]:
    """`response.steer.pending`: the input stays queued until the client answers `stubs`."""
    return _steer_event(
        "response.steer.pending",
        lane,
        0,
        reason="waiting_for_required_input",
        required_input=stubs,
        steer={"id": steer.id, "previous_response_id": steer.target},
    )


def not_committed(steer: Steer, code: str, lane: str | None) -> dict[str, Any]:
    """`response.steer.failed` for accepted input that could not be committed."""
    event = steer_failed_event(
        code, steer.target, steer.input, STEER_MESSAGES[code], stream_id=lane
    )
    event["steer"]["id"] = steer.id
    return event


def steer_failed_event(
    code: str,
    previous_response_id: str,
    input: Any,
    message: str,
    *,
    stream_id: str | None = None,
) -> dict[str, Any]:
    """A `response.steer.failed` event returning the uncommitted input to the client; it
    carries the target response's lane when that is known."""
    # Always `invalid_request_error`, whatever the code: the SDKs type it so.
    return _steer_event(
        "response.steer.failed",
        stream_id,
        0,
        error={"type": "invalid_request_error", "code": code, "message": message},
        steer={"previous_response_id": previous_response_id, "input": input},
    )
