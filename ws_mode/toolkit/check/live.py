"""``ws-mode check``'s checks: WebSocket mode tried against a live endpoint, ours or anyone's.

:func:`run_live_checks` runs each check of :data:`~ws_mode.toolkit.check.live_report.CHECKS` on
its own socket, in order: the handshake (a refusal named: 426, 401/403, 404, a proxy that
strips ``Upgrade``), a warm-up, a chained conversation, ``previous_response_not_found``, two
lanes at once, the error envelope of a bad event, the largest message that gets through
(:mod:`~ws_mode.toolkit.check.live_probe`) and whether an idle socket survives. When the handshake
fails the others are skipped. Each turn's events are checked with the compatibility kit's
validators (:func:`~ws_mode.testing._validation.check_events`); what the checks share is in
:mod:`~ws_mode.toolkit.check.live_socket`. Needs websockets.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Callable
from typing import Any, Final

from websockets.exceptions import ConnectionClosed, InvalidHandshake

from ws_mode._protocol import TERMINAL_EVENTS
from ws_mode.testing._client import SocketClosed, SyncSocket
from ws_mode.testing._expected import new_input
from ws_mode.testing._items import as_items
from ws_mode.testing._program import Step
from ws_mode.testing._report import TurnFailed
from ws_mode.testing._validation import check_events, error_code

from ..http_client import describe_error
from ..measure import format_seconds
from .live_probe import check_largest_message
from .live_report import CheckResult, LiveReport
from .live_socket import (
    CheckFailed,
    LiveOptions,
    Target,
    Turn,
    close_code,
    create,
    ended_well,
    open_socket,
    read_event,
    refusal,
    turn,
)

__all__ = [
    "check_chain",
    "check_error_envelope",
    "check_handshake",
    "check_idle",
    "check_lanes",
    "check_not_found",
    "check_warm_up",
    "run_live_checks",
]

#: The lanes the lanes check runs at once.
LANES: Final = ("ws-mode-check-a", "ws-mode-check-b")
#: The event type the error envelope check sends; no server knows it.
BAD_EVENT: Final = "response.ws_mode_check"


def check_handshake(target: Target, options: LiveOptions) -> CheckResult:
    """The upgrade is accepted (101), or why not."""
    started = time.perf_counter()
    try:
        with open_socket(target, options) as socket:
            took = time.perf_counter() - started
            response = socket.connection.response
            assert response is not None  # an open socket has its handshake answer
    except (InvalidHandshake, OSError) as exc:
        detail, hint, data = refusal(exc)
        return CheckResult.failed("handshake", detail, hint, **data)
    return CheckResult.ok(
        "handshake",
        f"101 Switching Protocols in {format_seconds(took)}",
        status=response.status_code,
        seconds=took,
    )


# ----------------------------------------------------------------------------- turns


def check_warm_up(socket: SyncSocket, options: LiveOptions) -> CheckResult:
    """``generate: false`` answers ``response.created`` then ``response.completed``, no
    output."""
    request = create(options, "ws-mode check: warm-up", generate=False)
    result = turn(socket, request, options, Step(generate=False))
    if not result.completed:
        detail = f"a warm-up ended with {result.outcome()}"
        return CheckResult.failed("warm-up", detail, "protocol")
    kinds = " → ".join(event["type"] for event in result.events)
    return CheckResult.ok("warm-up", f"{kinds}, no output", events=len(result.events))


def check_chain(socket: SyncSocket, options: LiveOptions) -> CheckResult:
    """Two turns, the second continuing the first by ``previous_response_id``."""
    step = Step(text="Say hello in one short sentence.", form="string")
    first = turn(socket, create(options, step.text), options, step)
    ended_well("chained conversation", first, "the first turn")
    assert first.response is not None
    first_id: str = first.response["id"]
    follow = Step(text="Thanks. Now say goodbye in one short sentence.")
    answer = new_input(follow, [*as_items(first.request["input"]), *first.output])
    request = create(options, answer, previous_response_id=first_id)
    second = turn(socket, request, options, follow, {first_id: 0})
    if second.error is not None and error_code(second.error) == "previous_response_not_found":
        detail = f"the second turn could not continue {first_id}: previous_response_not_found"
        return CheckResult.failed("chained conversation", detail, "cache")
    ended_well("chained conversation", second, "the second turn")
    assert second.response is not None
    what = "tool outputs" if isinstance(answer, list) else "a user message"
    return CheckResult.ok(
        "chained conversation",
        f"{first_id} → {second.response['id']} ({what}; {len(second.output)} output item(s))",
        responses=[first_id, second.response["id"]],
    )


def check_not_found(socket: SyncSocket, options: LiveOptions) -> CheckResult:
    """A continuation of an unknown id gets one ``previous_response_not_found`` error."""
    unknown = "resp_ws_mode_check_" + secrets.token_hex(8)
    request = create(options, "Hello", previous_response_id=unknown)
    result = turn(socket, request, options, Step())
    name = "previous_response_not_found"
    if result.error is None:
        detail = f"an unknown previous_response_id was answered with {result.events[-1]['type']}"
        return CheckResult.failed(name, detail, "protocol")
    code = error_code(result.error)
    if code != "previous_response_not_found":
        detail = f"expected previous_response_not_found, got {describe_error(result.error)}"
        return CheckResult.failed(name, detail, "protocol")
    status = result.error["status"]
    return CheckResult.ok(name, f"error {status}, envelope valid", status=status)


def check_lanes(socket: SyncSocket, options: LiveOptions) -> CheckResult:
    """Two turns sent at once on two lanes both finish, each event carrying its lane."""
    requests = {lane: create(options, f"Hello from {lane}.", stream_id=lane) for lane in LANES}
    for request in requests.values():
        socket.send(request)
    events: dict[str, list[dict[str, Any]]] = {lane: [] for lane in LANES}
    order: list[str] = []
    deadline = time.monotonic() + options.timeout
    while any(not lane or lane[-1]["type"] not in TERMINAL_EVENTS for lane in events.values()):
        event = read_event(socket, max(0.0, deadline - time.monotonic()))
        lane = event.get("stream_id")
        if lane not in events:
            raise TurnFailed(
                "an event carries no stream_id of the two lanes running",
                f"stream_id: {lane!r}, type {event['type']!r}",
            )
        events[lane].append(event)
        order.append(lane)
    for lane in LANES:
        step = Step(lane=lane)
        response, output = check_events(
            step, requests[lane], events[lane], earlier={}, allow_errors=True, validate_output=True
        )
        ended_well("lanes", Turn(requests[lane], events[lane], response, output), f"lane {lane}")
    switches = sum(1 for a, b in itertools.pairwise(order) if a != b)
    how = "interleaved" if switches > 1 else "one after the other"
    return CheckResult.ok(
        "lanes", f"{len(LANES)} lanes completed, events {how}", interleaved=switches > 1
    )


def check_error_envelope(socket: SyncSocket, options: LiveOptions) -> CheckResult:
    """A bad event gets one error in the nested envelope, and the socket stays usable."""
    request = {"type": BAD_EVENT}
    result = turn(socket, request, options, Step())
    name = "error envelope"
    if result.error is None or len(result.events) != 1:
        kinds = ", ".join(event["type"] for event in result.events)
        return CheckResult.failed(name, f"a bad event was answered with {kinds}", "protocol")
    code = error_code(result.error)
    if not isinstance(code, str):
        return CheckResult.failed(name, "the error has no string code", "protocol")
    after = turn(
        socket, create(options, "still there?", generate=False), options, Step(generate=False)
    )
    if not after.completed:
        detail = f"after the error, a warm-up ended with {after.outcome()}"
        return CheckResult.failed(name, detail, "protocol")
    status = result.error["status"]
    return CheckResult.ok(
        name, f"{code} {status} for a bad event; the socket stays usable", code=code
    )


# ----------------------------------------------------------------------------- idle


def check_idle(target: Target, options: LiveOptions) -> CheckResult:
    """A socket on which nothing moves for ``idle_seconds`` (the client sends no pings) is
    still open and answers a warm-up afterwards."""
    name, idle = "idle socket", options.idle_seconds
    with open_socket(target, options, pings=False) as socket:
        started = time.monotonic()
        try:
            event = read_event(socket, idle)
        except TimeoutError:
            pass
        except SocketClosed:
            took = time.monotonic() - started
            code = close_code(socket)
            detail = f"closed after {took:.1f} s of {idle:g} s idle (close {code})"
            return CheckResult.failed(name, detail, "idle", closed_after=took, close_code=code)
        else:
            took = time.monotonic() - started
            if event.get("type") == "error" and error_code(event) == "websocket_idle_timeout":
                detail = f"ws_mode closed it after {took:.1f} s (websocket_idle_timeout)"
                return CheckResult.failed(name, detail, "idle_ws_mode", closed_after=took)
            detail = f"an unasked-for {event.get('type')!r} event arrived after {took:.1f} s"
            return CheckResult.failed(name, detail, "protocol")
        request = create(options, "ws-mode check: after idle", generate=False)
        try:
            result = turn(socket, request, options, Step(generate=False))
        except TimeoutError:
            detail = f"open after {idle:g} s idle, but a warm-up then got no answer"
            return CheckResult.failed(name, detail, "idle_silent")
        except (SocketClosed, ConnectionClosed, OSError):
            detail = f"closed when used after {idle:g} s idle (close {close_code(socket)})"
            return CheckResult.failed(name, detail, "idle")
        if not result.completed:
            detail = f"after {idle:g} s idle, a warm-up ended with {result.outcome()}"
            return CheckResult.failed(name, detail, "protocol")
    return CheckResult.ok(
        name, f"open after {idle:g} s without a frame, and answering", seconds=idle
    )


# ----------------------------------------------------------------------------- the run

SocketCheck = Callable[[SyncSocket, LiveOptions], CheckResult]
SOCKET_CHECKS: Final[tuple[tuple[str, SocketCheck], ...]] = (
    ("warm-up", check_warm_up),
    ("chained conversation", check_chain),
    ("previous_response_not_found", check_not_found),
    ("lanes", check_lanes),
    ("error envelope", check_error_envelope),
)


def run_live_checks(
    target: Target,
    options: LiveOptions,
    on_result: Callable[[CheckResult], None] | None = None,
) -> LiveReport:
    """Run every check against ``target``; ``on_result`` hears each result as it comes."""
    results: list[CheckResult] = []

    def record(result: CheckResult) -> None:
        results.append(result)
        if on_result is not None:
            on_result(result)

    handshake = check_handshake(target, options)
    record(handshake)
    checks: list[tuple[str, Callable[[], CheckResult]]] = []
    for name, check in SOCKET_CHECKS:
        checks.append((name, _on_socket(target, options, check)))
    checks.append(("largest message", lambda: check_largest_message(target, options)))
    checks.append(("idle socket", lambda: check_idle(target, options)))
    for name, run in checks:
        if handshake.status != "ok":
            record(CheckResult.skipped(name, "the handshake failed"))
        elif name == "largest message" and not options.max_probe_bytes:
            record(CheckResult.skipped(name, "--max-probe-bytes 0"))
        elif name == "idle socket" and not options.idle_seconds:
            record(CheckResult.skipped(name, "--idle 0"))
        else:
            record(_guarded(name, options, run))
    return LiveReport(target.url, results)


def _on_socket(
    target: Target, options: LiveOptions, check: SocketCheck
) -> Callable[[], CheckResult]:
    def run() -> CheckResult:
        with open_socket(target, options) as socket:
            return check(socket, options)

    return run


def _guarded(name: str, options: LiveOptions, run: Callable[[], CheckResult]) -> CheckResult:
    """``run()``, its failures turned into a failed result."""
    try:
        return run()
    except CheckFailed as exc:
        return exc.result
    except TurnFailed as exc:
        detail = exc.problem + (f" ({exc.details.splitlines()[0]})" if exc.details else "")
        return CheckResult.failed(name, detail, "protocol")
    except TimeoutError:
        return CheckResult.failed(name, f"no answer within {options.timeout:g} s", "model")
    except (SocketClosed, ConnectionClosed) as exc:
        why = str(exc).partition("; then")[0]
        return CheckResult.failed(name, f"the socket closed during the turn: {why}", "closed")
    except (InvalidHandshake, OSError) as exc:
        detail, hint, _ = refusal(exc)
        return CheckResult.failed(name, f"could not open a socket: {detail}", hint)
