"""`text/event-stream` bodies: an incremental decoder, and the encoder of one event.

It follows the WHATWG event-stream parsing rules (lines end in CRLF, LF or CR; `data` lines
join with LF; a blank line dispatches; `:` starts a comment), accepts the body in chunks cut
anywhere, and hands each event out as soon as its blank line arrives.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

__all__ = ["SSEDecoder", "SSEEvent", "encode_sse"]


def encode_sse(event: dict[str, Any]) -> bytes:
    """One event as OpenAI's streams write it: an `event:` line naming its `type`, one
    `data:` line of JSON, a blank line."""
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


class SSEEvent(NamedTuple):
    """One dispatched event: the `event:` field (None when absent) and the `data` bytes."""

    event: str | None
    data: bytes


class SSEDecoder:
    """Feed body chunks with `feed`; it returns the events those chunks completed."""

    __slots__ = ("_buffer", "_data", "_event", "_has_data", "_skip_lf", "_started")

    def __init__(self) -> None:
        self._buffer = b""
        self._event: str | None = None
        self._data: list[bytes] = []
        self._has_data = False
        self._skip_lf = False
        self._started = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode a chunk of the body; return the events it completed, in order."""
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if not self._started:
            buffered = self._buffer + chunk
            if len(buffered) < 3 and b"\xef\xbb\xbf".startswith(buffered):
                self._buffer = buffered
                return []
            self._started = True
            self._buffer = b""
            chunk = buffered[3:] if buffered.startswith(b"\xef\xbb\xbf") else buffered
        if b"\r" in chunk:
            # A CR that ends the chunk may be the first half of a CRLF split across chunks.
            self._skip_lf = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = (self._buffer + chunk).split(b"\n") if self._buffer else chunk.split(b"\n")
        self._buffer = lines.pop()
        events: list[SSEEvent] = []
        for line in lines:
            # The two fields that carry something, in the shapes servers write, come first.
            if line.startswith(b"data: "):
                self._data.append(line[6:])
                self._has_data = True
            elif line.startswith(b"event: "):
                self._event = line[7:].decode("utf-8", "replace") or None
            elif not line:
                if self._has_data:
                    events.append(SSEEvent(self._event, b"\n".join(self._data)))
                    self._data = []
                    self._has_data = False
                self._event = None
            else:
                self._field(line)
        return events

    def _field(self, line: bytes) -> None:
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
            self._has_data = True
        elif name == b"event":
            self._event = value.decode("utf-8", "replace") or None
        # `id`, `retry`, comments (empty name) and unknown fields carry nothing we forward.
