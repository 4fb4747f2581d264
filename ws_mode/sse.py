"""`text/event-stream` bodies: an incremental decoder, and the encoder of one event.

It follows the WHATWG event-stream parsing rules (lines end in CRLF, LF or CR; `data` lines
join with LF; a blank line dispatches; `:` starts a comment), accepts the body in chunks cut
anywhere, and hands each event out as soon as its blank line arrives.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["SSEDecoder", "SSEEvent", "encode_sse"]


def encode_sse(event: dict[str, Any]) -> bytes:
    """One event as OpenAI's streams write it: an `event:` line naming its `type`, one
    `data:` line of JSON, a blank line."""
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


SSEEvent = tuple[str | None, bytes]
"""One dispatched event: the `event:` field (None when absent) and the `data` bytes. A plain
pair, not a named tuple: a stream makes thousands a second."""


class SSEDecoder:
    """Feed body chunks with `feed`; it returns the events those chunks completed."""

    __slots__ = ("_buffer", "_data", "_event", "_has_data", "_plain", "_skip_lf", "_started")

    def __init__(self) -> None:
        self._buffer = b""
        self._event: str | None = None
        self._data: list[bytes] = []
        self._has_data = False
        self._skip_lf = False
        self._started = False
        # Nothing pending: the next chunk starts at an event boundary.
        self._plain = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode a chunk of the body; return the events it completed, in order."""
        if self._plain and chunk[-2:] == b"\n\n" and b"\r" not in chunk:
            # A chunk of whole events, as servers flush them; most often one event of an
            # `event:` line and a `data:` line, taken here without `_whole_events`' split and
            # loop (they add a tenth to ws_mode's cost per event).
            block = chunk[:-2]
            end = block.find(b"\n")
            if (
                block.startswith(b"event: ")
                and block.startswith(b"data: ", end + 1)
                and block.find(b"\n", end + 1) < 0
            ):
                name = block[7:end].decode("utf-8", "replace") or None
                return [(name, block[end + 7 :])]
            return self._whole_events(chunk)
        events = self._feed(chunk)
        self._plain = (
            self._started
            and not self._skip_lf
            and not self._buffer
            and not self._has_data
            and self._event is None
        )
        return events

    def _feed(self, chunk: bytes) -> list[SSEEvent]:
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
        self._lines(lines, events)
        return events

    def _whole_events(self, chunk: bytes) -> list[SSEEvent]:
        """Events of a chunk that starts and ends at event boundaries, with no CR: an event of
        one `event:` and one `data:` line, or of one `data:` line, is taken whole; any other
        goes through the line-by-line rules (which leave no state behind at a boundary)."""
        events: list[SSEEvent] = []
        for block in chunk[:-2].split(b"\n\n"):
            if block[:7] == b"event: ":
                end = block.find(b"\n")
                if (
                    end > 0
                    and block[end + 1 : end + 7] == b"data: "
                    and block.find(b"\n", end + 1) < 0
                ):
                    name = block[7:end].decode("utf-8", "replace") or None
                    events.append((name, block[end + 7 :]))
                    continue
            elif block[:6] == b"data: " and b"\n" not in block:
                events.append((None, block[6:]))
                continue
            lines = block.split(b"\n")
            lines.append(b"")
            self._lines(lines, events)
        return events

    def _lines(self, lines: list[bytes], events: list[SSEEvent]) -> None:
        for line in lines:
            # The two fields that carry something, in the shapes servers write, come first.
            if line.startswith(b"data: "):
                self._data.append(line[6:])
                self._has_data = True
            elif line.startswith(b"event: "):
                self._event = line[7:].decode("utf-8", "replace") or None
            elif not line:
                if self._has_data:
                    events.append((self._event, b"\n".join(self._data)))
                    self._data = []
                    self._has_data = False
                self._event = None
            else:
                self._field(line)

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
