"""What ``ws-mode check``'s checks share: where the socket opens (:class:`Target`), how to
check (:class:`LiveOptions`), opening a socket (:func:`open_socket`), one turn read and
checked with the compatibility kit's validators (:func:`turn`), and why a socket did not
open, in words (:func:`refusal`). Needs websockets.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI

from ws_mode._protocol import TERMINAL_EVENTS
from ws_mode.testing._client import CLOSE_TIMEOUT, FrameError, SyncSocket, connect, socket_url
from ws_mode.testing._program import Step
from ws_mode.testing._validation import check_events, check_type, frame_failure

from ..http_client import describe_error
from .live_report import CheckResult

__all__ = [
    "CheckFailed",
    "LiveOptions",
    "Target",
    "Turn",
    "close_code",
    "create",
    "ended_well",
    "open_socket",
    "read_event",
    "refusal",
    "turn",
]

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
class LiveOptions:
    """How to check: the handshake's ``headers``, the ``model`` to ask for (none sent when
    None), how long one turn may take (``timeout``), the idle time (0 skips it) and the
    message sizes probed (``max_probe_bytes`` 0 skips the probe)."""

    headers: Mapping[str, str] = field(default_factory=dict)
    model: str | None = None
    timeout: float = 30.0
    idle_seconds: float = 75.0
    min_probe_bytes: int = 64 * KiB
    max_probe_bytes: int = 64 * MiB


def open_socket(target: Target, options: LiveOptions, *, pings: bool = True) -> SyncSocket:
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


def create(options: LiveOptions, input: Any, **fields: Any) -> dict[str, Any]:
    """A ``response.create`` with ``input``, the model asked for, and ``fields``."""
    request: dict[str, Any] = {"type": "response.create"}
    if options.model is not None:
        request["model"] = options.model
    request["input"] = input
    request.update(fields)
    return request


@dataclass
class Turn:
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


def turn(
    socket: SyncSocket,
    request: dict[str, Any],
    options: LiveOptions,
    step: Step,
    earlier: Mapping[str, int] | None = None,
) -> Turn:
    """Send ``request`` and read its turn; its events checked as the kit checks a turn
    (errors allowed: the caller says what it expected)."""
    socket.send(request)
    deadline = time.monotonic() + options.timeout
    events: list[dict[str, Any]] = []
    while not events or events[-1]["type"] not in TERMINAL_EVENTS:
        events.append(read_event(socket, max(0.0, deadline - time.monotonic())))
    response, output = check_events(
        step,
        request,
        events,
        earlier=earlier or {},
        allow_errors=True,
        validate_output=step.generate,
    )
    return Turn(request, events, response, output)


class CheckFailed(Exception):
    """A check's failure, already described in ``result``."""

    def __init__(self, result: CheckResult) -> None:
        super().__init__(result.detail)
        self.result = result


def ended_well(name: str, result: Turn, what: str) -> None:
    """Raise :class:`CheckFailed` (hint: the model) unless the turn finished: completed or
    incomplete."""
    if result.error is not None:
        raise CheckFailed(
            CheckResult.failed(
                name, f"{what} ended with an error: {describe_error(result.error)}", "model"
            )
        )
    if result.response is None or result.response.get("status") == "failed":
        error = (result.response or {}).get("error") or {}
        raise CheckFailed(
            CheckResult.failed(name, f"{what} failed: {describe_error({'error': error})}", "model")
        )


# ----------------------------------------------------------------------------- handshake


def refusal(exc: BaseException) -> tuple[str, str, dict[str, Any]]:
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
