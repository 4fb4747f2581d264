"""Conformance cases of conversation state: chains, ``previous_response_not_found``, state tied to
the connection, the cache's eviction rules for failed continuations, fresh chains and warm-ups
(``generate: false``)."""

from __future__ import annotations

import secrets
from typing import Any, Final

from ._client import SyncSocket
from ._conformance import LONG_ANSWER, CaseFailed, CaseSkipped, ConformanceCase, Probe
from ._conformance_lanes import GUIDE, fresh_chain

STATE_SOURCE: Final = (
    f"{GUIDE}, continuing with previous_response_id; docs/protocol.md, Conversation state"
)
WARM_UP_SOURCE: Final = f"{GUIDE}, warm-up (generate: false); docs/protocol.md, response.create"
#: A field value every Responses API refuses (metadata values are strings), and
#: ``ws_mode`` leaves to the handler: a continuation carrying it fails.
FAILING_FIELDS: Final = {"metadata": {"conform": 1}}


def chained(probe: Probe) -> str:
    socket = probe.socket()
    first = probe.finished_turn(socket, probe.create(), "the first turn")
    request = probe.create(probe.follow_up(first), previous_response_id=first.id)
    second = probe.finished_turn(socket, request, "the continuation")
    return f"{first.id} -> {second.id}, with only the new input"


def unknown_previous_response(probe: Probe) -> str:
    socket = probe.socket()
    unknown = "resp_conform_" + secrets.token_hex(8)
    turn = probe.turn(socket, probe.create(previous_response_id=unknown))
    probe.expect_error(
        turn,
        "previous_response_not_found",
        param="previous_response_id",
        what="an unknown previous_response_id",
    )
    probe.still_works(socket, "previous_response_not_found")
    return "400 previous_response_not_found, param previous_response_id; the socket stays open"


def not_across_connections(probe: Probe) -> str:
    one, two = probe.socket(), probe.socket()
    first = probe.finished_turn(one, probe.create(store=False), "a turn on the first socket")
    request = probe.create(probe.follow_up(first), previous_response_id=first.id, store=False)
    turn = probe.turn(two, request)
    probe.expect_error(
        turn,
        "previous_response_not_found",
        param="previous_response_id",
        what="a store=false response continued on another socket",
    )
    return f"{first.id} (store=false) is not found on another socket"


def must_fail(probe: Probe, socket: SyncSocket, request: dict[str, Any], what: str) -> None:
    """Run ``request`` (made to fail by :data:`FAILING_FIELDS`); :class:`CaseSkipped` when the
    endpoint accepts it, for then no ``what`` (a continuation, a fork) can be made to fail."""
    if probe.turn(socket, request).finished:
        raise CaseSkipped(
            f"the endpoint accepted a {what} with metadata {{'conform': 1}} (a non-string "
            f"metadata value), so no {what} could be made to fail"
        )


def failed_continuation_evicts(probe: Probe) -> str:
    socket = probe.socket()
    # On the default lane: the rule is about one lane, any lane.
    parent = probe.finished_turn(socket, probe.create(), "the parent")
    bad = probe.create(probe.follow_up(parent), previous_response_id=parent.id, **FAILING_FIELDS)
    must_fail(probe, socket, bad, "continuation")
    retry = probe.create(probe.follow_up(parent), previous_response_id=parent.id)
    turn = probe.turn(socket, retry)
    probe.expect_error(
        turn,
        "previous_response_not_found",
        param="previous_response_id",
        what="a retry after a failed same-lane continuation",
    )
    return "the failed continuation evicted its parent: the retry got previous_response_not_found"


def failed_fork_keeps(probe: Probe) -> str:
    socket = probe.socket()
    away = "conform-away-" + secrets.token_hex(3)
    parent = probe.finished_turn(socket, probe.create(), "the parent (default lane)")
    bad = probe.create(
        probe.follow_up(parent), previous_response_id=parent.id, stream_id=away, **FAILING_FIELDS
    )
    must_fail(probe, socket, bad, "fork")
    retry = probe.create(probe.follow_up(parent), previous_response_id=parent.id)
    turn = probe.finished_turn(socket, retry, "a continuation after a failed cross-lane fork")
    return f"after the failed fork, {parent.id} was continued ({turn.id})"


def fresh_chain_never_inherits(probe: Probe) -> str:
    return fresh_chain(probe, None)


def warm_up_created_completed(probe: Probe) -> str:
    socket = probe.socket()
    turn = probe.turn(socket, probe.create("Get ready.", generate=False))
    kinds = [event["type"] for event in turn.events]
    if kinds[0] != "response.created" or kinds[-1] != "response.completed":
        raise CaseFailed(f"a warm-up gave {' -> '.join(kinds)}")
    return " -> ".join(kinds) + ", status completed, empty output"


def warm_up_chainable(probe: Probe) -> str:
    socket = probe.socket()
    warm = probe.turn(socket, probe.create("Get ready.", generate=False))
    if warm.last.get("type") != "response.completed":
        raise CaseFailed(f"the warm-up ended with {warm.last.get('type')}")
    request = probe.create("Say hello.", previous_response_id=warm.id)
    turn = probe.finished_turn(socket, request, "the continuation of a warm-up")
    return f"{warm.id} (warm-up) -> {turn.id}"


def warm_up_input_joins_context(probe: Probe) -> str:
    socket = probe.socket()
    warm = probe.turn(socket, probe.create(LONG_ANSWER, generate=False))
    if warm.last.get("type") != "response.completed":
        raise CaseFailed(f"the warm-up ended with {warm.last.get('type')}")
    after = probe.finished_turn(
        socket, probe.create("Say hello.", previous_response_id=warm.id), "the continuation"
    )
    alone = probe.finished_turn(socket, probe.create("Say hello."), "the same request alone")
    with_warm_up, without = after.usage_input_tokens(), alone.usage_input_tokens()
    if with_warm_up is None or without is None:
        raise CaseSkipped("the server reports no usage.input_tokens to compare contexts with")
    if with_warm_up <= without:
        raise CaseFailed(
            f"the continuation of a warm-up counted {with_warm_up} input tokens, the same "
            f"request alone {without}: the warm-up's input is not in its context"
        )
    return f"{with_warm_up} input tokens after the warm-up, {without} without"


CASES: Final = (
    ConformanceCase(
        "state.chained",
        "a create with previous_response_id and only the new input items continues the "
        "conversation, and the response echoes previous_response_id",
        STATE_SOURCE,
        chained,
    ),
    ConformanceCase(
        "state.previous_response_not_found",
        "an unknown previous_response_id gets 400 previous_response_not_found, param "
        "previous_response_id, and the socket stays open",
        f"{GUIDE}, previous_response_not_found; docs/protocol.md, Errors",
        unknown_previous_response,
    ),
    ConformanceCase(
        "state.connection_scoped",
        "previous-response state lives on the connection: with store=false an id from "
        "another socket does not resolve",
        STATE_SOURCE,
        not_across_connections,
    ),
    ConformanceCase(
        "state.failed_continuation_evicts",
        "a continuation that fails on its parent's lane evicts the parent, so a retry gets "
        "previous_response_not_found",
        f"{GUIDE}, previous_response_not_found; docs/protocol.md, Conversation state",
        failed_continuation_evicts,
    ),
    ConformanceCase(
        "state.failed_fork_keeps_parent",
        "a continuation that fails on another lane (a fork) keeps the parent",
        "docs/protocol.md, Conversation state",
        failed_fork_keeps,
    ),
    ConformanceCase(
        "state.fresh_chain_never_inherits",
        "a create without previous_response_id starts a new chain and inherits no cached "
        "history, even on a lane that has some",
        "docs/protocol.md, Conversation state",
        fresh_chain_never_inherits,
    ),
    ConformanceCase(
        "warmup.created_completed",
        "generate: false answers response.created then response.completed (status "
        "completed, empty output)",
        WARM_UP_SOURCE,
        warm_up_created_completed,
    ),
    ConformanceCase(
        "warmup.chainable",
        "a warm-up's response id can be continued with previous_response_id",
        WARM_UP_SOURCE,
        warm_up_chainable,
    ),
    ConformanceCase(
        "warmup.input_joins_context",
        "a warm-up's input is part of the context of what continues it",
        WARM_UP_SOURCE,
        warm_up_input_joins_context,
    ),
)
