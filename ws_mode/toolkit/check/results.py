"""The ground every check of ``ws-mode check`` stands on: a check's result and the report of a
run (:class:`CheckResult`, :class:`CheckReport`), where and how to check (:class:`Target`,
:class:`CheckOptions`), the socket and turn helpers the checks share (:func:`open_socket`,
:func:`run_turn`, :func:`require_finished`, ...) and the hints (:data:`HINTS`) of failures more
than one check can meet. Needs websockets.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from ws_mode._protocol import HOOKS, TERMINAL_EVENTS
from ws_mode.testing._client import (
    CLOSE_TIMEOUT,
    DEFAULT_MAX_MESSAGE_BYTES,
    MESSAGE_OVERHEAD,
    FrameError,
    MessageTooLarge,
    ReadLimitExceeded,
    SyncSocket,
    check_received,
    connect,
    socket_url,
)
from ws_mode.testing._program import Step
from ws_mode.testing._validation import check_events, check_type, error_code, frame_failure

from ..http_client import describe_error

# ----------------------------------------------------------------------------- results

#: A check's outcome; ``skipped`` when it was not run (switched off, or the handshake failed).
Status = Literal["ok", "FAILED", "skipped"]
#: Told a line of progress while a check runs (what it waits for, each probe's outcome).
Progress = Callable[[str], None]
#: How often a long wait says it is still waiting, in seconds.
PROGRESS_SECONDS: Final = 15.0

_NGINX_UPGRADE: Final = (
    "nginx: proxy_http_version 1.1; proxy_set_header Upgrade $http_upgrade; "
    'proxy_set_header Connection "upgrade"; (HAProxy and load balancers pass upgrades '
    "by default; a CDN may need WebSockets switched on)"
)

#: What to change when a check fails, by the kind of failure.
HINTS: Final[dict[str, str]] = {
    "disabled": "WebSocket mode is switched off on this server (HTTP 426): the "
    "WebSocketModeMiddleware answers 426 while enabled=False; clients fall back to HTTP. "
    "Switch it on (middleware.enabled = True).",
    "draining": "the server is shutting down (503 server_shutting_down): it answers so "
    "between its stop and its exit, and clients retry. Check again once it (or the server "
    "replacing it) serves.",
    "memory": "the server's memory budget is used (503 server_is_overloaded): it opens no "
    "socket until work it holds ends. Raise Limits.max_memory_bytes, or add workers.",
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
    "answer_too_large": "the endpoint sent more than the checker reads (--max-message-bytes, "
    "64MiB by default: one message, or one socket's messages in all), so the checker stopped "
    "reading. An event of WebSocket mode is that large only when the response "
    "itself is: if yours are, pass a larger --max-message-bytes; if not, look for what "
    "sends it (the handler, a hop in front, something other than a Responses endpoint at "
    "this URL).",
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
    None), how long one turn may take (``timeout``), the idle time (0 skips it), the
    message sizes probed (``max_probe_bytes`` 0 skips the probe) and the largest message
    read from the endpoint (``max_message_bytes``, also the most one socket's messages may
    total: more fails its check, so that an endpoint cannot make the checker hold more)."""

    headers: Mapping[str, str] = field(default_factory=dict)
    model: str | None = None
    timeout: float = 30.0
    idle_seconds: float = 75.0
    min_probe_bytes: int = 64 * KiB
    max_probe_bytes: int = 64 * MiB
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES


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
        max_message_bytes=options.max_message_bytes,
    )


def too_large_detail(exc: MessageTooLarge | ReadLimitExceeded) -> str:
    """A check's detail when the endpoint sent a message past ``max_message_bytes``, or
    more than that in all on one socket."""
    if isinstance(exc, ReadLimitExceeded):
        return (
            f"the endpoint sent more than --max-message-bytes ({exc.limit} B) of messages on "
            f"one socket ({exc.received} B, each counted with {MESSAGE_OVERHEAD} B for its "
            "event): the checker stopped reading"
        )
    what = "a message" if exc.size is None else f"a message of {exc.size} B"
    return (
        f"the endpoint sent {what}, over --max-message-bytes ({exc.limit} B): the checker "
        "closed the socket (1009) without reading it"
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
        check_received(socket, options.max_message_bytes)
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


def hook_of(error: Any) -> str | None:
    """The hook of the application an error (the nested ``error`` object) says raised:
    ws_mode's ``server_error`` whose ``param`` is a hook's keyword (docs/protocol.md, "Errors"),
    else None."""
    if not isinstance(error, Mapping) or error.get("type") != "server_error":
        return None
    param = error.get("param")
    return param if isinstance(param, str) and param in HOOKS else None


def hook_hint(hook: str) -> str:
    """The hint of a failure a hook of the application caused: its exception, not the
    deployment."""
    return (
        f"your {hook} raised: see the server log (an ERROR line '{hook} raised ...' with the "
        "traceback). ws_mode's middleware is in front and answered; what failed is the "
        f"application's {hook} (docs/api.md, 'Hooks')."
    )


def hint_for_error(error: dict[str, Any], default: str) -> str:
    """The hint (a key of :data:`HINTS`, or the hint itself) of a turn that ended with the
    error event ``error``: a hook of the application that raised is named (:func:`hook_hint`),
    ``store`` for ws_mode's ``store_unavailable`` (its store failed, whatever the check
    asked), else ``default``."""
    hook = hook_of(error.get("error"))
    if hook is not None:
        return hook_hint(hook)
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
