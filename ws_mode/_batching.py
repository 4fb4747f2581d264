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

Public as :class:`ws_mode.server.BatchingWebSocketProtocol` (uvicorn's ``--ws
ws_mode.server:BatchingWebSocketProtocol``); the servers ``ws-mode serve``, ``ws-mode proxy`` and
the kit start use it by default. Needs uvicorn.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

#: The most bytes kept before they are written without waiting for the end of the pass.
FLUSH_BYTES: Final = 64 * 1024


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


class BatchingWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's ``websockets-sansio`` protocol writing through a :class:`BatchingTransport`."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Start with the real transport wrapped."""
        real = transport if isinstance(transport, BatchingTransport) else None
        wrapped = real or BatchingTransport(transport, self.loop)  # type: ignore[arg-type]
        super().connection_made(wrapped)  # type: ignore[arg-type]
