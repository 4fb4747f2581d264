"""The handshake and protocol checks of ``ws-mode check``: whether the upgrade is accepted
(:func:`check_handshake`, a refusal named by :func:`describe_refusal`: 426, 401/403, 404, 503
while it drains, a proxy that strips ``Upgrade``; :func:`explain_refusal` adds what to change),
then, each on its own socket, a warm-up, a chained conversation, ``previous_response_not_found``,
two lanes at once and the error envelope of a bad event. Needs websockets.
"""

from __future__ import annotations

import itertools
import secrets
import time
from typing import Any, Final

import orjson
from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI

from ws_mode import Usage
from ws_mode._protocol import SERVER_IS_OVERLOADED, SERVER_SHUTTING_DOWN, TERMINAL_EVENTS
from ws_mode.testing._client import SyncSocket, check_received
from ws_mode.testing._expected import new_input
from ws_mode.testing._items import as_items
from ws_mode.testing._program import Step
from ws_mode.testing._report import TurnFailed
from ws_mode.testing._validation import check_events, error_code

from ..http_client import describe_error
from ..measure import format_seconds
from .results import (
    HINTS,
    CheckedTurn,
    CheckOptions,
    CheckResult,
    Target,
    hint_for_error,
    hook_hint,
    hook_of,
    open_socket,
    read_event,
    require_finished,
    response_create,
    run_turn,
)

# ----------------------------------------------------------------------------- handshake


def describe_refusal(exc: BaseException) -> tuple[str, str, dict[str, Any]]:
    """Why a socket did not open: a detail line, the key of its hint, and its data."""
    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        body = exc.response.body or b""
        try:
            envelope = orjson.loads(body)
        except orjson.JSONDecodeError:
            envelope = None
        error = envelope.get("error") if isinstance(envelope, dict) else None
        code = error.get("code") if isinstance(error, dict) else None
        said = describe_error(envelope, status) if isinstance(error, dict) else f"HTTP {status}"
        data = {"status": status, "code": code}
        if status == 426:
            if code == "websocket_mode_disabled":
                return f"HTTP 426: WebSocket mode is switched off ({said})", "disabled", data
            if code == "websocket_connection_limit_reached":
                return f"HTTP 426: the server is full ({said})", "connection_limit", data
            return (
                f"HTTP 426 Upgrade Required: WebSocket mode is off here ({said})",
                "not_enabled",
                data,
            )
        if status == 401 or (status == 403 and code not in (None, "origin_not_allowed")):
            return f"HTTP {status}: the credentials were refused ({said})", "credentials", data
        if status == 403:
            kind = "origin" if code == "origin_not_allowed" else "forbidden"
            return f"HTTP 403: the upgrade was refused ({said})", kind, data
        if status == 404:
            return "HTTP 404: nothing answers at this path", "not_found", data
        if status == 413:
            return "HTTP 413: the handshake was refused as too large", "handshake_413", data
        if 300 <= status < 400:
            where = exc.response.headers.get("Location", "elsewhere")
            return f"HTTP {status}: redirected to {where}; check that URL", "redirect", data
        if status == 503 and code == SERVER_SHUTTING_DOWN:
            return f"HTTP 503: the server is shutting down ({said})", "draining", data
        if status == 503 and code == SERVER_IS_OVERLOADED:
            return f"HTTP 503: the server's memory budget is used ({said})", "memory", data
        hook = hook_of(error)
        if status >= 500 and hook is not None:
            return f"HTTP {status}: the application's {hook} raised ({said})", hook_hint(hook), data
        if status >= 500:
            return (
                f"HTTP {status}: the server or the proxy's upstream failed ({said})",
                "upstream",
                data,
            )
        return (
            f"HTTP {status} instead of 101 Switching Protocols: the upgrade did not reach a "
            "WebSocket endpoint",
            "stripped",
            data,
        )
    if isinstance(exc, InvalidURI):
        return f"not a WebSocket URL: {exc}", "unreachable", {}
    if isinstance(exc, InvalidHandshake):
        return f"not a valid WebSocket handshake: {exc}", "bad_handshake", {}
    if isinstance(exc, TimeoutError):
        return "no answer to the handshake in time", "unreachable", {}
    return f"could not connect: {exc}", "unreachable", {}


def explain_refusal(exc: BaseException) -> tuple[str, str]:
    """Why a socket did not open, and what to change: :func:`describe_refusal`'s detail and
    the words of its hint, as ``ws-mode check`` prints them (``ws-mode bench --url`` too)."""
    detail, hint, _ = describe_refusal(exc)
    return detail, HINTS.get(hint, hint)


def check_handshake(target: Target, options: CheckOptions) -> CheckResult:
    """The upgrade is accepted (101), or why not."""
    started = time.perf_counter()
    try:
        with open_socket(target, options) as socket:
            took = time.perf_counter() - started
            response = socket.connection.response
            assert response is not None  # an open socket has its handshake answer
    except (InvalidHandshake, OSError) as exc:
        detail, hint, data = describe_refusal(exc)
        return CheckResult.failed("handshake", detail, hint, **data)
    return CheckResult.ok(
        "handshake",
        f"101 Switching Protocols in {format_seconds(took)}",
        status=response.status_code,
        seconds=took,
    )


# ----------------------------------------------------------------------------- turns


def _hint(turn: CheckedTurn, default: str) -> str:
    """The hint of a turn that did not complete: its error's (:func:`hint_for_error`), else
    ``default``."""
    return hint_for_error(turn.error, default) if turn.error is not None else default


#: The lanes the lanes check runs at once.
LANES: Final = ("ws-mode-check-a", "ws-mode-check-b")
#: The event type the error envelope check sends; no server knows it.
BAD_EVENT: Final = "response.ws_mode_check"


def check_warm_up(socket: SyncSocket, options: CheckOptions) -> CheckResult:
    """``generate: false`` answers ``response.created`` then ``response.completed``, no
    output."""
    request = response_create(options, "ws-mode check: warm-up", generate=False)
    result = run_turn(socket, request, options, Step(generate=False))
    if not result.completed:
        detail = f"a warm-up ended with {result.outcome()}"
        return CheckResult.failed("warm-up", detail, _hint(result, "protocol"))
    kinds = " → ".join(event["type"] for event in result.events)
    return CheckResult.ok("warm-up", f"{kinds}, no output", events=len(result.events))


def check_chained_conversation(socket: SyncSocket, options: CheckOptions) -> CheckResult:
    """Two turns, the second continuing the first by ``previous_response_id``."""
    step = Step(text="Say hello in one short sentence.", form="string")
    first = run_turn(socket, response_create(options, step.text), options, step)
    require_finished("chained conversation", first, "the first turn")
    assert first.response is not None
    first_id: str = first.response["id"]
    follow = Step(text="Thanks. Now say goodbye in one short sentence.")
    answer = new_input(follow, [*as_items(first.request["input"]), *first.output])
    request = response_create(options, answer, previous_response_id=first_id)
    second = run_turn(socket, request, options, follow, {first_id: 0})
    if second.error is not None and error_code(second.error) == "previous_response_not_found":
        detail = f"the second turn could not continue {first_id}: previous_response_not_found"
        return CheckResult.failed("chained conversation", detail, "cache")
    require_finished("chained conversation", second, "the second turn")
    assert second.response is not None
    what = "tool outputs" if isinstance(answer, list) else "a user message"
    cached = prompt_cache(first.response, second.response)
    return CheckResult.ok(
        "chained conversation",
        f"{first_id} → {second.response['id']} ({what}; {len(second.output)} output item(s))"
        + (f"; {cached[0]}" if cached is not None else ""),
        responses=[first_id, second.response["id"]],
        **({"prompt_cache": cached[1]} if cached is not None else {}),
    )


def prompt_cache(
    first: dict[str, Any], continuation: dict[str, Any]
) -> tuple[str, dict[str, float | None]] | None:
    """What the two turns' usage says of the server's prompt cache: the share of each turn's
    input tokens it read from the cache (`cached_tokens / input_tokens`), the continuation's
    first, where a hit pays; None when the continuation reports no input tokens."""
    ratio = (Usage.of(continuation) or Usage()).cache_ratio
    if ratio is None:
        return None
    before = (Usage.of(first) or Usage()).cache_ratio
    said = f"prompt cache: the continuation read {ratio:.2f} of its input tokens from it"
    if before is not None:
        said += f" (the first turn {before:.2f})"
    return said, {"continuation": ratio, "first": before}


def check_unknown_previous_response(socket: SyncSocket, options: CheckOptions) -> CheckResult:
    """A continuation of an unknown id gets one ``previous_response_not_found`` error."""
    unknown = "resp_ws_mode_check_" + secrets.token_hex(8)
    request = response_create(options, "Hello", previous_response_id=unknown)
    result = run_turn(socket, request, options, Step())
    name = "previous_response_not_found"
    if result.error is None:
        detail = f"an unknown previous_response_id was answered with {result.events[-1]['type']}"
        return CheckResult.failed(name, detail, "protocol")
    code = error_code(result.error)
    if code == "store_unavailable":
        detail = (
            f"got store_unavailable ({result.error.get('status')}): ws_mode could not ask its "
            "response store for an id this socket had not cached"
        )
        return CheckResult.failed(name, detail, "store", code=code)
    if code != "previous_response_not_found":
        detail = f"expected previous_response_not_found, got {describe_error(result.error)}"
        return CheckResult.failed(name, detail, hint_for_error(result.error, "protocol"))
    status = result.error["status"]
    return CheckResult.ok(name, f"error {status}, envelope valid", status=status)


def check_lanes(socket: SyncSocket, options: CheckOptions) -> CheckResult:
    """Two turns sent at once on two lanes both finish, each event carrying its lane."""
    requests = {
        lane: response_create(options, f"Hello from {lane}.", stream_id=lane) for lane in LANES
    }
    for request in requests.values():
        socket.send(request)
    events: dict[str, list[dict[str, Any]]] = {lane: [] for lane in LANES}
    order: list[str] = []
    deadline = time.monotonic() + options.timeout
    while any(not lane or lane[-1]["type"] not in TERMINAL_EVENTS for lane in events.values()):
        event = read_event(socket, max(0.0, deadline - time.monotonic()))
        check_received(socket, options.max_message_bytes)
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
        require_finished(
            "lanes", CheckedTurn(requests[lane], events[lane], response, output), f"lane {lane}"
        )
    switches = sum(1 for a, b in itertools.pairwise(order) if a != b)
    how = "interleaved" if switches > 1 else "one after the other"
    return CheckResult.ok(
        "lanes", f"{len(LANES)} lanes completed, events {how}", interleaved=switches > 1
    )


def check_error_envelope(socket: SyncSocket, options: CheckOptions) -> CheckResult:
    """A bad event gets one error in the nested envelope, and the socket stays usable."""
    request = {"type": BAD_EVENT}
    result = run_turn(socket, request, options, Step())
    name = "error envelope"
    if result.error is None or len(result.events) != 1:
        kinds = ", ".join(event["type"] for event in result.events)
        return CheckResult.failed(name, f"a bad event was answered with {kinds}", "protocol")
    code = error_code(result.error)
    if not isinstance(code, str):
        return CheckResult.failed(name, "the error has no string code", "protocol")
    after = run_turn(
        socket,
        response_create(options, "still there?", generate=False),
        options,
        Step(generate=False),
    )
    if not after.completed:
        detail = f"after the error, a warm-up ended with {after.outcome()}"
        return CheckResult.failed(name, detail, _hint(after, "protocol"))
    status = result.error["status"]
    return CheckResult.ok(
        name, f"{code} {status} for a bad event; the socket stays usable", code=code
    )
