"""The process-wide memory budget: one account of what WebSocket mode holds in this process.

Every per-connection bound (`max_cached_bytes`, `max_queued_bytes`, `max_steer_bytes`, ...)
multiplied by `max_connections` is far more than a worker has: a few kilobytes on the wire
(permessage-deflate) inflate to megabytes of tiny JSON items, each costing about ten times its
text once decoded. So everything ws_mode holds also reserves its estimated size here first:
sockets, frames while they are parsed, queued creates, pending steering input, the handler's
answers read whole and cached responses. A reservation that does not fit is refused, and the
caller refuses the new work (`server_is_overloaded`, 503) instead of letting the worker grow
until it is killed.

There is one account per process (`ACCOUNT`), shared by every middleware in it; each
middleware enforces its own `Limits.max_memory_bytes` against the process's total.

What the ASGI server holds of a message before the middleware reads it is counted only under
ws_mode's protocol (`BUDGET_PROTOCOL`), which offers the extension `BUDGET_EXTENSION`; under
any other, the first socket logs one warning per process (`warn_outside_budget`) saying what
stays outside and what to run instead.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

#: What an idle socket costs the server (63 KiB measured with permessage-deflate, 29 KiB
#: without, under uvicorn with ws_mode's protocol; docs/limits.md),
#: reserved for as long as it is open.
CONNECTION_COST = 64 * 1024
#: What parsing a frame may cost per byte of its text, at its peak: arrays of tiny items
#: (`{"role":"user","content":"x"}`) peak at 13-14 times their JSON while they are decoded
#: and validated, and hold about 10 times it afterwards (measured on CPython 3.11,
#: tests/library/test_memory.py). Reserved before a frame is parsed, when nothing but its length is
#: known.
PARSE_FACTOR = 16
#: How many times a handler call holds its request body as bytes, beside the body decoded:
#: the body ws_mode hands it, and the framework's copy (Starlette's `request.body()` joins the
#: chunks it received, a copy even of one: measured 1.04 times the body).
BODY_COPIES = 2
#: How many times an answer read whole (a handler's JSON response object or error) is held as
#: frames while its events go out, beside the body and the answer decoded: one event at a time,
#: as its text, the protocol's encoding of it and its frame (the events carry the response
#: object, each up to the whole answer).
ANSWER_FRAME_COPIES = 3
#: How many times a message the client sends is held, at its peak, as the ASGI server hands it
#: to the application: its payload and the text decoded from it (or, for a fragmented one, its
#: fragments and the message they are joined into). The fragments of a message still arriving,
#: and what a compressed frame inflates to, reserve this many bytes per byte under ws_mode's
#: protocol.
MESSAGE_COPIES = 2
#: The most a compressed frame inflates to in one step under ws_mode's protocol: each step's
#: output is reserved before the next is made, so a frame the budget cannot hold is dropped
#: having held at most this much outside the account. A frame inflating to less is inflated in
#: one step and reserves nothing (an idle socket's reservation, `CONNECTION_COST`, and the
#: rule's per-socket overhead cover it).
INFLATE_STEP = 256 * 1024
#: After a refusal, new sockets are refused until the refused work would fit again, counting
#: at most this share of the budget (one refused huge frame must not keep sockets out long).
PRESSURE_SHARE = 4


#: The ASGI extension ws_mode's WebSocket protocol (`ws_mode.server.BatchingWebSocketProtocol`)
#: offers in a socket's scope, and the key of `websocket.accept` by which the middleware hands
#: it its `MemoryBudget`: what the protocol holds before a message reaches the middleware (the
#: fragments of a message not finished yet, what a compressed frame inflates to) is counted
#: there.
BUDGET_EXTENSION = "ws_mode.memory_budget"
#: ws_mode's protocol, as uvicorn's `--ws` names it.
BUDGET_PROTOCOL = "ws_mode.server:BatchingWebSocketProtocol"
#: The key of the `websocket.receive` message that protocol hands on in place of a fragmented
#: message the budget could not hold (its fragments dropped as they came): the receive loop
#: answers `server_is_overloaded`, as for a whole message it cannot hold.
REFUSED_MESSAGE = "ws_mode.refused"


class MemoryAccount:
    """The bytes WebSocket mode holds in this process, reserved and released by its parts.

    Thread-safe: servers run in threads of one process (tests, embedded servers) too."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.used = 0
        #: The most ever held at once.
        self.peak = 0

    def reserve(self, size: int, limit: int) -> bool:
        """Hold `size` more bytes if the total stays within `limit`; False (and nothing held)
        when it would not."""
        with self._lock:
            if self.used + size > limit:
                return False
            self.used += size
            self.peak = max(self.peak, self.used)
            return True

    def release(self, size: int) -> None:
        """Give back `size` bytes reserved before."""
        with self._lock:
            self.used -= size


#: The account of this process.
ACCOUNT = MemoryAccount()


class MemoryBudget:
    """One middleware's view of the process's account: its limit, what it holds itself, and
    its refusals. `reserve` before holding something, `release` when it is let go."""

    def __init__(self, limit: int, account: MemoryAccount = ACCOUNT) -> None:
        self.limit = limit
        self.account = account
        #: What this middleware's connections hold now (part of `account.used`).
        self.held = 0
        #: Reservations refused, since the middleware was created.
        self.refusals = 0
        self._pressure = 0  # the size of the last refused reservation, capped

    @property
    def used(self) -> int:
        """What WebSocket mode holds in this process, every middleware counted."""
        return self.account.used

    def reserve(self, size: int) -> bool:
        """Hold `size` bytes; False when the process's total would pass the limit."""
        if size <= 0:
            return True
        if not self.account.reserve(size, self.limit):
            self.refusals += 1
            self._pressure = min(size, self.limit // PRESSURE_SHARE)
            return False
        self.held += size
        return True

    def release(self, size: int) -> None:
        """Give back `size` bytes this middleware reserved."""
        if size <= 0:
            return
        self.held -= size
        self.account.release(size)

    def admits_connection(self) -> bool:
        """Whether a new socket may be opened: there is room for it, and for the work the
        budget last refused (until that fits again)."""
        needed = max(CONNECTION_COST, self._pressure)
        if self.account.used + needed <= self.limit:
            self._pressure = 0
            return True
        return False


#: What the servers that cannot run ws_mode's protocol hold of what a client sends before the
#: middleware reads it, outside the budget, and the setting that bounds it (docs/deployment.md,
#: measured with hypercorn 0.18, daphne 4.2 and granian 2.8).
_OUTSIDE = {
    "hypercorn": (
        "hypercorn holds a message still arriving, decompressed, outside Limits.max_memory_bytes "
        "(about its websocket_max_message_size per socket, 16 MiB by default, twice it at a "
        "peak), and inflates a "
        "frame whole before it checks that limit, which no setting bounds; keep "
        "websocket_max_message_size at Limits.max_message_bytes + 1 MiB, and the worker's memory "
        "above the budget plus max_connections times it (docs/deployment.md, ASGI servers)"
    ),
    "daphne": (
        "daphne holds a message still arriving outside Limits.max_memory_bytes (up to its "
        "--websocket-max-message-size per socket, as sent: it negotiates no compression); keep "
        "--websocket-max-message-size and --websocket-max-frame-size at "
        "Limits.max_message_bytes + 1 MiB, and the worker's memory above the budget plus "
        "max_connections times it (docs/deployment.md, ASGI servers)"
    ),
    "granian": (
        "granian holds a message still arriving outside Limits.max_memory_bytes (up to 64 MiB "
        "per socket, about 75 MiB of memory, a limit it offers no setting for; as sent: it "
        "negotiates no compression); keep the worker's memory above the budget plus "
        "max_connections times 75 MiB, or lower max_connections (docs/deployment.md, ASGI "
        "servers)"
    ),
}

_warned = threading.Event()
_warning = threading.Lock()  # servers may run in several threads of one process


class Held:
    """What one piece of work holds in a budget (None: nothing is counted, everything fits),
    reserved as it grows and let go in part or whole: a handler's answer read whole, say."""

    __slots__ = ("budget", "size")

    def __init__(self, budget: MemoryBudget | None) -> None:
        self.budget = budget
        self.size = 0

    def add(self, size: int) -> bool:
        """Reserve `size` bytes more; False, holding no more, when the budget cannot."""
        if self.budget is None:
            return True
        if not self.budget.reserve(size):
            return False
        self.size += size
        return True

    def let_go(self, size: int | None = None) -> None:
        """Let go of `size` bytes of what is held (None: all of it)."""
        size = self.size if size is None else min(size, self.size)
        if size <= 0:
            return
        if self.budget is not None:
            self.budget.release(size)
        self.size -= size


def server_name(receive: Callable[..., Any], scope: Mapping[str, Any]) -> str:
    """Which ASGI server hands a socket's messages to `receive`: "uvicorn", "hypercorn",
    "daphne", "granian", or "" when it cannot tell (the callable wrapped by another middleware,
    another server). uvicorn and granian hand a method of their protocol; hypercorn and daphne
    a queue's `get`, told apart by the server imported and the extension hypercorn offers."""
    owner = getattr(receive, "__self__", None)
    package = type(owner).__module__.partition(".")[0] if owner is not None else ""
    if package in ("uvicorn", "granian"):
        return package
    if isinstance(owner, asyncio.Queue):
        extensions = scope.get("extensions") or {}
        if "hypercorn" in sys.modules and "websocket.http.response" in extensions:
            return "hypercorn"
        if "daphne" in sys.modules:
            return "daphne"
    return ""


def outside_budget_warning(receive: Callable[..., Any], scope: Mapping[str, Any]) -> str:
    """What a socket's server holds outside the budget, and what to do about it: the warning
    for a server that does not offer `BUDGET_EXTENSION`."""
    server = server_name(receive, scope)
    if server in _OUTSIDE:
        return (
            f"{_OUTSIDE[server]}; only uvicorn can run ws_mode's protocol, which counts it "
            f"(--ws {BUDGET_PROTOCOL})"
        )
    if server == "uvicorn":
        protocol = type(getattr(receive, "__self__", None)).__name__
        where = f"uvicorn's WebSocket protocol ({protocol})"
    else:
        where = "this server's WebSocket protocol"
    return (
        f"{where} holds what a client sends before ws_mode reads it outside "
        "Limits.max_memory_bytes: a message still arriving, and messages read ahead, each up to "
        "the server's message size limit per socket, decompressed (a few KiB on the wire with "
        f"permessage-deflate); run uvicorn with --ws {BUDGET_PROTOCOL}, or ws-mode serve --app "
        "MODULE:APP, whose protocol counts them (docs/deployment.md, uvicorn)"
    )


def warn_outside_budget(receive: Callable[..., Any], scope: Mapping[str, Any]) -> None:
    """Log `outside_budget_warning` once per process (a WARNING): called for each socket whose
    server does not offer `BUDGET_EXTENSION`."""
    if _warned.is_set():
        return
    with _warning:
        if _warned.is_set():
            return
        _warned.set()
    logger.warning(outside_budget_warning(receive, scope))
