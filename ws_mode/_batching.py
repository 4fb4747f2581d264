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
from websockets.exceptions import PayloadTooBig, ProtocolError
from websockets.extensions.base import Extension
from websockets.extensions.permessage_deflate import PerMessageDeflate
from websockets.frames import CTRL_OPCODES, Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State

from ._budget import (
    BUDGET_EXTENSION,
    INFLATE_STEP,
    MESSAGE_COPIES,
    REFUSED_MESSAGE,
    MemoryBudget,
)

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


#: What a sync flush ends with, which the sender leaves out of a compressed message (RFC 7692,
#: section 7.2.2): the receiver appends it.
_FLUSH_TAIL: Final = b"\x00\x00\xff\xff"


class BudgetedInflate(Extension):
    """The client's permessage-deflate as websockets applies it to what it parses, inflating a
    compressed frame in steps of at most :data:`~ws_mode._budget.INFLATE_STEP` bytes, each
    reserved in the protocol's budget before the next is made (websockets inflates a frame
    whole, up to the message size limit, before anything sees it: a few KiB on the wire
    became megabytes outside the account). A frame the budget cannot hold is dropped: what
    it inflated so far is let go, and the frame is handed on empty with the protocol told
    (:meth:`BatchingWebSocketProtocol._admit` drops its message). What is not inflated of a
    dropped message is still run through the connection's decompressor, a step at a time and
    let go, when the client compresses with context takeover (the next message refers to
    it); without, it is skipped. Encoding is the wrapped extension's."""

    __slots__ = ("deflate", "name", "protocol")

    def __init__(self, deflate: PerMessageDeflate, protocol: BatchingWebSocketProtocol) -> None:
        self.deflate = deflate
        self.name = deflate.name
        self.protocol = protocol

    def encode(self, frame: Frame) -> Frame:
        """The wrapped extension's."""
        return self.deflate.encode(frame)

    def decode(self, frame: Frame, *, max_size: int | None = None) -> Frame:
        """``frame`` inflated when its message is compressed (RSV1 on its first frame), within
        the budget and ``max_size`` (websockets' :class:`~websockets.exceptions.PayloadTooBig`
        past it); as it is otherwise."""
        opcode = frame.opcode
        if opcode in CTRL_OPCODES:
            return frame
        deflate = self.deflate
        fin = frame.fin
        if opcode is Opcode.CONT:
            if not deflate.decode_cont_data:
                return frame
            if fin:
                deflate.decode_cont_data = False
        else:
            if not frame.rsv1:
                return frame
            if not fin:
                deflate.decode_cont_data = True
            if deflate.remote_no_context_takeover:  # a new decompressor per message
                deflate.decoder = zlib.decompressobj(wbits=-deflate.remote_max_window_bits)
        payload = frame.data
        # The flush's tail is appended to a small frame (one call), given after a large one
        # (no copy of it); either way it inflates to nothing.
        tail_after = fin and len(payload) >= _APPEND_TAIL_BELOW
        if fin and not tail_after:
            payload = bytes(payload) + _FLUSH_TAIL
        decoder = deflate.decoder
        try:
            if self.protocol._dropping:
                # The rest of a message being dropped: nothing of it is kept.
                self._discard(decoder, payload)
                data = b""
            elif max_size is None or max_size >= INFLATE_STEP:
                data = decoder.decompress(payload, INFLATE_STEP)
                if decoder.unconsumed_tail:  # more than a step
                    data = self._inflate_rest(decoder, data, max_size)
            else:
                first = decoder.decompress(payload, _step(0, max_size))
                data = self._inflate_rest(decoder, first, max_size)
            if tail_after:
                deflate.decoder.decompress(_FLUSH_TAIL)
        except zlib.error as exc:
            raise ProtocolError("decompression failed") from exc
        if fin and deflate.remote_no_context_takeover:
            del deflate.decoder
        return Frame(opcode, data, fin, False, frame.rsv2, frame.rsv3)

    def _inflate_rest(self, decoder: Any, first: bytes, max_size: int | None) -> bytes:
        """What is left of a frame after its ``first`` step, a step at a time, each step
        reserved before the next is made; nothing when the budget cannot hold a step (the
        protocol told, the rest run through ``_discard``)."""
        protocol = self.protocol
        steps = [first]
        size = len(first)
        while True:
            if max_size is not None and size > max_size:
                raise PayloadTooBig(size, max_size)
            tail = decoder.unconsumed_tail
            if not tail:
                return b"".join(steps)
            if max_size is not None and size == max_size:
                raise PayloadTooBig(None, max_size)
            if not protocol._hold_inflated(len(steps[-1])):
                steps.clear()
                protocol._inflate_refused = True
                self._discard(decoder, tail)
                return b""
            steps.append(decoder.decompress(tail, _step(size, max_size)))
            size += len(steps[-1])

    def _discard(self, decoder: Any, payload: bytes | bytearray | memoryview) -> None:
        """Run ``payload`` through ``decoder`` a step at a time, keeping nothing, when the
        next message depends on it (context takeover); skip it otherwise, the message's
        decompressor replaced (what it was fed stops midway)."""
        deflate = self.deflate
        if deflate.remote_no_context_takeover:
            deflate.decoder = zlib.decompressobj(wbits=-deflate.remote_max_window_bits)
            return
        decoder.decompress(payload, INFLATE_STEP)
        while tail := decoder.unconsumed_tail:
            decoder.decompress(tail, INFLATE_STEP)


def _step(inflated: int, max_size: int | None) -> int:
    """How much the next step may inflate: a step, and no more than ``max_size`` leaves (at
    least one byte: zlib reads 0 as no bound, and one byte past it is the frame too large)."""
    if max_size is None:
        return INFLATE_STEP
    return max(1, min(INFLATE_STEP, max_size - inflated))


#: Below this many bytes on the wire, a final frame has the flush's tail appended (a copy of
#: it, cheaper than a second call into zlib for a small frame).
_APPEND_TAIL_BELOW: Final = 2048


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

    A message is held here, up to the message size limit per socket, before the application
    sees any of it: the fragments of a message still arriving (frames without FIN), and what a
    compressed frame inflates to (a few KiB on the wire may be the whole limit). Both are
    counted in the process's memory budget as they come, when ws_mode's middleware serves the
    socket (it hands the protocol its budget with ``websocket.accept``, through the ASGI
    extension ``ws_mode.memory_budget`` offered in the scope): fragments as they arrive, a
    compressed frame a step at a time as it inflates (:class:`BudgetedInflate`), each at
    :data:`~ws_mode._budget.MESSAGE_COPIES` times its size, held until the application takes
    the message. A fragment or step the budget cannot hold drops the message: the rest of it
    is let go as it arrives, and the middleware answers ``server_is_overloaded`` in its place,
    the socket kept.

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
    # Whether the client's permessage-deflate is wrapped in BudgetedInflate yet; what it
    # reserved inflating the frame being parsed, and whether the budget refused that frame.
    _inflation_watched: bool = False
    _inflated: int = 0
    _inflate_refused: bool = False
    # What the message handed to uvicorn's queue holds of the budget, until the application
    # takes it.
    _queued: int = 0
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
        if not self._inflation_watched:
            self._watch_inflation()
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
        message = await self.queue.get()
        if self._queued:  # the application holds the message now, and counts it
            self._let_queued_go()
        return message

    def handle_text(self, event: Frame) -> None:
        """uvicorn's, then the frame's payload let go (websockets' parser keeps the frame)."""
        if self._admit(event, first=True):
            super().handle_text(event)
            if event.fin:
                self._handed_on()
        event.data = b""

    def handle_bytes(self, event: Frame) -> None:
        """uvicorn's, then the frame's payload let go."""
        if self._admit(event, first=True):
            super().handle_bytes(event)
            if event.fin:
                self._handed_on()
        event.data = b""

    def handle_cont(self, event: Frame) -> None:
        """uvicorn's, then the frame's payload let go."""
        if self._admit(event, first=False):
            super().handle_cont(event)
            if event.fin:
                self._handed_on()
        event.data = b""

    def _admit(self, event: Frame, *, first: bool) -> bool:
        """Whether uvicorn takes this data frame. A message's last frame is taken, and what
        the message holds of the budget stays held until the application takes it; a fragment
        is taken once the budget holds it (:data:`~ws_mode._budget.MESSAGE_COPIES` times its
        size, what it inflated to reserved step by step by :class:`BudgetedInflate`). A frame
        the budget cannot hold, or could not hold as it inflated, drops the message: what
        uvicorn holds of it is let go, and so is the rest as it arrives, until its last frame,
        in place of which the application gets the refusal."""
        inflated, self._inflated = self._inflated, 0
        if first:
            self._dropping = False  # websockets refuses a new message inside another
        elif self._dropping:
            if event.fin:
                self._dropping = False
                self._hand_on_refusal()
            return False
        if self._inflate_refused:
            self._inflate_refused = False
            return self._drop(event)
        if event.fin:
            return True
        budget = self._budget
        size = len(event.data) * MESSAGE_COPIES - inflated
        if budget is None or budget.reserve(size):
            self._fragments += size
            return True
        return self._drop(event)

    def _hold_inflated(self, size: int) -> bool:
        """Reserve what ``size`` more bytes inflated for the frame being parsed will cost;
        False when the budget cannot hold it (always True with no budget)."""
        budget = self._budget
        if budget is None:
            return True
        cost = size * MESSAGE_COPIES
        if not budget.reserve(cost):
            return False
        self._fragments += cost
        self._inflated += cost
        return True

    def _drop(self, event: Frame) -> bool:
        """Drop the message ``event`` belongs to: what it holds is let go, the rest as it
        arrives; the refusal is handed on in place of its last frame."""
        self._let_fragments_go()
        self.frames = []
        if event.fin:
            self._hand_on_refusal()
        else:
            self._dropping = True
        return False

    def _handed_on(self) -> None:
        """A message's last frame was handed to uvicorn: what the message holds of the budget
        stays held until the application takes it from the queue (`receive`), so that what
        other sockets inflate meanwhile cannot fill the budget again; let go at once when
        uvicorn queued nothing (after the close, or text that is not UTF-8)."""
        self._queued += self._fragments
        self._fragments = 0
        if self.queue.empty() or self.close_sent:
            self._let_queued_go()

    def _let_fragments_go(self) -> None:
        if self._fragments and self._budget is not None:
            self._budget.release(self._fragments)
        self._fragments = 0

    def _let_queued_go(self) -> None:
        if self._queued and self._budget is not None:
            self._budget.release(self._queued)
        self._queued = 0

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
        self._let_queued_go()

    def _watch_inflation(self) -> None:
        """Wrap the client's negotiated permessage-deflate in :class:`BudgetedInflate`, once
        the handshake set the extensions."""
        self._inflation_watched = True
        extensions = self.conn.extensions
        for index, extension in enumerate(extensions):
            if isinstance(extension, PerMessageDeflate):
                extensions[index] = BudgetedInflate(extension, self)

    def _decide_framing(self) -> bool:
        """Whether data frames are framed here: with no extension, or permessage-deflate alone
        (the one uvicorn offers); another would be websockets' to apply."""
        if not self._inflation_watched:
            self._watch_inflation()
        extensions = self.conn.extensions
        if not extensions:
            self._framing = True
        elif len(extensions) == 1 and isinstance(extensions[0], BudgetedInflate):
            self._framing = True
            self._deflate = extensions[0].deflate
        else:
            self._framing = False
        return self._framing
