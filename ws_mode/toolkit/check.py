"""``ws-mode check``'s checks of a live endpoint: WebSocket mode tried against any server, ours
or anyone's, local or behind proxies and load balancers, and what to change when it fails.

:func:`run_checks` runs each check of :data:`CHECKS` on its own socket, in order: the handshake
(a refusal named: 426, 401/403, 404, a proxy that strips ``Upgrade``), a warm-up, a chained
conversation, ``previous_response_not_found``, two lanes at once, the error envelope of a bad
event, the largest message that gets through and whether an idle socket survives. When the
handshake fails the others are skipped. Each turn's events are checked with the compatibility
kit's validators (:func:`~ws_mode.testing._validation.check_events`). The outcome is a
:class:`CheckReport`: one :class:`CheckResult` a check, shown as a table
(:func:`format_report`) or as JSON (:func:`report_json`), each failure with a hint from
:data:`HINTS`, or written from what was measured. The long checks report their progress as
they go (:data:`Progress`): each size probed, what the idle socket waits for. A turn that ends
with ws_mode's own ``store_unavailable`` fails with the store's hint (:func:`hint_for_error`):
the middleware is there, its store is not.

The largest message probe (:func:`check_largest_message`) opens a socket per size and sends one
valid ``response.create`` padded to that exact size: a warm-up (``generate: false``) whose input
text is the padding, so no model runs, sent uncompressed so the size is what every hop carries.
The sizes double from ``min_probe_bytes`` to the first failure (or to ``max_probe_bytes``), then
a binary search narrows the ceiling to within 1/64 of it (1 KiB at least); powers of two, the
usual limits, are found exactly. How the first failing size failed says which hop refused it: a
close 1009 (the ASGI server's or a proxy's frame limit), a dropped connection (daphne, granian,
some proxies), an HTTP 413 at the handshake (a proxy's body limit), or ws_mode's own
``message_too_large`` error (``Limits.max_message_bytes``), after which the socket stays usable.
A ceiling set by ws_mode itself passes the check; one set by another hop fails it, since the
socket and its cache are lost there (docs/deployment.md, "The message size limit"). The probes
run on the asyncio client (:func:`probe_size` says why).

The idle socket (:func:`check_idle_socket`) sends nothing, not even pings, for
``idle_seconds``, noting each ping the server sends (:class:`PingTimedConnection`). When a hop
closes it, the server's pings are timed on a second socket that the client keeps open with its
own pings (:func:`time_server_pings`), so that the hint tells pings that are off, pings slower
than the hop's timeout (both numbers given) and a hop that pings cannot keep open.

One module, past 800 lines, because it is one concept: the checks of a live endpoint. The
checks, the socket and turn helpers they share, the refusals and failures they name and the
hints that answer them are written against each other (a check fails with a hint key or a
hint built from its measures, the report renders it), and only ``ws-mode check``
(:mod:`ws_mode.toolkit.cli.check`) uses any of it. Needs websockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import textwrap
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal

import orjson
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.frames import Frame, Opcode
from websockets.protocol import Event
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as sync_connect

from ws_mode._protocol import TERMINAL_EVENTS, encode_event
from ws_mode.testing._client import (
    CLOSE_TIMEOUT,
    AsyncSocket,
    FrameError,
    SocketClosed,
    SyncSocket,
    connect,
    connect_async,
    socket_url,
)
from ws_mode.testing._expected import new_input
from ws_mode.testing._items import as_items
from ws_mode.testing._program import Step
from ws_mode.testing._report import TurnFailed
from ws_mode.testing._validation import check_events, check_type, error_code, frame_failure

from .http_client import describe_error
from .measure import format_bytes, format_seconds

__all__ = [
    "CHECKS",
    "HINTS",
    "CheckFailed",
    "CheckOptions",
    "CheckReport",
    "CheckResult",
    "CheckedTurn",
    "IdleWait",
    "PingTimedConnection",
    "Progress",
    "SizeProbe",
    "Status",
    "Target",
    "check_chained_conversation",
    "check_error_envelope",
    "check_handshake",
    "check_idle_socket",
    "check_lanes",
    "check_largest_message",
    "check_unknown_previous_response",
    "check_warm_up",
    "checked_turn",
    "client_ping_interval",
    "close_code",
    "describe_pings",
    "describe_refusal",
    "find_ceiling",
    "format_report",
    "hint_for_error",
    "no_server_pings_hint",
    "open_ping_timed_socket",
    "open_socket",
    "padded_warm_up",
    "pings_ignored_hint",
    "probe_size",
    "read_event",
    "report_json",
    "require_finished",
    "response_create",
    "run_checks",
    "run_turn",
    "slow_pings_hint",
    "time_server_pings",
    "wait_idle",
]


# ----------------------------------------------------------------------------- results

#: A check's outcome; ``skipped`` when it was not run (switched off, or the handshake failed).
Status = Literal["ok", "FAILED", "skipped"]
#: Told a line of progress while a check runs (what it waits for, each probe's outcome).
Progress = Callable[[str], None]
#: How often a long wait says it is still waiting, in seconds.
PROGRESS_SECONDS: Final = 15.0

#: The width hints are wrapped to.
HINT_WIDTH: Final = 100
#: The checks, in the order they run and are shown.
CHECKS: Final = (
    "handshake",
    "warm-up",
    "chained conversation",
    "previous_response_not_found",
    "lanes",
    "error envelope",
    "largest message",
    "idle socket",
)

_NGINX_UPGRADE: Final = (
    "nginx: proxy_http_version 1.1; proxy_set_header Upgrade $http_upgrade; "
    'proxy_set_header Connection "upgrade"; (HAProxy and load balancers pass upgrades '
    "by default; a CDN may need WebSockets switched on)"
)

#: What to change when a check fails, by the kind of failure.
HINTS: Final[dict[str, str]] = {
    "disabled": "WebSocket mode is switched off on this server (HTTP 426): the "
    "WebSocketModeMiddleware answers 426 while enabled=False or while it drains; clients "
    "fall back to HTTP. Switch it on (middleware.enabled = True).",
    "not_enabled": "HTTP 426 Upgrade Required: nothing speaks WebSocket mode here; put "
    "ws_mode's WebSocketModeMiddleware in front of the Responses handler.",
    "connection_limit": "the server is full (426 websocket_connection_limit_reached): raise "
    "Limits.max_connections (per worker) or add workers.",
    "credentials": "the credentials were refused: pass --api-key KEY (or set "
    "OPENAI_API_KEY) or --header 'Authorization: ...' with what your authenticate hook "
    "accepts.",
    "origin": "the Origin header was refused (403 origin_not_allowed): list it in "
    "WebSocketModeMiddleware(allowed_origins=...), or send no Origin.",
    "forbidden": "HTTP 403 without an OpenAI error body: the credentials were refused, or "
    "nothing accepts a WebSocket at this path (Starlette answers an unrouted upgrade with "
    "403): check the URL, WebSocketModeMiddleware(path=...) and the proxy's location.",
    "not_found": "nothing answers at this path (HTTP 404): check the URL (the socket is "
    "BASE/v1/responses), WebSocketModeMiddleware(path=...), the proxy's location and "
    "uvicorn --root-path when the proxy strips a prefix.",
    "stripped": "the upgrade reached a plain HTTP endpoint: a proxy in front probably drops "
    "the hop-by-hop Upgrade and Connection headers (" + _NGINX_UPGRADE + "), or the server "
    "cannot upgrade (uvicorn needs websockets or wsproto installed, and no --ws none).",
    "upstream": "the server failed on the upgrade, or the proxy in front could not reach it "
    "(HTTP 5xx): check the server's log, the proxy's upstream address, and that the ASGI "
    "server runs; " + _NGINX_UPGRADE + ".",
    "redirect": "the upgrade was redirected: point the check (and the clients) at the final "
    "URL, e.g. https:// instead of http://; WebSocket clients do not all follow redirects.",
    "handshake_413": "a hop refused the handshake with HTTP 413: raise the proxy's request "
    "size limit (nginx client_max_body_size, a load balancer's header and body limits).",
    "unreachable": "nothing listens there: check the host, the port and the scheme "
    "(https:// or wss:// for TLS).",
    "bad_handshake": "the answer to the upgrade is not a valid WebSocket handshake: a proxy "
    "or CDN in front may not support WebSockets; " + _NGINX_UPGRADE + ".",
    "model": "the model call failed: pass --model with a model your server serves.",
    "protocol": "the server's events do not follow WebSocket mode's protocol "
    "(docs/protocol.md): put ws_mode's WebSocketModeMiddleware in front of the handler, or "
    "fix the events it names.",
    "lanes": "lanes (stream_id) are part of ws_mode's protocol: the handler needs "
    "WebSocketModeMiddleware in front of it (Limits.max_streams and max_in_flight bound "
    "them).",
    "store": "ws_mode answered (store_unavailable, 503: its own error), so its middleware is "
    "in front; what failed is its response store, asked for a response this socket had not "
    "cached. Check the store: that it runs and every worker reaches it (redis-cli -u URL "
    "ping), the URL's host, port, database and password, and rediss:// only against a Redis "
    "that speaks TLS; the server's log names the cause and the host (ws_mode's warnings). "
    "Until it is back, only continuations of responses cached on the same socket work "
    "(docs/store.md).",
    "cache": "previous_response_id did not resolve on the same socket: the response cache "
    "lives in the connection; a proxy that spreads one socket's frames over workers breaks "
    "it (it cannot happen with one TCP connection per socket).",
    "closed": "the socket closed in the middle of a turn: 1001 (going away) is a proxy's or "
    "balancer's timeout, or a restart; 1011 a server error; 1009 a message over a frame "
    "limit (see the largest message check); 1006 a dropped connection. The server's log "
    "says more.",
    "too_large_1009": "a hop closed the socket with 1009 (message too big) before ws_mode "
    "saw the message, so the socket and its response cache are lost: raise the ASGI "
    "server's limit (uvicorn --ws-max-size, hypercorn websocket_max_message_size, daphne "
    "--websocket-max-message-size and --websocket-max-frame-size; granian is fixed at 16 "
    "MiB) or the proxy's WebSocket frame limit (nginx's client_max_body_size does not apply "
    "to WebSocket frames) to at least Limits.max_message_bytes (64 MiB by default), or pass "
    "--max-probe-bytes with the size your clients need.",
    "too_large_dropped": "a hop dropped the connection (no close frame) when the message "
    "grew: daphne and granian drop past their limit, so do some proxies, and behind nginx "
    "the ASGI server's close 1009 arrives as a dropped connection too (nginx drops the "
    "close frame when the server stops reading); raise the limit as for 1009 (uvicorn "
    "--ws-max-size, hypercorn websocket_max_message_size, daphne "
    "--websocket-max-message-size and --websocket-max-frame-size, the proxy's frame limit).",
    "too_large_413": "a hop answered the socket's handshake with HTTP 413 once messages grew: "
    "raise the proxy's body limit (nginx client_max_body_size) for the socket's location.",
    "too_large_other": "messages past this size do not get through: raise the limit of the "
    "hop that refuses them (uvicorn --ws-max-size, the proxy's frame limit), or pass "
    "--max-probe-bytes with the size your clients need.",
    "idle": "an idle socket was closed: proxies and load balancers close sockets on which "
    "nothing moved for a while (nginx proxy_read_timeout and proxy_send_timeout, 60 s by "
    "default; HAProxy timeout tunnel; AWS ALB idle timeout, 60 s; Cloudflare, 100 s). "
    "Raise them above Limits.max_connection_seconds, or have the server ping more often than "
    "the shortest of them (uvicorn --ws-ping-interval, hypercorn websocket_ping_interval): "
    "pings reset those timers only when they come before the timeout.",
    "idle_ws_mode": "ws_mode closed the idle socket itself (websocket_idle_timeout): "
    "Limits.max_idle_seconds is shorter than the idle time checked; raise it (or None).",
    "idle_silent": "the socket stayed open but nothing answered after the idle time: a hop "
    "dropped the connection to the server without telling the client (check the proxy's "
    "and the load balancer's idle timeouts).",
}


@dataclass
class CheckResult:
    """One check's outcome: ``detail`` says what was seen, ``hint`` (failures only) what to
    change, ``data`` the measured values for the JSON report."""

    name: str
    status: Status
    detail: str
    hint: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def ok(cls, name: str, detail: str, **data: Any) -> CheckResult:
        """A check that passed."""
        return cls(name, "ok", detail, data=data)

    @classmethod
    def failed(cls, name: str, detail: str, hint: str = "", **data: Any) -> CheckResult:
        """A check that failed; ``hint`` is a key of :data:`HINTS` or the hint itself."""
        return cls(name, "FAILED", detail, HINTS.get(hint, hint), data=data)

    @classmethod
    def skipped(cls, name: str, why: str) -> CheckResult:
        """A check that was not run, and why."""
        return cls(name, "skipped", why)


@dataclass
class CheckReport:
    """The checks of one endpoint (``url``, the socket's URL), in :data:`CHECKS` order."""

    url: str
    results: list[CheckResult]

    @property
    def ok(self) -> bool:
        """Whether no check failed (skipped ones do not count)."""
        return all(result.status != "FAILED" for result in self.results)

    def result(self, name: str) -> CheckResult:
        """The result of the check ``name``; KeyError when it is not in the report."""
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(name)


# ----------------------------------------------------------------------------- sockets and turns

KiB: Final = 1024
MiB: Final = 1024 * KiB


@dataclass(frozen=True)
class Target:
    """Where the socket opens: ``socket_url(base, path)``."""

    base: str
    path: str

    @property
    def url(self) -> str:
        """The socket's ``ws://`` or ``wss://`` URL."""
        return socket_url(self.base, self.path)


@dataclass(frozen=True)
class CheckOptions:
    """How to check: the handshake's ``headers``, the ``model`` to ask for (none sent when
    None), how long one turn may take (``timeout``), the idle time (0 skips it) and the
    message sizes probed (``max_probe_bytes`` 0 skips the probe)."""

    headers: Mapping[str, str] = field(default_factory=dict)
    model: str | None = None
    timeout: float = 30.0
    idle_seconds: float = 75.0
    min_probe_bytes: int = 64 * KiB
    max_probe_bytes: int = 64 * MiB


def open_socket(target: Target, options: CheckOptions, *, pings: bool = True) -> SyncSocket:
    """A socket at ``target``, uncompressed (sizes are what the wire carries). ``pings=False``
    opens it without the client's keep-alive pings, as a client that never pings sees the
    deployment."""
    return connect(
        target.base,
        target.path,
        headers=options.headers,
        open_timeout=options.timeout,
        compression=False,
        pings=pings,
    )


def close_code(socket: SyncSocket) -> int | None:
    """The code of the close the peer sent (1006 when the connection dropped without one),
    once the client has read it; None while the socket is open."""
    connection = socket.connection
    connection.recv_events_thread.join(CLOSE_TIMEOUT)
    return connection.close_code


def response_create(options: CheckOptions, input: Any, **fields: Any) -> dict[str, Any]:
    """A ``response.create`` with ``input``, the model asked for, and ``fields``."""
    request: dict[str, Any] = {"type": "response.create"}
    if options.model is not None:
        request["model"] = options.model
    request["input"] = input
    request.update(fields)
    return request


@dataclass
class CheckedTurn:
    """One turn's request, events, and what the kit's validators made of them."""

    request: dict[str, Any]
    events: list[dict[str, Any]]
    response: dict[str, Any] | None
    output: list[dict[str, Any]]

    @property
    def error(self) -> dict[str, Any] | None:
        """The terminal ``error`` event, if the turn ended with one."""
        last = self.events[-1] if self.events else {}
        return last if last.get("type") == "error" else None

    @property
    def completed(self) -> bool:
        """Whether the turn ended with ``response.completed``."""
        return bool(self.events) and self.events[-1]["type"] == "response.completed"

    def outcome(self) -> str:
        """How the turn ended, in words."""
        if self.error is not None:
            return "error " + describe_error(self.error)
        return str(self.events[-1]["type"]) if self.events else "nothing"


def read_event(socket: SyncSocket, timeout: float) -> dict[str, Any]:
    """The next event, checked to be one; TimeoutError after ``timeout`` seconds."""
    try:
        return check_type(socket.receive(timeout))
    except FrameError as exc:
        raise frame_failure(exc.kind, exc.frame) from None


def run_turn(
    socket: SyncSocket,
    request: dict[str, Any],
    options: CheckOptions,
    step: Step,
    earlier: Mapping[str, int] | None = None,
) -> CheckedTurn:
    """Send ``request`` and read its turn; its events checked as the kit checks a turn
    (errors allowed: the caller says what it expected)."""
    socket.send(request)
    deadline = time.monotonic() + options.timeout
    events: list[dict[str, Any]] = []
    while not events or events[-1]["type"] not in TERMINAL_EVENTS:
        events.append(read_event(socket, max(0.0, deadline - time.monotonic())))
    return checked_turn(request, events, step, earlier)


def checked_turn(
    request: dict[str, Any],
    events: list[dict[str, Any]],
    step: Step,
    earlier: Mapping[str, int] | None = None,
) -> CheckedTurn:
    """A turn's events, up to its terminal one, checked as the kit checks a turn (errors
    allowed)."""
    response, output = check_events(
        step,
        request,
        events,
        earlier=earlier or {},
        allow_errors=True,
        validate_output=step.generate,
    )
    return CheckedTurn(request, events, response, output)


def hint_for_error(error: dict[str, Any], default: str) -> str:
    """The hint key of a turn that ended with ``error``: ``store`` for ws_mode's
    ``store_unavailable`` (its store failed, whatever the check asked), else ``default``."""
    return "store" if error_code(error) == "store_unavailable" else default


class CheckFailed(Exception):
    """A check's failure, already described in ``result``."""

    def __init__(self, result: CheckResult) -> None:
        super().__init__(result.detail)
        self.result = result


def require_finished(name: str, turn: CheckedTurn, what: str) -> None:
    """Raise :class:`CheckFailed` (hint: the model) unless the turn finished: completed or
    incomplete."""
    if turn.error is not None:
        raise CheckFailed(
            CheckResult.failed(
                name,
                f"{what} ended with an error: {describe_error(turn.error)}",
                hint_for_error(turn.error, "model"),
            )
        )
    if turn.response is None or turn.response.get("status") == "failed":
        error = (turn.response or {}).get("error") or {}
        raise CheckFailed(
            CheckResult.failed(name, f"{what} failed: {describe_error({'error': error})}", "model")
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
        return CheckResult.failed("warm-up", detail, "protocol")
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
    return CheckResult.ok(
        "chained conversation",
        f"{first_id} → {second.response['id']} ({what}; {len(second.output)} output item(s))",
        responses=[first_id, second.response["id"]],
    )


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
        return CheckResult.failed(name, detail, "protocol")
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
        return CheckResult.failed(name, detail, "protocol")
    status = result.error["status"]
    return CheckResult.ok(
        name, f"{code} {status} for a bad event; the socket stays usable", code=code
    )


# ----------------------------------------------------------------------------- largest message

LARGEST_MESSAGE: Final = "largest message"
#: The search stops when the ceiling is known to within this fraction of it.
PRECISION: Final = 64
#: ... or to within this many bytes, whichever is larger.
RESOLUTION: Final = 1024
#: The hint of each way a message can fail to get through.
_PROBE_FAILURE_HINTS: Final = {
    "1009": "too_large_1009",
    "dropped": "too_large_dropped",
    "413": "too_large_413",
    "error": "protocol",
    "protocol": "protocol",
}


#: The servers whose default limit a ceiling found exactly is.
_DEFAULT_LIMITS: Final = {
    16 * MiB: "the default limit of uvicorn (--ws-max-size) and hypercorn "
    "(websocket_max_message_size), and granian's fixed one",
    1 * MiB: "daphne's default limit (--websocket-max-message-size, --websocket-max-frame-size)",
}


@dataclass(frozen=True)
class SizeProbe:
    """One size sent: whether it got through, else how it failed (``failure``: ``1009``,
    ``dropped``, ``close``, ``413``, ``handshake``, ``message_too_large``, ``error``,
    ``no_answer`` or ``protocol``) and in words (``detail``)."""

    size: int
    ok: bool
    failure: str = ""
    detail: str = ""


def padded_warm_up(size: int, options: CheckOptions) -> dict[str, Any]:
    """A warm-up ``response.create`` whose JSON text is exactly ``size`` bytes (or as small as
    it can be, when ``size`` is smaller)."""
    request = response_create(options, "", generate=False)
    bare = len(encode_event(request).encode())
    request["input"] = "x" * max(0, size - bare)
    return request


def probe_size(target: Target, options: CheckOptions, size: int) -> SizeProbe:
    """Send one padded warm-up of ``size`` bytes on a new socket; how it went.

    On asyncio, not on the blocking client: when a hop closes the socket while the message is
    still being sent (a frame limit does, on the frame's header), the blocking client's failed
    send can mark the end of the stream before its reading thread has handed on the close
    frame it already read; the close then reads as a dropped connection (1006, not 1009) and
    websockets logs an ``EOFError: stream ended`` traceback. The asyncio client reads the
    close frame first."""
    return asyncio.run(_probe_size(target, options, size))


async def _probe_size(target: Target, options: CheckOptions, size: int) -> SizeProbe:
    request = padded_warm_up(size, options)
    try:
        socket = await connect_async(
            target.base,
            target.path,
            headers=options.headers,
            open_timeout=options.timeout,
            compression=False,
        )
    except InvalidStatus as exc:
        status = exc.response.status_code
        if status == 413:
            return SizeProbe(size, False, "413", "HTTP 413 at the handshake")
        return SizeProbe(size, False, "handshake", describe_refusal(exc)[0])
    except (InvalidHandshake, OSError, TimeoutError) as exc:
        return SizeProbe(size, False, "handshake", describe_refusal(exc)[0])
    async with socket:
        events: list[dict[str, Any]] = []
        try:
            async with asyncio.timeout(options.timeout):
                await socket.send(request)
                while not events or events[-1]["type"] not in TERMINAL_EVENTS:
                    events.append(check_type(await socket.receive()))
        except (ConnectionClosed, SocketClosed, OSError):
            return await _closed_probe(socket, size)
        except TimeoutError:
            return SizeProbe(size, False, "no_answer", f"no answer within {options.timeout:g} s")
        except FrameError as exc:
            return SizeProbe(size, False, "protocol", str(frame_failure(exc.kind, exc.frame)))
        except TurnFailed as exc:
            return SizeProbe(size, False, "protocol", str(exc))
    try:
        result = checked_turn(request, events, Step(generate=False))
    except TurnFailed as exc:
        return SizeProbe(size, False, "protocol", str(exc))
    if result.completed:
        return SizeProbe(size, True)
    too_large = result.error is not None and error_code(result.error) == "message_too_large"
    return SizeProbe(size, False, "message_too_large" if too_large else "error", result.outcome())


async def _closed_probe(socket: AsyncSocket, size: int) -> SizeProbe:
    """How a probe whose socket closed failed: by the close code the peer sent."""
    connection = socket.connection
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(connection.wait_closed(), CLOSE_TIMEOUT)
    code = connection.close_code
    if code == 1009:
        return SizeProbe(size, False, "1009", "close 1009 (message too big)")
    if code in (None, 1006):
        return SizeProbe(size, False, "dropped", "the connection dropped (no close frame)")
    reason = connection.close_reason
    return SizeProbe(size, False, "close", f"close {code}" + (f" ({reason})" if reason else ""))


def find_ceiling(
    target: Target, options: CheckOptions, progress: Progress | None = None
) -> tuple[int | None, SizeProbe | None, list[SizeProbe]]:
    """The largest size that got through (None: not even ``min_probe_bytes``), the first
    failure above it (None: every size up to ``max_probe_bytes`` got through), and every
    probe sent, in order; ``progress`` hears each probe's outcome."""
    probes: list[SizeProbe] = []

    def send(size: int) -> SizeProbe:
        probe = probe_size(target, options, size)
        probes.append(probe)
        if progress is not None:
            outcome = "got through" if probe.ok else probe.detail
            progress(f"{format_bytes(size)} ({size} B): {outcome}")
        return probe

    low, high = options.min_probe_bytes, options.max_probe_bytes
    passed: int | None = None
    failed: SizeProbe | None = None
    size = min(low, high)
    while failed is None:
        result = send(size)
        if not result.ok:
            failed = result
        else:
            passed = size
            if size >= high:
                return passed, None, probes
            size = min(size * 2, high)
    if passed is None:
        return None, failed, probes
    while failed.size - passed > max(RESOLUTION, passed // PRECISION):
        middle = (passed + failed.size) // 2
        result = send(middle)
        if result.ok:
            passed = middle
        else:
            failed = result
    return passed, failed, probes


def check_largest_message(
    target: Target, options: CheckOptions, progress: Progress | None = None
) -> CheckResult:
    """The ceiling, and whether a hop other than ws_mode sets it (a failure, with a hint);
    ``progress`` hears each probe's outcome."""
    if progress is not None:
        progress(
            f"sending messages from {format_bytes(options.min_probe_bytes)} up to "
            f"{format_bytes(options.max_probe_bytes)}, one socket each (--max-probe-bytes)"
        )
    passed, failed, probes = find_ceiling(target, options, progress)
    data = {
        "ceiling_bytes": passed,
        "failed_bytes": failed.size if failed else None,
        "failure": failed.failure if failed else None,
        "probes": [asdict(one) for one in probes],
    }
    if failed is None:
        top = options.max_probe_bytes
        detail = f"≥ {format_bytes(top)}: every size up to {top} B got through"
        return CheckResult.ok(LARGEST_MESSAGE, f"{detail} ({len(probes)} probes)", **data)
    if passed is None:
        detail = (
            f"not even {failed.size} B ({format_bytes(failed.size)}) got through: {failed.detail}"
        )
        return CheckResult.failed(
            LARGEST_MESSAGE,
            detail,
            _PROBE_FAILURE_HINTS.get(failed.failure, "too_large_other"),
            **data,
        )
    ceiling = f"{format_bytes(passed)} ({passed} B)"
    if failed.failure == "message_too_large":
        detail = (
            f"{ceiling}; past it ws_mode answers message_too_large "
            "(Limits.max_message_bytes) and the socket stays usable"
        )
        return CheckResult.ok(LARGEST_MESSAGE, detail, **data)
    hint = HINTS[_PROBE_FAILURE_HINTS.get(failed.failure, "too_large_other")]
    if passed in _DEFAULT_LIMITS:  # a server's default: name it
        hint = f"{format_bytes(passed)} is {_DEFAULT_LIMITS[passed]}; {hint}"
    detail = f"{ceiling} gets through; {failed.size} B: {failed.detail}"
    return CheckResult.failed(LARGEST_MESSAGE, detail, hint, **data)


# ----------------------------------------------------------------------------- idle

IDLE_SOCKET: Final = "idle socket"
#: The client's ping interval while the server's pings are timed, as a share of the idle time
#: after which a hop closed a socket (so that the hop sees a frame well before its timeout)...
CLIENT_PING_SHARE: Final = 1 / 3
#: ... and its floor, in seconds.
MIN_CLIENT_PING_SECONDS: Final = 0.1
#: How often a socket kept open by client pings is looked at for a server ping, in seconds.
PING_POLL_SECONDS: Final = 1.0

#: The idle timeouts usually found in front of a server, named by the idle hints.
_IDLE_TIMEOUTS: Final = (
    "nginx proxy_read_timeout and proxy_send_timeout, 60 s by default, which ingress-nginx "
    "sets from its proxy-read-timeout and proxy-send-timeout annotations; HAProxy timeout "
    "tunnel; AWS ALB idle timeout, 60 s; Cloudflare, 100 s"
)
#: Where the ASGI servers set their ping interval.
_PING_SETTINGS: Final = (
    "uvicorn --ws-ping-interval, hypercorn websocket_ping_interval, daphne --ping-interval; "
    "granian sends none"
)


class PingTimedConnection(ClientConnection):
    """A blocking client connection that notes when each ping from the other end arrives:
    ``pings`` holds their ``time.monotonic()``, ``opened`` when the connection was made. The
    idle check times the server's pings with it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Set before the connection starts its reading thread, which calls process_event.
        self.opened = time.monotonic()
        self.pings: list[float] = []
        super().__init__(*args, **kwargs)

    def process_event(self, event: Event) -> None:
        """Note a ping, then process the event as websockets does (it answers the ping)."""
        if isinstance(event, Frame) and event.opcode is Opcode.PING:
            self.pings.append(time.monotonic())
        super().process_event(event)

    def ping_times(self) -> list[float]:
        """When each ping arrived, in seconds after the connection was made."""
        return [round(at - self.opened, 3) for at in self.pings]


def open_ping_timed_socket(
    target: Target, options: CheckOptions
) -> tuple[SyncSocket, PingTimedConnection]:
    """A socket like ``open_socket(target, options, pings=False)``, whose connection times
    the pings it gets (:class:`PingTimedConnection`)."""
    # websockets' own connect, the only one that takes create_connection; the options are
    # those of the kit's connect (no compression, no size limit, no proxy), without pings.
    # Entered as a context manager, as the kit's connect does (websockets 17.1 deprecates
    # using its result directly); the socket's close leaves it.
    opened = contextlib.ExitStack()
    connect_here = sync_connect(
        target.url,
        additional_headers=dict(options.headers),
        open_timeout=options.timeout,
        compression=None,
        max_size=None,
        proxy=None,
        close_timeout=CLOSE_TIMEOUT,
        ping_interval=None,
        create_connection=PingTimedConnection,
    )
    connection = opened.enter_context(connect_here)
    assert isinstance(connection, PingTimedConnection)
    return SyncSocket(connection, opened), connection


@dataclass
class IdleWait:
    """What happened on a socket on which the client sent no data frame for ``seconds``:
    closed after ``closed_after`` seconds (None: still open) with ``close_code``, or an
    ``event`` arrived after ``event_after`` seconds; ``pings``: when each ping from the other
    end arrived, in seconds after the socket opened."""

    seconds: float
    pings: list[float]
    closed_after: float | None = None
    close_code: int | None = None
    event: dict[str, Any] | None = None
    event_after: float | None = None


def wait_idle(
    socket: SyncSocket,
    connection: PingTimedConnection,
    seconds: float,
    *,
    client_pings: float | None = None,
    until_ping: bool = False,
    progress: Progress | None = None,
) -> IdleWait:
    """Send no data frame on ``socket`` for ``seconds`` and see what happens. ``client_pings``
    sends a ping that often (None: none); ``until_ping`` stops at the first ping from the other
    end; ``progress`` hears every :data:`PROGRESS_SECONDS` that the wait goes on."""
    opened = connection.opened
    deadline = time.monotonic() + seconds
    next_ping = time.monotonic() + client_pings if client_pings else float("inf")
    next_report = time.monotonic() + PROGRESS_SECONDS
    while (now := time.monotonic()) < deadline and not (until_ping and connection.pings):
        wake = min(deadline, next_ping, next_report)
        if until_ping:
            wake = min(wake, now + PING_POLL_SECONDS)
        try:
            event = read_event(socket, max(0.0, wake - now))
        except TimeoutError:
            pass
        except SocketClosed:
            took = time.monotonic() - opened
            return IdleWait(seconds, connection.ping_times(), took, close_code(socket))
        else:
            took = time.monotonic() - opened
            return IdleWait(seconds, connection.ping_times(), event=event, event_after=took)
        now = time.monotonic()
        if client_pings and now >= next_ping:
            # Closed meanwhile: the next read says so.
            with contextlib.suppress(ConnectionClosed):
                connection.ping()
            next_ping = now + client_pings
        if progress is not None and now >= next_report:
            pings = len(connection.pings)
            heard = f"{pings} ping(s) from the server" if pings else "no ping from the server"
            progress(f"still open after {now - opened:.0f} s of {seconds:g} s ({heard})")
            next_report = now + PROGRESS_SECONDS
    return IdleWait(seconds, connection.ping_times())


def describe_pings(pings: list[float]) -> str:
    """The pings a socket got, in words: how many, and how often."""
    if not pings:
        return "no ping from the server"
    if len(pings) == 1:
        return f"1 ping from the server, after {pings[0]:.1f} s"
    gaps = sorted(later - earlier for earlier, later in itertools.pairwise(pings))
    return f"{len(pings)} pings from the server, every {gaps[len(gaps) // 2]:.1f} s"


def check_idle_socket(
    target: Target, options: CheckOptions, progress: Progress | None = None
) -> CheckResult:
    """A socket on which the client sends nothing for ``idle_seconds`` (not even pings) is
    still open and answers a warm-up afterwards. When a hop closed it, the server's pings are
    timed on a second socket the client keeps open (:func:`time_server_pings`), so that the
    hint says whether pings are off, too slow for the hop's timeout, or no help there."""
    name, idle = IDLE_SOCKET, options.idle_seconds
    say = progress or (lambda line: None)
    say(f"waiting {idle:g} s on a socket with nothing sent, not even pings (--idle)")
    socket, connection = open_ping_timed_socket(target, options)
    with socket:
        wait = wait_idle(socket, connection, idle, progress=say)
        if wait.event is not None:
            event, took = wait.event, wait.event_after
            if event.get("type") == "error" and error_code(event) == "websocket_idle_timeout":
                detail = f"ws_mode closed it after {took:.1f} s (websocket_idle_timeout)"
                return CheckResult.failed(name, detail, "idle_ws_mode", closed_after=took)
            detail = f"an unasked-for {event.get('type')!r} event arrived after {took:.1f} s"
            return CheckResult.failed(name, detail, "protocol")
        if wait.closed_after is not None:
            return _closed_when_idle(target, options, wait, say)
        request = response_create(options, "ws-mode check: after idle", generate=False)
        try:
            result = run_turn(socket, request, options, Step(generate=False))
        except TimeoutError:
            detail = f"open after {idle:g} s idle, but a warm-up then got no answer"
            return CheckResult.failed(name, detail, "idle_silent", server_pings=wait.pings)
        except (SocketClosed, ConnectionClosed, OSError):
            detail = f"closed when used after {idle:g} s idle (close {close_code(socket)})"
            return CheckResult.failed(name, detail, "idle", server_pings=wait.pings)
        if not result.completed:
            detail = f"after {idle:g} s idle, a warm-up ended with {result.outcome()}"
            return CheckResult.failed(name, detail, "protocol")
    detail = f"open after {idle:g} s without a frame from the client, and answering"
    return CheckResult.ok(
        name, f"{detail} ({describe_pings(wait.pings)})", seconds=idle, server_pings=wait.pings
    )


def _closed_when_idle(
    target: Target, options: CheckOptions, wait: IdleWait, say: Progress
) -> CheckResult:
    """The failure of an idle socket a hop closed, with the hint that what was measured
    calls for."""
    assert wait.closed_after is not None
    took, name = wait.closed_after, IDLE_SOCKET
    detail = f"closed after {took:.1f} s of {wait.seconds:g} s idle (close {wait.close_code})"
    data: dict[str, Any] = {
        "closed_after": took,
        "close_code": wait.close_code,
        "server_pings": wait.pings,
    }
    if wait.pings:
        detail += f", though {describe_pings(wait.pings)} came before"
        hint = pings_ignored_hint(took, "the server's pings reached the client")
        return CheckResult.failed(name, detail, hint, **data)
    timed = time_server_pings(target, options, took, say)
    if timed is None:
        return CheckResult.failed(name, detail + ", no ping from the server before", "idle", **data)
    every = client_ping_interval(took)
    data["ping_timing"] = {"client_ping_seconds": every, **asdict(timed)}
    if timed.pings:
        first = timed.pings[0]
        detail += f"; the server's first ping comes {first:.1f} s after a socket opens"
        return CheckResult.failed(name, detail, slow_pings_hint(took, first), **data)
    if timed.closed_after is not None:
        detail += (
            f"; a socket on which the client pinged every {every:.1f} s was closed too, after "
            f"{timed.closed_after:.1f} s"
        )
        what = f"the client pinged every {every:.1f} s"
        return CheckResult.failed(name, detail, pings_ignored_hint(took, what), **data)
    detail += f"; no ping from the server in {wait.seconds:g} s"
    return CheckResult.failed(name, detail, no_server_pings_hint(took, wait.seconds), **data)


def client_ping_interval(closed_after: float) -> float:
    """How often the client pings while it times the server's pings, given that a hop
    closed an idle socket after ``closed_after`` seconds."""
    return max(MIN_CLIENT_PING_SECONDS, closed_after * CLIENT_PING_SHARE)


def time_server_pings(
    target: Target, options: CheckOptions, closed_after: float, say: Progress
) -> IdleWait | None:
    """Wait on a new socket, kept open by client pings, for the server's first ping (for
    ``idle_seconds`` at most); None when no socket opens."""
    every = client_ping_interval(closed_after)
    say(
        f"closed after {closed_after:.1f} s with no ping from the server; timing the "
        f"server's pings on a socket the client pings every {every:.1f} s (up to "
        f"{options.idle_seconds:g} s)"
    )
    try:
        socket, connection = open_ping_timed_socket(target, options)
    except (InvalidHandshake, OSError):
        return None
    with socket:
        return wait_idle(
            socket,
            connection,
            options.idle_seconds,
            client_pings=every,
            until_ping=True,
            progress=say,
        )


def slow_pings_hint(closed_after: float, first_ping: float) -> str:
    """The hint when the server pings, but less often than a hop's idle timeout."""
    return (
        f"the server pings, but its first ping comes after {first_ping:.1f} s and a hop "
        f"closes a socket idle for {closed_after:.1f} s: pings keep a socket open only when "
        "they come more often than the shortest idle timeout on the way. Set the server's "
        f"ping interval below {closed_after:.1f} s ({_PING_SETTINGS}), or raise the hop's idle "
        f"timeout well above {first_ping:.1f} s ({_IDLE_TIMEOUTS}); raised above "
        "Limits.max_connection_seconds, it also keeps the sockets of clients that never ping."
    )


def no_server_pings_hint(closed_after: float, waited: float) -> str:
    """The hint when a hop closes idle sockets and the server sends no pings."""
    return (
        f"a hop closes a socket idle for {closed_after:.1f} s, and the server sent no ping "
        f"in {waited:g} s (its pings are off, or slower than that): turn them on with an "
        f"interval below {closed_after:.1f} s ({_PING_SETTINGS}), or raise the hop's idle "
        f"timeout ({_IDLE_TIMEOUTS}) above Limits.max_connection_seconds. Clients that ping "
        "(the openai SDK, every 20 s) keep their own sockets open meanwhile."
    )


def pings_ignored_hint(closed_after: float, what: str) -> str:
    """The hint when a hop closed an idle socket although pings went through it."""
    return (
        f"a hop closed the socket after {closed_after:.1f} s although {what}: it counts only "
        "data frames, or it limits a connection's life whatever moves (a Google Cloud load "
        "balancer's backend service timeout), so pings cannot keep sockets open there. Raise "
        f"that timeout above Limits.max_connection_seconds ({_IDLE_TIMEOUTS}), or lower "
        "max_connection_seconds below it, so that ws_mode ends its sockets first, cleanly."
    )


# ----------------------------------------------------------------------------- the run

SocketCheck = Callable[[SyncSocket, CheckOptions], CheckResult]
SOCKET_CHECKS: Final[tuple[tuple[str, SocketCheck], ...]] = (
    ("warm-up", check_warm_up),
    ("chained conversation", check_chained_conversation),
    ("previous_response_not_found", check_unknown_previous_response),
    ("lanes", check_lanes),
    ("error envelope", check_error_envelope),
)


def run_checks(
    target: Target,
    options: CheckOptions,
    on_result: Callable[[CheckResult], None] | None = None,
    on_progress: Callable[[str, str], None] | None = None,
) -> CheckReport:
    """Run every check against ``target``; ``on_result`` hears each result as it comes,
    ``on_progress`` each line of progress of a long check (``(check, line)``: what it waits
    for, each message size probed)."""
    results: list[CheckResult] = []

    def record(result: CheckResult) -> None:
        results.append(result)
        if on_result is not None:
            on_result(result)

    def progress_of(name: str) -> Progress | None:
        if on_progress is None:
            return None
        return lambda line: on_progress(name, line)

    checks: list[tuple[str, Callable[[], CheckResult]]] = []
    for name, check in SOCKET_CHECKS:
        checks.append((name, _on_new_socket(target, options, check)))
    checks.append(
        (
            LARGEST_MESSAGE,
            lambda: check_largest_message(target, options, progress_of(LARGEST_MESSAGE)),
        )
    )
    checks.append(
        (IDLE_SOCKET, lambda: check_idle_socket(target, options, progress_of(IDLE_SOCKET)))
    )
    handshake = check_handshake(target, options)
    record(handshake)
    for name, run in checks:
        if handshake.status != "ok":
            record(CheckResult.skipped(name, "the handshake failed"))
        elif name == LARGEST_MESSAGE and not options.max_probe_bytes:
            record(CheckResult.skipped(name, "--max-probe-bytes 0"))
        elif name == IDLE_SOCKET and not options.idle_seconds:
            record(CheckResult.skipped(name, "--idle 0"))
        else:
            record(_run_guarded(name, options, run))
    return CheckReport(target.url, results)


def _on_new_socket(
    target: Target, options: CheckOptions, check: SocketCheck
) -> Callable[[], CheckResult]:
    def run() -> CheckResult:
        with open_socket(target, options) as socket:
            return check(socket, options)

    return run


def _run_guarded(name: str, options: CheckOptions, run: Callable[[], CheckResult]) -> CheckResult:
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
        detail, hint, _ = describe_refusal(exc)
        return CheckResult.failed(name, f"could not open a socket: {detail}", hint)


# ----------------------------------------------------------------------------- the report


def format_report(report: CheckReport) -> list[str]:
    """The report as lines: a title, the table (check, result, detail), the hint of each
    failure, and a verdict."""
    rows = [(result.name, result.status, result.detail) for result in report.results]
    widths = [
        max(len(row[column]) for row in [("check", "result", ""), *rows]) for column in (0, 1)
    ]
    lines = [f"ws-mode check {report.url}", ""]
    head = f"  {'check'.ljust(widths[0])}  {'result'.ljust(widths[1])}  detail"
    lines += [head, "  " + "-" * (len(head) + 30)]
    for name, status, detail in rows:
        lines.append(f"  {name.ljust(widths[0])}  {status.ljust(widths[1])}  {detail}".rstrip())
    hints = [result for result in report.results if result.status == "FAILED" and result.hint]
    if hints:
        lines += ["", "What to change:"]
        for result in hints:
            lines += textwrap.wrap(
                f"{result.name}: {result.hint}",
                HINT_WIDTH,
                initial_indent="  ",
                subsequent_indent="    ",
                break_on_hyphens=False,
            )
    failed = sum(result.status == "FAILED" for result in report.results)
    skipped = sum(result.status == "skipped" for result in report.results)
    passed = len(report.results) - failed - skipped
    verdict = f"{passed} ok, {failed} failed, {skipped} skipped"
    lines += ["", verdict + (": WebSocket mode works here" if report.ok else "")]
    return lines


def report_json(report: CheckReport) -> dict[str, Any]:
    """The report as JSON: the URL, whether it passed, and each check with its data."""
    return {
        "url": report.url,
        "ok": report.ok,
        "checks": [
            {
                "name": result.name,
                "status": result.status.lower(),
                "detail": result.detail,
                "hint": result.hint or None,
                **({"data": result.data} if result.data else {}),
            }
            for result in report.results
        ],
    }
