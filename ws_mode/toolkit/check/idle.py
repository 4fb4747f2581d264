"""The idle socket check of ``ws-mode check`` (:func:`check_idle_socket`): whether a socket on
which the client sends nothing survives every hop, and, when one closes it, why.

The client sends nothing, not even pings, for ``idle_seconds``, noting each ping the server
sends (:class:`PingTimedConnection`). When a hop closes the socket, the server's pings are timed
on a second socket that the client keeps open with its own pings (:func:`time_server_pings`),
so that the hint tells pings that are off, pings slower than the hop's timeout (both numbers
given) and a hop that pings cannot keep open. Needs websockets.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from dataclasses import asdict, dataclass
from typing import Any, Final

from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.frames import Frame, Opcode
from websockets.protocol import Event
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as sync_connect

from ws_mode.testing._client import (
    CLOSE_TIMEOUT,
    MessageTooLarge,
    SocketClosed,
    SyncSocket,
)
from ws_mode.testing._program import Step
from ws_mode.testing._validation import error_code

from .results import (
    PROGRESS_SECONDS,
    CheckOptions,
    CheckResult,
    Progress,
    Target,
    close_code,
    hint_for_error,
    read_event,
    response_create,
    run_turn,
)

IDLE_SOCKET: Final = "idle socket"
#: What to change when an idle socket does not survive, by what was seen.
IDLE_HINTS: Final[dict[str, str]] = {
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
    # those of the kit's connect (no compression, the check's size limit, no proxy), without
    # pings.
    # Entered as a context manager, as the kit's connect does (websockets 17.1 deprecates
    # using its result directly); the socket's close leaves it.
    opened = contextlib.ExitStack()
    connect_here = sync_connect(
        target.url,
        additional_headers=dict(options.headers),
        open_timeout=options.timeout,
        compression=None,
        max_size=options.max_message_bytes,
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
        except MessageTooLarge:  # the checker's own limit, not a hop's close: the run says so
            raise
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
                return CheckResult.failed(
                    name, detail, IDLE_HINTS["idle_ws_mode"], closed_after=took
                )
            detail = f"an unasked-for {event.get('type')!r} event arrived after {took:.1f} s"
            return CheckResult.failed(name, detail, "protocol")
        if wait.closed_after is not None:
            return _closed_when_idle(target, options, wait, say)
        request = response_create(options, "ws-mode check: after idle", generate=False)
        try:
            result = run_turn(socket, request, options, Step(generate=False))
        except TimeoutError:
            detail = f"open after {idle:g} s idle, but a warm-up then got no answer"
            return CheckResult.failed(
                name, detail, IDLE_HINTS["idle_silent"], server_pings=wait.pings
            )
        except MessageTooLarge:
            raise
        except (SocketClosed, ConnectionClosed, OSError):
            detail = f"closed when used after {idle:g} s idle (close {close_code(socket)})"
            return CheckResult.failed(name, detail, IDLE_HINTS["idle"], server_pings=wait.pings)
        if not result.completed:
            detail = f"after {idle:g} s idle, a warm-up ended with {result.outcome()}"
            hint = hint_for_error(result.error, "protocol") if result.error else "protocol"
            return CheckResult.failed(name, detail, hint)
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
        return CheckResult.failed(
            name, detail + ", no ping from the server before", IDLE_HINTS["idle"], **data
        )
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
