"""Conformance cases of lanes and limits: ``stream_id``'s syntax, its echo on every event, FIFO
on one lane, lanes running at once, forks across lanes, a lane reused without a parent, 16
responses in flight queued, and the 33rd named lane refused."""

from __future__ import annotations

import secrets
import time
from typing import Any, Final

from .._protocol import TERMINAL_EVENTS
from ._client import SyncSocket
from ._conformance import (
    LONG_ANSWER,
    CaseFailed,
    CaseSkipped,
    ConformanceCase,
    Probe,
    describe,
    message_streaming,
)

GUIDE: Final = "OpenAI WebSocket mode guide"
LANES_SOURCE: Final = f"{GUIDE}, stream_id; docs/protocol.md, Server events"
LIMITS_SOURCE: Final = f"{GUIDE}, limits; docs/limits.md"
#: OpenAI's limits: responses in flight per connection, named lanes per connection.
MAX_IN_FLIGHT: Final = 16
MAX_STREAMS: Final = 32


def _lane(name: str) -> str:
    return f"conform-{name}-{secrets.token_hex(3)}"


def stream_id_echoed(probe: Probe) -> str:
    socket = probe.socket()
    lane = _lane("echo")
    turn = probe.finished_turn(socket, probe.create(stream_id=lane), "a turn on a named lane")
    missing = [event["type"] for event in turn.events if event.get("stream_id") != lane]
    if missing:
        raise CaseFailed(f"events without stream_id {lane!r}: {', '.join(missing)}")
    error = probe.turn(
        socket, probe.create(stream_id=lane, previous_response_id="resp_conform_unknown")
    )
    if error.error is None:
        raise CaseFailed(
            f"an unknown previous_response_id was answered with {describe(error.last)}"
        )
    return f"{len(turn.events)} events and a previous_response_not_found error all carry it"


def default_lane_unmarked(probe: Probe) -> str:
    socket = probe.socket()
    turn = probe.finished_turn(socket, probe.create(), "a turn on the default lane")
    marked = [event["type"] for event in turn.events if "stream_id" in event]
    if marked:
        raise CaseFailed(f"default-lane events carry a stream_id: {', '.join(marked)}")
    return f"{len(turn.events)} events, none with a stream_id"


def stream_id_syntax(probe: Probe) -> str:
    socket = probe.socket()
    for lane in ("a", "conform.lane_0-Z", "x" * 256):
        turn = probe.turn(socket, probe.create("Hello", stream_id=lane, generate=False))
        if turn.last.get("type") != "response.completed":
            raise CaseFailed(f"stream_id of {len(lane)} characters: {describe(turn.last)}")
    return "1, 16 and 256 characters of [A-Za-z0-9_.-] accepted"


def invalid_stream_id(probe: Probe) -> str:
    socket = probe.socket()
    for lane in ("", "x" * 257, "has space", "slash/lane"):
        request = probe.create("Hello", stream_id=lane, generate=False)
        socket.send(request)
        event = probe.receive(socket)
        if event.get("type") != "error":
            raise CaseFailed(f"stream_id {lane[:20]!r} was answered with {describe(event)}")
        error = event.get("error") or {}
        if error.get("code") != "invalid_stream_id" or event.get("status") != 400:
            raise CaseFailed(
                f"stream_id {lane[:20]!r}: expected 400 invalid_stream_id, got {describe(event)}"
            )
        if error.get("param") != "stream_id":
            raise CaseFailed(
                f"invalid_stream_id with param {error.get('param')!r}, not 'stream_id'"
            )
    probe.still_works(socket, "invalid_stream_id")
    return "empty, 257 characters, a space and a slash: 400 invalid_stream_id, param stream_id"


def fifo(probe: Probe) -> str:
    socket = probe.socket()
    # On the default lane: a lane like any, and every server has it.
    requests = [
        probe.create(LONG_ANSWER),
        probe.create("Count to three."),
    ]
    for request in requests:
        socket.send(request)
    events: list[dict[str, Any]] = []
    ends: list[int] = []
    while len(ends) < 2:
        event = probe.read_until(socket, lambda event: True)
        events.append(event)
        if event["type"] in TERMINAL_EVENTS:
            ends.append(len(events))
    one = probe.checked(requests[0], events[: ends[0]])
    two = probe.checked(requests[1], events[ends[0] :])
    for what, turn in (("the first", one), ("the second", two)):
        if not turn.finished:
            raise CaseFailed(f"{what} request ended with {describe(turn.last)}")
    return "the second response started after the first one's terminal event"


#: Events of the slow lane after the other lane's request that show its stream was still going.
STILL_STREAMING: Final = 3
#: How many warm-ups' time the slow lane must have streamed on, while the other lane's request
#: got nothing, for the lanes to count as run one after the other; and the least such time.
SERIAL_WARMUPS: Final = 20
SERIAL_SECONDS: Final = 0.05


def concurrent(probe: Probe) -> str:
    socket = probe.socket()
    slow, quick = _lane("slow"), _lane("quick")
    # A message streaming on the slow lane (its tool calls answered first), then the other
    # lane's warm-up.
    long, seen = message_streaming(
        probe, socket, probe.create(LONG_ANSWER, stream_id=slow), "run beside a second lane"
    )
    socket.send(probe.create("Hello", stream_id=quick, generate=False))
    finished: list[str] = []
    events: dict[str, list[dict[str, Any]]] = {slow: list(seen), quick: []}
    slow_before_quick = 0  # events of the slow lane after the quick request, before its own
    first_read = last_read = 0.0  # when the first and the last of those were read
    while len(finished) < 2:
        event = probe.receive(socket)
        lane = event.get("stream_id")
        if lane not in events:
            raise CaseFailed(f"an event with stream_id {lane!r}: {describe(event)}")
        if lane == slow and not events[quick]:
            slow_before_quick += 1
            last_read = time.monotonic()
            first_read = first_read or last_read
        events[lane].append(event)
        if event["type"] in TERMINAL_EVENTS:
            finished.append(lane)
    probe.checked(long, events[slow])
    if finished[0] == quick:
        return "a warm-up on a second lane finished while the first lane's response streamed"
    # The long response ended before the other lane was heard of. Lanes that run one after the
    # other look so; so does an endpoint that wrote the whole response before it read the other
    # request. Only a stream that went on for far longer than a warm-up takes tells them apart.
    streamed_on = last_read - first_read
    warmup = _warmup_seconds(probe, socket, slow)  # the lane that is idle now
    if slow_before_quick > STILL_STREAMING and streamed_on > max(
        SERIAL_WARMUPS * warmup, SERIAL_SECONDS
    ):
        raise CaseFailed(
            f"the second lane's request got no event while the first lane streamed "
            f"{slow_before_quick} more over {streamed_on * 1000:.0f} ms (a warm-up alone takes "
            f"{warmup * 1000:.0f} ms): the lanes ran one after the other"
        )
    raise CaseSkipped(
        "the long response finished before the other lane's warm-up started, so whether "
        "lanes run at once cannot be seen: the endpoint streams too fast (a slower stream "
        "would show it; ws-mode serve: --tokens-per-second)"
    )


def _warmup_seconds(probe: Probe, socket: SyncSocket, lane: str) -> float:
    """How long a warm-up on ``lane`` takes alone, from its send to its terminal event."""
    started = time.monotonic()
    probe.finished_turn(socket, probe.create("Hello", stream_id=lane, generate=False), "a warm-up")
    return time.monotonic() - started


def fork(probe: Probe) -> str:
    socket = probe.socket()
    first, second = _lane("trunk"), _lane("fork")
    parent = probe.finished_turn(socket, probe.create(stream_id=first), "the parent")
    request = probe.create(
        probe.follow_up(parent), stream_id=second, previous_response_id=parent.id
    )
    forked = probe.finished_turn(socket, request, "the fork on another lane")
    back = probe.create(probe.follow_up(parent), stream_id=first, previous_response_id=parent.id)
    again = probe.finished_turn(socket, back, "a continuation on the parent's lane")
    return f"{parent.id} continued on lane {second} ({forked.id}) and on its own ({again.id})"


def fresh_chain(probe: Probe, lane: str | None) -> str:
    """A create without ``previous_response_id`` on a lane with history inherits none of it:
    the response echoes no parent and, when the server reports usage, counts as many input
    tokens as the same request on a new socket."""
    socket = probe.socket()
    fields = {} if lane is None else {"stream_id": lane}
    history = probe.finished_turn(socket, probe.create(LONG_ANSWER, **fields), "the history")
    follow = probe.create(probe.follow_up(history), previous_response_id=history.id, **fields)
    probe.finished_turn(socket, follow, "its continuation")
    fresh = probe.finished_turn(socket, probe.create("Say hello.", **fields), "the fresh request")
    other = probe.socket()
    alone = probe.finished_turn(other, probe.create("Say hello.", **fields), "the same alone")
    assert fresh.response is not None
    if fresh.response.get("previous_response_id") is not None:
        parent = fresh.response["previous_response_id"]
        raise CaseFailed(f"the fresh response has previous_response_id {parent!r}")
    after, before = fresh.usage_input_tokens(), alone.usage_input_tokens()
    if after is None or before is None:
        return "no previous_response_id echoed (the server reports no usage to compare inputs)"
    if after != before:
        raise CaseFailed(
            f"the fresh request counted {after} input tokens after the history, {before} on a "
            "new socket: it inherited context"
        )
    return f"{after} input tokens, as on a new socket: nothing inherited"


def reuse_starts_fresh(probe: Probe) -> str:
    return fresh_chain(probe, _lane("reuse"))


def in_flight_queued(probe: Probe) -> str:
    socket = probe.socket()
    count = MAX_IN_FLIGHT + 4
    requests = [
        probe.create(f"Say the number {n}.", stream_id=_lane(f"f{n}")) for n in range(count)
    ]
    turns = probe.at_once(socket, requests)
    refused = [describe(turn.last) for turn in turns if not turn.finished]
    if refused:
        raise CaseFailed(f"{len(refused)} of {count} requests sent at once failed: {refused[0]}")
    return f"{count} requests sent at once on {count} lanes all finished"


def stream_limit(probe: Probe) -> str:
    socket = probe.socket()
    lanes = [_lane(f"s{n}") for n in range(MAX_STREAMS + 1)]
    warm_ups = [probe.create("Hello", stream_id=lane, generate=False) for lane in lanes]
    for number, turn in enumerate(probe.at_once(socket, warm_ups[:MAX_STREAMS]), 1):
        if turn.last.get("type") != "response.completed":
            raise CaseFailed(f"named lane {number} was answered with {describe(turn.last)}")
    last = probe.turn(socket, probe.create("Hello", stream_id=lanes[-1], generate=False))
    probe.expect_error(
        last,
        "websocket_stream_limit_reached",
        param="stream_id",
        what=f"named lane {MAX_STREAMS + 1}",
    )
    again = probe.turn(socket, probe.create("Hello", stream_id=lanes[0], generate=False))
    if again.last.get("type") != "response.completed":
        raise CaseFailed(
            f"after the refusal, a known lane was answered with {describe(again.last)}"
        )
    probe.still_works(socket, "websocket_stream_limit_reached")
    return (
        f"{MAX_STREAMS} named lanes accepted, the {MAX_STREAMS + 1}rd refused "
        "(400 websocket_stream_limit_reached); known lanes and the default lane still work"
    )


CASES: Final = (
    ConformanceCase(
        "lanes.stream_id_echoed",
        "every event of a response on a named lane carries its stream_id, terminal events "
        "and errors included",
        LANES_SOURCE,
        stream_id_echoed,
    ),
    ConformanceCase(
        "lanes.default_lane_unmarked",
        "events of the default lane (no stream_id sent) carry no stream_id",
        LANES_SOURCE,
        default_lane_unmarked,
    ),
    ConformanceCase(
        "lanes.stream_id_syntax",
        "a stream_id is 1 to 256 characters of [A-Za-z0-9_.-]",
        f"{GUIDE}, stream_id; docs/protocol.md, Errors",
        stream_id_syntax,
    ),
    ConformanceCase(
        "lanes.invalid_stream_id",
        "any other stream_id (empty, too long, other characters) is refused with 400 "
        "invalid_stream_id, param stream_id, and the socket stays open",
        f"{GUIDE}, stream_id; docs/protocol.md, Errors",
        invalid_stream_id,
    ),
    ConformanceCase(
        "lanes.fifo",
        "requests on one lane run first-in, first-out and never overlap",
        LANES_SOURCE,
        fifo,
    ),
    ConformanceCase(
        "lanes.concurrent",
        "different lanes run concurrently",
        LANES_SOURCE,
        concurrent,
    ),
    ConformanceCase(
        "lanes.fork",
        "a create on another lane whose previous_response_id is a response of the first lane "
        "forks the conversation; the parent stays continuable on its own lane",
        f"{GUIDE}, stream_id (forks)",
        fork,
    ),
    ConformanceCase(
        "lanes.reuse_starts_fresh",
        "reusing a stream_id without previous_response_id starts a new conversation on that "
        "lane, inheriting nothing",
        f"{GUIDE}, stream_id; docs/protocol.md, Conversation state",
        reuse_starts_fresh,
    ),
    ConformanceCase(
        "limits.in_flight_queued",
        f"at most {MAX_IN_FLIGHT} responses run at once per connection; more are queued, "
        "not refused",
        LIMITS_SOURCE,
        in_flight_queued,
    ),
    ConformanceCase(
        "limits.stream_limit",
        f"at most {MAX_STREAMS} named stream_ids per connection: the next is refused with 400 "
        "websocket_stream_limit_reached, param stream_id (the default lane does not count)",
        LIMITS_SOURCE,
        stream_limit,
    ),
)
