"""The recorder: wraps the handler and records what each call received, for the check to compare
with what an HTTP client keeping the full history would have sent."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import orjson

from .._asgi import ASGIApp, Receive, Scope, Send
from .._handler_call import replay_body
from .._turn import turn
from ._items import as_items, copy_json

#: The handshake header that tags a run's handler calls (the handler sees the handshake's
#: headers on every turn).
RUN_HEADER = "x-ws-mode-check"


@dataclass(frozen=True)
class RecordedCall:
    """One call of the handler, as it received it.

    `body` is the JSON request body; `context` the whole context: the body's `input` as items
    (a string is one user message), or `Turn.history()` when the body held only the new items
    (`full_context=False`, a cache-aware turn of `full_context="on_miss"`).
    """

    body: Any
    context: Any
    full_context: bool
    headers: dict[str, str]
    has_turn: bool


class Recorder:
    """Wraps the handler app; records what each ws_mode call receives, then calls it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._calls: list[tuple[str | None, RecordedCall]] = []
        #: The runs in progress; ws_mode calls without a run's header are recorded (as
        #: untagged, a failure) only while one is.
        self.active: set[str] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in scope.get("headers", [])
        }
        current = turn(scope)
        tag = headers.get(RUN_HEADER)
        if tag is None and (current is None or not self.active):
            await self.app(scope, receive, send)  # other traffic: not ours
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        try:
            body: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = raw.decode("utf-8", "replace")
        full = current is None or current.full_context
        if full:
            context = as_items(body.get("input") if isinstance(body, dict) else None)
        else:
            assert current is not None
            context = copy_json(current.history())
        call = RecordedCall(body, context, full, headers, current is not None)
        with self._lock:
            self._calls.append((tag, call))
        await self.app(scope, replay_body(raw, receive), send)

    def take(self, token: str) -> list[RecordedCall]:
        """The calls of run `token` (and untagged calls) recorded since the last take."""
        with self._lock:
            taken = [call for tag, call in self._calls if tag in (token, None)]
            self._calls = [(tag, call) for tag, call in self._calls if tag not in (token, None)]
        return taken
