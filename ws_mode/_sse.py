"""`text/event-stream` bodies: an incremental decoder, and the encoder of one event.

It follows the WHATWG event-stream parsing rules (lines end in CRLF, LF or CR; `data` lines
join with LF; a blank line dispatches; `:` starts a comment), accepts the body in chunks cut
anywhere, and hands each event out as soon as its blank line arrives. `SSEBlocks` applies the
same rules while keeping the bytes, for a middleware that passes a stream on as it came
(stateful HTTP) and rewrites only some events' data (`SSEBlock.with_data`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import orjson

_BOM = b"\xef\xbb\xbf"
_LINE_END = re.compile(rb"\r\n|\r|\n")


def content_type(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The `content-type` of an ASGI header list, lowercased (b"" when there is none)."""
    found = b""
    for name, value in headers:
        if name.lower() == b"content-type":
            found = value.lower()
    return found


def is_event_stream(kind: bytes) -> bool:
    """Whether a lowercased content type (`content_type`) is an event stream."""
    return kind.startswith(b"text/event-stream")


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

    __slots__ = (
        "_buffer",
        "_data",
        "_data_bytes",
        "_event",
        "_has_data",
        "_plain",
        "_skip_lf",
        "_started",
        "_tail",
        "_tail_bytes",
    )

    def __init__(self) -> None:
        self._buffer = b""
        # Chunks of a line whose end has not arrived (a long `data:` line in many chunks),
        # joined once, when it does: joining each to the buffer would copy the line again
        # for every chunk.
        self._tail: list[bytes] = []
        self._tail_bytes = 0
        self._event: str | None = None
        self._data: list[bytes] = []
        self._data_bytes = 0
        self._has_data = False
        self._skip_lf = False
        self._started = False
        # Nothing pending: the next chunk starts at an event boundary.
        self._plain = False

    @property
    def pending(self) -> int:
        """The bytes held of the event not finished yet: its `data` lines so far and the line
        under way. A stream that never ends an event makes it grow; the caller bounds it."""
        return len(self._buffer) + self._tail_bytes + self._data_bytes

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
            and not self._tail
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
            if len(buffered) < 3 and _BOM.startswith(buffered):
                self._buffer = buffered
                return []
            self._started = True
            self._buffer = b""
            chunk = buffered[3:] if buffered.startswith(_BOM) else buffered
        if b"\r" in chunk:
            # A CR that ends the chunk may be the first half of a CRLF split across chunks.
            self._skip_lf = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if b"\n" not in chunk:
            self._tail.append(chunk)
            self._tail_bytes += len(chunk)
            return []
        if self._tail:
            self._buffer += b"".join(self._tail)
            self._tail = []
            self._tail_bytes = 0
        if (
            chunk[-2:] == b"\n\n"
            and not self._buffer
            and not self._has_data
            and self._event is None
        ):
            # Whole events with nothing pending: a stream's first chunk, often all of it (a
            # fast handler writes its whole answer at once), skips the line-by-line rules.
            return self._whole_events(chunk)
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
                self._data_bytes += len(line)
                self._has_data = True
            elif line.startswith(b"event: "):
                self._event = line[7:].decode("utf-8", "replace") or None
            elif not line:
                if self._has_data:
                    events.append((self._event, b"\n".join(self._data)))
                    self._data = []
                    self._data_bytes = 0
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
            self._data_bytes += len(value)
            self._has_data = True
        elif name == b"event":
            self._event = value.decode("utf-8", "replace") or None
        # `id`, `retry`, comments (empty name) and unknown fields carry nothing we forward.


class SSEBlock:
    """A stretch of an event stream exactly as it arrived (`lines`, each with its line end):
    an event's lines through the blank line that dispatched it (`event`), or lines that
    dispatch nothing (comments, blank lines, an event without data; `event` None)."""

    __slots__ = ("event", "lines")

    def __init__(self, lines: list[bytes], event: SSEEvent | None) -> None:
        self.lines = lines
        self.event = event

    @property
    def raw(self) -> bytes:
        """The block's bytes."""
        return b"".join(self.lines)

    def with_data(self, data: bytes) -> bytes:
        """The block with its `data` lines replaced by `data` (one `data:` line per line of
        it, where the first one was, with that line's end); every other line as it was."""
        out: list[bytes] = []
        replaced = False
        # `lines` may hold a whole event as one piece (`SSEBlocks`' path for whole chunks):
        # bytes.splitlines ends lines at CR, LF and CRLF, as the event-stream rules do.
        for line in self.raw.splitlines(keepends=True):
            content = line.rstrip(b"\r\n")
            if content.partition(b":")[0] != b"data":
                out.append(line)
            elif not replaced:
                end = line[len(content) :]
                out.extend(b"data: " + part + end for part in data.split(b"\n"))
                replaced = True
        return b"".join(out)


class SSEBlocks:
    """The decoder's rules, keeping the bytes: `feed` cuts a body into `SSEBlock`s whose bytes,
    with `rest()` at the end, are the body. An event's lines are held until its blank line;
    lines before an event's first field (comments: heartbeats) are handed out at once."""

    __slots__ = (
        "_block",
        "_block_bytes",
        "_decoder",
        "_line",
        "_skip_lf",
        "_started",
        "_tail",
        "_tail_bytes",
    )

    def __init__(self) -> None:
        self._decoder = SSEDecoder()
        self._block: list[bytes] = []  # the lines of the event being read
        self._block_bytes = 0
        self._line = b""  # the start of a line whose end has not arrived
        # Chunks with no line end, joined to `_line` once one arrives (as `SSEDecoder` does).
        self._tail: list[bytes] = []
        self._tail_bytes = 0
        self._skip_lf = False
        self._started = False

    @property
    def pending(self) -> int:
        """The bytes held back: the lines of the event being read, and the line under way."""
        return self._block_bytes + len(self._line) + self._tail_bytes

    def feed(self, chunk: bytes) -> list[SSEBlock]:
        """The blocks this chunk of the body completed, in order."""
        if (
            self._started
            and not self._block
            and not self._line
            and not self._tail
            and not self._skip_lf
            and chunk[-2:] == b"\n\n"
            and b"\r" not in chunk
        ):
            # Whole events with LF line ends, as servers flush them: cut at the blank lines
            # (each piece holds at most one event) and let the decoder read each whole.
            decoder = self._decoder
            pieces = []
            for piece in chunk[:-2].split(b"\n\n"):
                found = decoder._whole_events(piece + b"\n\n")
                pieces.append(SSEBlock([piece + b"\n\n"], found[0] if found else None))
            return pieces
        blocks: list[SSEBlock] = []
        if self._skip_lf and chunk:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                # The LF of a CRLF cut between chunks ends the line already taken.
                if self._block:
                    self._block[-1] += b"\n"
                else:
                    blocks.append(SSEBlock([b"\n"], None))
                chunk = chunk[1:]
        if self._started and b"\n" not in chunk and b"\r" not in chunk:
            if chunk:
                self._tail.append(chunk)
                self._tail_bytes += len(chunk)
            return blocks
        if self._tail:
            self._line += b"".join(self._tail)
            self._tail, self._tail_bytes = [], 0
        buffer = self._line + chunk if self._line else chunk
        if not self._started and buffer:
            if len(buffer) < 3 and _BOM.startswith(buffer):
                self._line = buffer
                return blocks
            self._started = True
            if buffer.startswith(_BOM):
                blocks.append(SSEBlock([_BOM], None))
                buffer = buffer[3:]
        start = 0
        for end in _LINE_END.finditer(buffer):
            line, content = buffer[start : end.end()], buffer[start : end.start()]
            start = end.end()
            if not self._block and (not content or content[:1] == b":"):
                blocks.append(SSEBlock([line], None))  # nothing held back: it passes at once
                continue
            self._block.append(line)
            self._block_bytes += len(line)
            events: list[SSEEvent] = []
            self._decoder._lines([content], events)
            if not content:
                blocks.append(SSEBlock(self._block, events[0] if events else None))
                self._block = []
                self._block_bytes = 0
        self._line = buffer[start:]
        self._skip_lf = start == len(buffer) and buffer.endswith(b"\r")
        return blocks

    def rest(self) -> bytes:
        """What the body ended with that completed no block (an event with no blank line
        after it dispatches nothing)."""
        rest = b"".join([*self._block, self._line, *self._tail])
        self._block, self._line, self._tail = [], b"", []
        self._block_bytes = self._tail_bytes = 0
        return rest
