"""Conformance cases of errors and frames: the error envelope, errors scoped to their request,
rate-limit headers in ``error.headers``, the connection lifetime error, ``background: true``,
bad JSON, non-object and binary frames, unknown events, and Codex's frames
(``response.processed``, its extra ``response.create`` fields)."""

from __future__ import annotations

import secrets
import time
from typing import Any, Final

from ._client import SocketClosed
from ._conformance import (
    LONG_ANSWER,
    CaseFailed,
    CaseSkipped,
    ConformanceCase,
    Probe,
    describe,
)
from ._conformance_lanes import GUIDE
from ._program import LOOKUP_TOOL
from ._validation import envelope_problems

ERRORS_SOURCE: Final = "docs/protocol.md, Errors"
#: The headers that say a client is rate limited.
RATE_LIMIT_HEADERS: Final = ("retry-after", "retry-after-ms", "x-ratelimit-")


def _single_error(probe: Probe, frame: Any, what: str, lane: str | None = None) -> dict[str, Any]:
    """Send ``frame`` (an event, a text or bytes) on a new socket: the one error event that
    answers it, in the envelope; the socket must stay open."""
    socket = probe.socket()
    if isinstance(frame, bytes):
        socket.connection.send(frame)
    else:
        socket.send(frame)
    event = probe.receive(socket)
    if event["type"] != "error":
        raise CaseFailed(f"{what} was answered with {describe(event)}, not an error event")
    problems = envelope_problems(event, lane)
    if problems:
        raise CaseFailed(f"the error answering {what} has " + "; ".join(problems))
    probe.still_works(socket, what)
    return event


def envelope(probe: Probe) -> str:
    lane = "conform-error-" + secrets.token_hex(3)
    unknown = "resp_conform_" + secrets.token_hex(8)
    named = _single_error(
        probe,
        probe.create(previous_response_id=unknown, stream_id=lane),
        "an unknown previous_response_id on a named lane",
        lane,
    )
    _single_error(probe, probe.create(previous_response_id=unknown), "the same on the default lane")
    return (
        f"status {named['status']}, sequence_number, string code, type and message; stream_id "
        "on the named lane, none on the default lane"
    )


def scoped(probe: Probe) -> str:
    socket = probe.socket()
    good, bad = "conform-good-" + secrets.token_hex(3), "conform-bad-" + secrets.token_hex(3)
    unknown = "resp_conform_" + secrets.token_hex(8)
    long, wrong = (
        probe.create(LONG_ANSWER, stream_id=good),
        probe.create(previous_response_id=unknown, stream_id=bad),
    )
    streamed, refused = probe.at_once(socket, [long, wrong])
    if refused.error is None:
        raise CaseFailed(
            f"an unknown previous_response_id was answered with {describe(refused.last)}"
        )
    if not streamed.finished:
        raise CaseFailed(f"the other lane's response ended with {describe(streamed.last)}")
    probe.still_works(socket, "an error on one lane")
    return "an error on one lane; the other lane's response finished and the socket stays open"


def rate_limit_headers(probe: Probe) -> str:
    fields = probe.options.rate_limited_request
    if fields is None:
        raise CaseSkipped(
            "the run names no request the server answers with 429 (rate_limited_request, "
            "ws-mode check --rate-limited-request)"
        )
    socket = probe.socket()
    turn = probe.turn(socket, probe.create(**dict(fields)))
    error = turn.error
    if error is None or error.get("status") != 429:
        raise CaseFailed(
            f"the rate-limited request was answered with {describe(turn.last)}, not 429"
        )
    headers = (error.get("error") or {}).get("headers")
    if not isinstance(headers, dict):
        raise CaseFailed("the 429 error has no error.headers object")
    found = sorted(name for name in headers if str(name).lower().startswith(RATE_LIMIT_HEADERS))
    if not found:
        raise CaseFailed(f"error.headers holds no retry-after or x-ratelimit-* header: {headers}")
    return "429 with error.headers " + ", ".join(found)


def connection_lifetime(probe: Probe) -> str:
    lifetime = probe.options.connection_lifetime
    if lifetime is None:
        raise CaseSkipped(
            "the run was not told the server's connection lifetime (60 minutes at OpenAI); "
            "give it (connection_lifetime, ws-mode check --connection-lifetime) to wait for it"
        )
    socket = probe.socket()
    opened = time.monotonic()
    event = probe.receive(socket, lifetime + probe.timeout)
    lived = time.monotonic() - opened
    if event["type"] != "error":
        raise CaseFailed(f"an idle socket got {describe(event)} instead of the lifetime error")
    code = (event.get("error") or {}).get("code")
    if code != "websocket_connection_limit_reached":
        raise CaseFailed(f"expected websocket_connection_limit_reached, got {describe(event)}")
    problems = envelope_problems(event, None)
    if problems:
        raise CaseFailed("the lifetime error has " + "; ".join(problems))
    try:
        after = probe.receive(socket)
    except SocketClosed:
        return f"websocket_connection_limit_reached after {lived:.1f} s, then a close"
    raise CaseFailed(f"after the lifetime error the socket stayed open ({describe(after)})")


def background_refused(probe: Probe) -> str:
    event = _single_error(probe, probe.create(background=True), "background: true")
    return f"error {event['status']} {event['error']['code']}; the socket stays open"


def bad_json(probe: Probe) -> str:
    event = _single_error(probe, '{"type": "response.create", ', "a frame that is not JSON")
    return f"error {event['status']} {event['error']['code']}; the socket stays open"


def not_object(probe: Probe) -> str:
    event = _single_error(probe, "[1, 2]", "a JSON array")
    return f"error {event['status']} {event['error']['code']}; the socket stays open"


def binary_frame(probe: Probe) -> str:
    frame = b'{"type": "response.create", "input": "hi"}'
    event = _single_error(probe, frame, "a binary frame")
    return f"error {event['status']} {event['error']['code']}; the socket stays open"


def unknown_event(probe: Probe) -> str:
    event = _single_error(probe, {"type": "response.conform_unknown"}, "an unknown event type")
    return f"error {event['status']} {event['error']['code']}; the socket stays open"


def response_processed(probe: Probe) -> str:
    socket = probe.socket()
    turn = probe.finished_turn(socket, probe.create(), "a turn")
    socket.send({"type": "response.processed", "response_id": turn.id})
    probe.still_works(socket, "response.processed (answered before the next turn's events)")
    return "no answer; the next request's events came first"


def codex_create_fields(probe: Probe) -> str:
    socket = probe.socket()
    request = probe.create(
        "Say hello.",
        stream=True,
        store=False,
        tools=[LOOKUP_TOOL],
        tool_choice="auto",
        parallel_tool_calls=False,
        include=[],
        prompt_cache_key="conform-" + secrets.token_hex(4),
        instructions="You are a coding agent.",
    )
    turn = probe.finished_turn(socket, request, "a create with Codex's fields")
    return f"{turn.id}: stream, store, tools, tool_choice, parallel_tool_calls, include, " + (
        "prompt_cache_key and instructions accepted"
    )


CASES: Final = (
    ConformanceCase(
        "errors.envelope",
        "an error event is {type: error, status, sequence_number, stream_id on a named lane, "
        "error: {type, code (a string), message, param}}",
        f"{GUIDE}, errors; {ERRORS_SOURCE}",
        envelope,
    ),
    ConformanceCase(
        "errors.scoped_to_request",
        "an error scoped to one request leaves the connection and the other lanes working",
        ERRORS_SOURCE,
        scoped,
    ),
    ConformanceCase(
        "errors.rate_limit_headers",
        "an error the server answers with rate-limit headers carries them in error.headers "
        "(retry-after, x-ratelimit-*), the only way a socket client sees them",
        f"OpenAI API reference, websocket error event (headers); {ERRORS_SOURCE}",
        rate_limit_headers,
    ),
    ConformanceCase(
        "errors.connection_lifetime",
        "a connection past its lifetime gets websocket_connection_limit_reached, then a close",
        f"{GUIDE}, connection limits; {ERRORS_SOURCE}",
        connection_lifetime,
    ),
    ConformanceCase(
        "errors.background_refused",
        "background: true is not supported on the socket: an error event, the socket stays open",
        f"{GUIDE}, response.create; docs/protocol.md, response.create",
        background_refused,
    ),
    ConformanceCase(
        "frames.bad_json",
        "a frame that is not JSON gets an error event in the envelope; the socket stays open",
        ERRORS_SOURCE,
        bad_json,
    ),
    ConformanceCase(
        "frames.not_object",
        "a JSON frame that is not an object gets an error event; the socket stays open",
        ERRORS_SOURCE,
        not_object,
    ),
    ConformanceCase(
        "frames.binary",
        "every message is JSON in a text frame: a binary frame gets an error event, the "
        "socket stays open",
        f"docs/protocol.md, Connecting; {ERRORS_SOURCE}",
        binary_frame,
    ),
    ConformanceCase(
        "frames.unknown_event",
        "an unknown event type gets an error event; the socket stays open",
        ERRORS_SOURCE,
        unknown_event,
    ),
    ConformanceCase(
        "codex.response_processed",
        "response.processed (Codex's acknowledgement) is accepted silently: an error in "
        "reply breaks Codex's next turn",
        "docs/protocol.md, response.processed",
        response_processed,
    ),
    ConformanceCase(
        "codex.create_fields",
        "Codex's create fields (stream: true, store: false, prompt_cache_key, include, "
        "parallel_tool_calls, tools, instructions) are accepted",
        f"{GUIDE}, response.create; docs/protocol.md, response.create",
        codex_create_fields,
    ),
)
