"""uvicorn's ``websockets-sansio`` WebSocket protocol, its frames written in batches.

uvicorn writes every frame to the socket as soon as the application sends it: one ``write``
system call per event. A turn of WebSocket mode is a burst of events (a tool-call turn is 8),
usually decoded from one chunk of the upstream's answer in one pass of the event loop, and each
``write`` on loopback costs the sender the delivery too: measured with py-spy on ``ws-mode
proxy``, a third of the process's busy time was in ``write``. :class:`BatchingWebSocketProtocol`
gives uvicorn's protocol a transport that keeps what it is given during one pass of the event
loop and writes it as one buffer at the end of the pass (``loop.call_soon``): the same bytes in
the same order, no later than the next callback, in one system call. Closing the connection
(or its writing side) writes what is kept first, aborting it drops it. Flow control is the real
transport's (it calls the protocol's ``pause_writing`` as before): past :data:`FLUSH_BYTES` kept,
what is kept is written at once, so an application sending a long burst without yielding meets
the transport's high-water mark as it would have.

The protocol also frames the application's messages itself (:func:`data_frame`): a server's
frame is a 2-, 4- or 10-byte header and the payload, which costs a fraction of websockets'
``ServerProtocol.send_text`` and ``data_to_send`` per frame. When the client negotiated
permessage-deflate it compresses only messages of at least
:attr:`BatchingWebSocketProtocol.deflate_threshold` bytes: a turn's many small deltas compress
well with context takeover but cost most of deflate's CPU for a small share of the bytes, while
its few large events (the response, finished items) carry most of the bytes
(``python -m benchmarks.deflate_threshold`` measures both per threshold).

Public as :class:`ws_mode.server.BatchingWebSocketProtocol` (uvicorn's ``--ws
ws_mode.server:BatchingWebSocketProtocol``); the servers ``ws-mode serve``, ``ws-mode proxy`` and
the kit start use it by default. Needs uvicorn.
"""

from __future__ import annotations

import asyncio
import struct
import zlib
from typing import TYPE_CHECKING, Any, Final

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.extensions.permessage_deflate import PerMessageDeflate
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State

from ._budget import BUDGET_EXTENSION, REFUSED_MESSAGE, MemoryBudget

if TYPE_CHECKING:
    from uvicorn._types import ASGIReceiveEvent, ASGISendEvent

#: The most bytes kept before they are written without waiting for the end of the pass.
FLUSH_BYTES: Final = 64 * 1024
#: The default :attr:`BatchingWebSocketProtocol.deflate_threshold`.
DEFLATE_THRESHOLD: Final = 512


class BatchingTransport:
    """A transport whose writes made in one pass of the event loop go out as one ``write``;
    everything but writing, closing and aborting is the wrapped transport's."""

    __slots__ = ("_flush_scheduled", "_kept", "_kept_bytes", "_loop", "transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self._loop = loop
        self._kept: list[bytes] = []
        self._kept_bytes = 0
        self._flush_scheduled = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Keep ``data``; it is written with the rest at the end of this pass of the loop (at
        once past :data:`FLUSH_BYTES`)."""
        if not data:
            return
        self._kept.append(bytes(data))
        self._kept_bytes += len(data)
        if self._kept_bytes >= FLUSH_BYTES:
            self.flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_at_end_of_pass)

    def writelines(self, chunks: Any) -> None:
        """Keep every chunk of ``chunks``."""
        for chunk in chunks:
            self.write(chunk)

    def _flush_at_end_of_pass(self) -> None:
        self._flush_scheduled = False
        self.flush()

    def flush(self) -> None:
        """Write what is kept now, as one buffer."""
        if not self._kept:
            return
        kept = self._kept
        self._kept = []
        self._kept_bytes = 0
        if not self.transport.is_closing():
            self.transport.write(kept[0] if len(kept) == 1 else b"".join(kept))

    def get_write_buffer_size(self) -> int:
        """The bytes kept here and in the wrapped transport's buffer."""
        return self._kept_bytes + self.transport.get_write_buffer_size()

    def write_eof(self) -> None:
        """Write what is kept, then close the writing side."""
        self.flush()
        self.transport.write_eof()

    def close(self) -> None:
        """Write what is kept, then close (the close frame goes out before the connection
        ends)."""
        self.flush()
        self.transport.close()

    def abort(self) -> None:
        """Drop what is kept and abort the connection."""
        self._kept = []
        self._kept_bytes = 0
        self.transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def data_frame(
    payload: bytes, *, text: bool, deflate: PerMessageDeflate | None, threshold: int
) -> bytes:
    """One whole server-to-client data frame carrying ``payload``: FIN set, the text or binary
    opcode, unmasked (RFC 6455 masks only what clients send), compressed with ``deflate`` (the
    connection's negotiated permessage-deflate, RSV1 set) when it is given and ``payload`` has at
    least ``threshold`` bytes, as it is otherwise.

    A compressed message goes through the extension's own compressor, as websockets' would: a
    new one per message when the extension negotiated ``no_context_takeover`` for this side, else
    the one the connection keeps, so that every message it compressed is in the window the
    peer's decompressor keeps. A message left uncompressed (RSV1 clear, which RFC 7692 allows
    any sender) is in neither window, so skipping some keeps both sides in step.
    """
    first = _TEXT_FIN if text else _BINARY_FIN
    if deflate is not None and len(payload) >= threshold:
        if deflate.local_no_context_takeover:
            encoder = zlib.compressobj(
                wbits=-deflate.local_max_window_bits, **deflate.compress_settings
            )
        else:
            encoder = deflate.encoder
        compressed = encoder.compress(payload) + encoder.flush(zlib.Z_SYNC_FLUSH)
        # A sync flush ends with the empty stored block 00 00 ff ff, which the peer appends
        # itself (RFC 7692, section 7.2.1): it is not sent.
        length = len(compressed) - 4
        return b"".join((_header(first | _RSV1, length), memoryview(compressed)[:length]))
    return _header(first, len(payload)) + payload


def _header(first: int, length: int) -> bytes:
    if length < 126:
        return bytes((first, length))
    if length < 65536:
        return _HEADER_16.pack(first, 126, length)
    return _HEADER_64.pack(first, 127, length)


_TEXT_FIN: Final = 0x80 | int(Opcode.TEXT)
_BINARY_FIN: Final = 0x80 | int(Opcode.BINARY)
_RSV1: Final = 0x40
_HEADER_16: Final = struct.Struct("!BBH")
_HEADER_64: Final = struct.Struct("!BBQ")


def frame_size(data: bytes | bytearray) -> int | None:
    """The size on the wire of the frame ``data`` starts with, header included (RFC 6455,
    section 5.2), or None while its header is incomplete."""
    if len(data) < 2:
        return None
    second = data[1]
    length = second & 0x7F
    header = 6 if second & 0x80 else 2  # a client's frames carry a 4-byte mask
    if length == 126:
        if len(data) < 4:
            return None
        length = int.from_bytes(data[2:4], "big")
        header += 2
    elif length == 127:
        if len(data) < 10:
            return None
        length = int.from_bytes(data[2:10], "big")
        header += 8
    return header + length


class BatchingWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's ``websockets-sansio`` protocol writing through a :class:`BatchingTransport`,
    and framing the application's messages itself.

    A ``websocket.send`` on an open connection is framed here rather than by websockets'
    ``ServerProtocol`` (a fraction of its CPU per frame), and compressed only when it has at least
    :attr:`deflate_threshold` bytes; everything else (the handshake, pings, pongs, closes, a send
    on a connection that is closing) is uvicorn's, unchanged.

    What the client sends is read one frame at a time, and no further while a message waits for
    the application: uvicorn reads on as soon as the application takes a message, so while the
    application is busy with it (its answer waiting on a client that stopped reading) the next
    message is read, inflated and queued, up to the message size limit per socket, however
    small it was on the wire (permessage-deflate); and a chunk read from the socket is parsed
    whole, however many frames it holds. Here the bytes past the frame that completed a message
    stay as they arrived, compressed, until the application asks for the next message, and
    reading resumes only then. A frame's payload is let go once uvicorn made it a message
    (websockets' parser otherwise keeps the last frame until the next one arrives).

    The fragments of a message still arriving (frames without FIN, each inflated on its own)
    are held here, up to the message size limit per socket, before the application sees any
    of it: they are counted in the process's memory budget as they come, when ws_mode's
    middleware serves the socket (it hands the protocol its budget with ``websocket.accept``,
    through the ASGI extension ``ws_mode.memory_budget`` offered in the scope). A fragment the
    budget cannot hold drops the message: the rest of it is let go as it arrives, and the
    middleware answers ``server_is_overloaded`` in its place, the socket kept.

    A keepalive ping left unanswered closes the socket (1011) only when nothing at all came
    from the client meanwhile: a client uploading a message larger than its link carries in
    ``ping_timeout`` answers once the message is through.
    """

    #: The smallest message, in bytes (UTF-8 for text), compressed when the client negotiated
    #: permessage-deflate; smaller ones go out as they are (RSV1 clear), which RFC 7692 allows
    #: any sender. 0 compresses every message, as websockets does. Set it on a subclass to
    #: change it (uvicorn takes the subclass's path as ``--ws``).
    deflate_threshold: int = DEFLATE_THRESHOLD

    # Whether this connection's data frames are framed here (None: not decided yet; decided on
    # the first send after the handshake, when the extensions are known), and the negotiated
    # extension that compresses them. Set on the instance by _decide_framing.
    _framing: bool | None = None
    _deflate: PerMessageDeflate | None = None
    # What the client sent that is not parsed yet (a message waits for the application), and
    # how much of the frame being parsed has not been given to the parser yet. Set on the
    # instance once frames arrive.
    _unparsed: bytearray | None = None
    _frame_left: int = 0
    # The budget fragments are counted in (handed over with `websocket.accept`), what the
    # message being received holds of it, and whether that message is being dropped.
    _budget: MemoryBudget | None = None
    _fragments: int = 0
    _dropping: bool = False
    # When the client's bytes last arrived (the event loop's clock).
    _heard_at: float = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Start with the real transport wrapped."""
        real = transport if isinstance(transport, BatchingTransport) else None
        wrapped = real or BatchingTransport(transport, self.loop)  # type: ignore[arg-type]
        super().connection_made(wrapped)  # type: ignore[arg-type]

    def handle_connect(self, event: Request) -> None:
        """uvicorn's, with the extension by which ws_mode's middleware hands over its memory
        budget offered in the scope."""
        super().handle_connect(event)
        scope = getattr(self, "scope", None)  # none when the upgrade was refused
        if scope is not None:
            scope["extensions"][BUDGET_EXTENSION] = {}

    async def send(self, message: ASGISendEvent) -> None:
        """Send ``message`` as uvicorn does; a data message on an open connection is framed
        here, in one step."""
        if message["type"] == "websocket.accept" and BUDGET_EXTENSION in message:
            accept = dict(message)
            budget = accept.pop(BUDGET_EXTENSION)
            self._budget = budget if isinstance(budget, MemoryBudget) else None
            message = accept  # type: ignore[assignment]
        if message["type"] != "websocket.send":
            await super().send(message)
            if message["type"] == "websocket.close" and self._unparsed:
                self._parse()  # the client's answer to the close may be among what was kept
            return
        # uvicorn's flow control, first, as in its own send: a paused transport holds the
        # application here. Waiting on a set event does not yield, so the state read below is
        # the state the frame is written in.
        await self.writable.wait()
        conn = self.conn
        if (
            self.disconnected
            or not self.handshake_complete
            or self.close_sent
            or self.initial_response is not None
            or conn.state is not State.OPEN
            or conn.expect_continuation_frame
            or not (self._framing or (self._framing is None and self._decide_framing()))
        ):
            # Whatever uvicorn does then (ClientDisconnected, its errors, its frames).
            await super().send(message)
            return
        if conn.writes:
            # Anything websockets has queued goes first (uvicorn writes what websockets queues
            # as soon as it is queued, so this is not expected).
            self.transport.write(b"".join(conn.data_to_send()))
        data = message.get("bytes")
        if data is not None:
            text = False
        else:
            text_data = message.get("text")
            if text_data is None:
                return  # uvicorn sends no frame either
            data = text_data.encode()
            text = True
        if conn.debug:
            # websockets' own log line for a frame it sends.
            conn.logger.debug("> %s", Frame(Opcode.TEXT if text else Opcode.BINARY, data))
        self.transport.write(
            data_frame(data, text=text, deflate=self._deflate, threshold=self.deflate_threshold)
        )

    def keepalive_timeout(self) -> None:
        """A ping went unanswered for ``ping_timeout``: uvicorn closes with 1011, unless the
        client's bytes kept arriving meanwhile. A client uploading a large message over a slow
        link is alive, and its pong waits behind the message on the wire (a frame is not cut
        for a control frame): the wait for the pong goes on, for as long as bytes come, and
        while reading is paused here (a message waits for the application: the pong may be
        among what is not read yet)."""
        heard = self.loop.time() - self._heard_at
        if (
            self.pending_ping_payload is not None
            and self.ping_timeout is not None
            and (heard < self.ping_timeout or self.read_paused)
            and not self.close_sent
            and not self.transport.is_closing()
        ):
            self.pong_timer = self.loop.call_later(
                max(self.ping_timeout - heard, 0.01), self.keepalive_timeout
            )
            return
        super().keepalive_timeout()

    def data_received(self, data: bytes) -> None:
        """Parse what the client sent up to the frame that completes a message; keep the rest
        as it is until the application asks for the next message (`receive`)."""
        self._heard_at = self.loop.time()
        if not self.handshake_complete:
            # The request, and whatever a client sends before it has the answer (RFC 6455 has
            # it wait), parsed as uvicorn does.
            super().data_received(data)
            return
        if self._unparsed is None:
            self._unparsed = bytearray(data)
        else:
            self._unparsed += data
        self._parse()

    def _parse(self) -> None:
        """Give the parser what was kept, a frame at a time, until a message waits for the
        application (after the close only the close's answer is awaited: no message waits)."""
        kept = self._unparsed
        conn = self.conn
        while kept and (self.close_sent or self.queue.empty()):
            if self._frame_left == 0:
                size = frame_size(kept)
                if size is None:
                    break  # the rest of the header is on its way
                self._frame_left = size
            take = min(self._frame_left, len(kept))
            chunk = bytes(kept[:take])
            del kept[:take]
            self._frame_left -= take
            conn.receive_data(chunk)
            if conn.parser_exc is not None:
                self.handle_parser_exception()
                kept.clear()
                return
            self.handle_events()  # a message queued pauses reading (uvicorn's own)

    async def receive(self) -> ASGIReceiveEvent:
        """The application's next message; only when it asks with none waiting is what was
        kept parsed, and reading resumed."""
        if self.queue.empty():
            self._parse()
            if self.queue.empty() and self.read_paused:  # all kept was parsed: read on
                self.read_paused = False
                self.transport.resume_reading()
        return await self.queue.get()

    def handle_text(self, event: Frame) -> None:
        """uvicorn's, then the frame's payload let go (websockets' parser keeps the frame)."""
        if self._admit(event, first=True):
            super().handle_text(event)
        event.data = b""

    def handle_bytes(self, event: Frame) -> None:
        """uvicorn's, then the frame's payload let go."""
        if self._admit(event, first=True):
            super().handle_bytes(event)
        event.data = b""

    def handle_cont(self, event: Frame) -> None:
        """uvicorn's, then the frame's payload let go."""
        if self._admit(event, first=False):
            super().handle_cont(event)
        event.data = b""

    def _admit(self, event: Frame, *, first: bool) -> bool:
        """Whether uvicorn takes this data frame. A message's last frame is taken, and what
        its fragments held is let go from the budget (the whole message is the receive loop's
        to count from there); a fragment is taken once the budget holds it. One the budget
        cannot hold drops the message: what uvicorn holds of it is let go, and so is the rest
        as it arrives, until its last frame, in place of which the application gets the
        refusal."""
        if first:
            self._dropping = False  # websockets refuses a new message inside another
        elif self._dropping:
            if event.fin:
                self._dropping = False
                self._hand_on_refusal()
            return False
        if event.fin:
            self._let_fragments_go()
            return True
        budget = self._budget
        size = len(event.data)
        if budget is None or budget.reserve(size):
            self._fragments += size
            return True
        self._let_fragments_go()
        self.frames = []
        self._dropping = True
        return False

    def _let_fragments_go(self) -> None:
        if self._fragments and self._budget is not None:
            self._budget.release(self._fragments)
        self._fragments = 0

    def _hand_on_refusal(self) -> None:
        """A message in place of the one dropped, which the receive loop answers
        ``server_is_overloaded``; reading pauses as after any message."""
        if self.close_sent:
            return
        refusal: Any = {"type": "websocket.receive", "text": None, REFUSED_MESSAGE: True}
        self.queue.put_nowait(refusal)
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        """uvicorn's; what the fragments of an unfinished message held is let go."""
        super().connection_lost(exc)
        self.frames = []
        self._let_fragments_go()

    def _decide_framing(self) -> bool:
        """Whether data frames are framed here: with no extension, or permessage-deflate alone
        (the one uvicorn offers); another would be websockets' to apply."""
        extensions = self.conn.extensions
        if not extensions:
            self._framing = True
        elif len(extensions) == 1 and isinstance(extensions[0], PerMessageDeflate):
            self._framing = True
            self._deflate = extensions[0]
        else:
            self._framing = False
        return self._framing
