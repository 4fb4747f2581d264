"""The process-wide memory budget: one account of what WebSocket mode holds in this process.

Every per-connection bound (`max_cached_bytes`, `max_queued_bytes`, `max_steer_bytes`, ...)
multiplied by `max_connections` is far more than a worker has: a few kilobytes on the wire
(permessage-deflate) inflate to megabytes of tiny JSON items, each costing about ten times its
text once decoded. So everything ws_mode holds also reserves its estimated size here first:
sockets, frames while they are parsed, queued creates, pending steering input, the handler's
answers read whole and cached responses. A reservation that does not fit is refused, and the
caller refuses the new work (`memory_budget_exceeded`, 503) instead of letting the worker grow
until it is killed.

There is one account per process (`ACCOUNT`), shared by every middleware in it; each
middleware enforces its own `Limits.max_memory_bytes` against the process's total.
"""

from __future__ import annotations

import threading

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
#: After a refusal, new sockets are refused until the refused work would fit again, counting
#: at most this share of the budget (one refused huge frame must not keep sockets out long).
PRESSURE_SHARE = 4


#: The ASGI extension ws_mode's WebSocket protocol (`ws_mode.server.BatchingWebSocketProtocol`)
#: offers in a socket's scope, and the key of `websocket.accept` by which the middleware hands
#: it its `MemoryBudget`: what the protocol holds before a message reaches the middleware (the
#: fragments of a message not finished yet) is counted there.
BUDGET_EXTENSION = "ws_mode.memory_budget"
#: The key of the `websocket.receive` message that protocol hands on in place of a fragmented
#: message the budget could not hold (its fragments dropped as they came): the receive loop
#: answers `memory_budget_exceeded`, as for a whole message it cannot hold.
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
