"""The one WebSocket mode client: a thin wrapper over ``websockets``, sync and asyncio. The kit
drives its programs with it, and the toolkit (the rollout, the load test, ``ws-mode check``)
imports it from here.

Both flavours build the socket URL the same way (:func:`socket_url`), decode every frame into an
event object the same way (:func:`decode_event`, which the HTTP client uses for SSE data too), and
read a response's events up to its terminal one (``TERMINAL_EVENTS`` of :mod:`ws_mode._protocol`),
optionally the terminal event of one ``stream_id`` lane (:func:`ends_turn`):

- :class:`SyncSocket` (:func:`connect`): the rollout driver and the compatibility kit;
- :class:`AsyncSocket` (:func:`connect_async`): the load test, whose lanes share one socket
  (:meth:`AsyncSocket.demultiplex` hands each lane the events of its ``stream_id``), and the
  forwarding microbenchmark.

Both read messages of at most ``max_message_bytes`` (:data:`DEFAULT_MAX_MESSAGE_BYTES`, 64 MiB,
unless told otherwise): a larger one is refused as its frame header arrives, before its payload
is read, the client closes the socket with 1009 (message too big), and the read raises
:class:`MessageTooLarge`. An endpoint, hostile or broken, cannot make the client hold more.

Needs only websockets (the ``testing`` or ``cli`` extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import Any, Final, Literal, cast

import orjson
from websockets.asyncio.client import ClientConnection as AsyncConnection
from websockets.asyncio.client import connect as async_connect
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.sync.client import ClientConnection as SyncConnection
from websockets.sync.client import connect as sync_connect

from .._protocol import TERMINAL_EVENTS, encode_event

DEFAULT_PATH: Final = "/v1/responses"
#: How long closing a socket may take before it is dropped, in seconds.
CLOSE_TIMEOUT: Final = 2.0
#: The largest message the client reads, in bytes (decompressed): 64 MiB, ws_mode's own
#: ``Limits.max_message_bytes``. An answer carries what its turn made (the output, and in
#: ``response.completed`` the whole response), far less than the history a client sends in
#: one create (whole histories with screenshots), which that limit is sized for.
DEFAULT_MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
#: What one message read costs beyond its text, as :attr:`SyncSocket.received` counts it: the
#: event it decodes to (a small event's dict and strings take several times its text).
MESSAGE_OVERHEAD: Final = 512

Event = dict[str, Any]
FrameKind = Literal["binary_frame", "not_json", "not_object"]


class _Lane(enum.Enum):
    ANY = "any"


#: ``stream_id=ANY_LANE``: the first terminal event ends the turn, whatever its lane.
ANY_LANE: Final = _Lane.ANY
Lane = str | None | Literal[_Lane.ANY]


class FrameError(ValueError):
    """A frame that is not an event: binary, not JSON, or not a JSON object (``kind``)."""

    def __init__(self, kind: FrameKind, frame: str | bytes) -> None:
        self.kind: FrameKind = kind
        self.frame = frame
        what = {
            "binary_frame": "a binary frame",
            "not_json": "not JSON",
            "not_object": "not a JSON object",
        }[kind]
        super().__init__(f"the server sent an event that is {what}: {frame[:200]!r}")


class SocketClosed(ConnectionError):
    """The socket closed (or failed) before the event asked for arrived."""


class ReadLimitExceeded(Exception):
    """The socket's messages passed what the caller holds of one socket
    (:func:`check_received`): ``received`` bytes against ``limit``."""

    def __init__(self, limit: int, received: int) -> None:
        self.limit = limit
        self.received = received
        super().__init__(
            f"the server sent more than {limit} bytes of messages on one socket ({received} "
            f"bytes, each message counted with {MESSAGE_OVERHEAD} bytes for the event it "
            "decodes to)"
        )


def check_received(socket: SyncSocket | AsyncSocket, limit: int) -> None:
    """:class:`ReadLimitExceeded` once the messages ``socket`` read (:attr:`SyncSocket.received`)
    pass ``limit``. The message limit bounds one message; this bounds how much a reader that
    keeps what it reads (a checker keeping a turn's events) can be made to keep."""
    if socket.received > limit:
        raise ReadLimitExceeded(limit, socket.received)


class MessageTooLarge(SocketClosed):
    """The server sent a message larger than the client's ``max_message_bytes`` (``limit``),
    so the client closed the socket with 1009 without reading it; ``size`` is its frame's
    size when the frame's header gave it (None when it came compressed and was refused once
    its decompressed size passed the limit)."""

    def __init__(self, limit: int | None, size: int | None) -> None:
        self.limit = limit
        self.size = size
        what = "a message" if size is None else f"a message of {size} bytes"
        super().__init__(
            f"the server sent {what}, over the client's limit of {limit} bytes "
            "(max_message_bytes): the client closed the socket with 1009 without reading it"
        )


def _closed(exc: ConnectionClosed, connection: SyncConnection | AsyncConnection) -> SocketClosed:
    """What a socket's close means to the caller: :class:`MessageTooLarge` when the client
    itself closed with 1009 (websockets does, and only, when a message passes its
    ``max_size``), else :class:`SocketClosed`."""
    if exc.sent is not None and exc.sent.code == CloseCode.MESSAGE_TOO_BIG and exc.rcvd is None:
        protocol = connection.protocol
        # websockets' parser keeps what it refused: PayloadTooBig, with the frame's size.
        size = getattr(protocol.parser_exc, "size", None)
        limit = message_limit(protocol)
        return MessageTooLarge(limit, size if isinstance(size, int) else None)
    return SocketClosed(str(exc))


def _raise_too_large(exc: ConnectionClosed, connection: SyncConnection | AsyncConnection) -> None:
    """:class:`MessageTooLarge` from `exc` when the client closed the socket over a message
    past its limit; otherwise nothing (the caller raises `exc` as it is)."""
    closed = _closed(exc, connection)
    if isinstance(closed, MessageTooLarge):
        raise closed from exc


def message_limit(protocol: object) -> int | None:
    """The largest message websockets' ``protocol`` reads (None: any): its
    ``max_message_size`` in newer releases of websockets, ``max_size`` in older ones."""
    limit = getattr(protocol, "max_message_size", getattr(protocol, "max_size", None))
    return limit if isinstance(limit, int) else None


def api_base(url: str) -> str:
    """The base URL requests go under (``base + /v1/responses``): ``url`` without a trailing
    ``/``, ``/v1`` or ``/v1/responses``, so the openai SDK's ``base_url`` works too."""
    base = url.rstrip("/")
    for suffix in (DEFAULT_PATH, "/v1"):
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base


def socket_url(base_url: str, path: str = DEFAULT_PATH) -> str:
    """The WebSocket URL of ``base_url + path``: ``http``/``https`` become ``ws``/``wss``."""
    url = base_url.rstrip("/") + path
    if url.startswith("https://"):
        return "wss://" + url.removeprefix("https://")
    if url.startswith("http://"):
        return "ws://" + url.removeprefix("http://")
    return url


def decode_event(frame: str | bytes) -> Event:
    """One server event out of a text frame or an SSE ``data`` field; :class:`FrameError`
    when it is not a JSON object."""
    try:
        event = orjson.loads(frame)
    except orjson.JSONDecodeError:
        raise FrameError("not_json", frame) from None
    if not isinstance(event, dict):
        raise FrameError("not_object", frame)
    return event


def _frame_event(frame: str | bytes) -> Event:
    """The event of a frame: a text frame; :class:`FrameError` for a binary one."""
    if not isinstance(frame, str):
        raise FrameError("binary_frame", frame)
    return decode_event(frame)


def ends_turn(event: Mapping[str, Any], stream_id: Lane = ANY_LANE) -> bool:
    """Whether ``event`` is a terminal event (of lane ``stream_id``, unless ``ANY_LANE``)."""
    if event.get("type") not in TERMINAL_EVENTS:
        return False
    return stream_id is ANY_LANE or event.get("stream_id") == stream_id


def _frame(event: Mapping[str, Any] | str) -> str:
    return event if isinstance(event, str) else encode_event(dict(event))


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _options(
    headers: Mapping[str, str] | None, compression: bool, max_message_bytes: int | None
) -> dict[str, Any]:
    return {
        "additional_headers": dict(headers or {}),
        "compression": "deflate" if compression else None,
        "max_size": max_message_bytes,
        "proxy": None,
        "close_timeout": CLOSE_TIMEOUT,
    }


# ----------------------------------------------------------------------------- sync


class SyncSocket:
    """A WebSocket mode connection, blocking (``websockets.sync``); a context manager.

    ``opened`` holds the ``websockets`` context the connection was opened in, and closing the
    socket leaves it (without it, closing closes the connection itself)."""

    def __init__(
        self, connection: SyncConnection, opened: contextlib.ExitStack | None = None
    ) -> None:
        self.connection = connection
        self._opened = opened
        #: The messages read so far, their sizes plus :data:`MESSAGE_OVERHEAD` each.
        self.received = 0

    def __enter__(self) -> SyncSocket:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def send(self, event: Mapping[str, Any] | str) -> int:
        """Send one event (an object, or its JSON text) as a text frame; its size in bytes.
        :class:`MessageTooLarge` when the client had closed the socket over a message past its
        limit (a reader got there first), as :meth:`receive` says it."""
        frame = _frame(event)
        try:
            self.connection.send(frame)
        except ConnectionClosed as exc:
            _raise_too_large(exc, self.connection)
            raise
        return len(frame.encode())

    def receive(self, timeout: float | None = None) -> Event:
        """The next event; TimeoutError after ``timeout`` seconds, :class:`SocketClosed`
        (:class:`MessageTooLarge` past the client's limit), :class:`FrameError`."""
        try:
            frame = self.connection.recv(timeout=timeout)
        except ConnectionClosed as exc:
            raise _closed(exc, self.connection) from exc
        self.received += len(frame) + MESSAGE_OVERHEAD
        return _frame_event(frame)

    def iter_turn(
        self, stream_id: Lane = ANY_LANE, *, timeout: float | None = None
    ) -> Iterator[Event]:
        """Each event up to the turn's terminal one (of ``stream_id``), that one included;
        TimeoutError when the turn takes longer than ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            event = self.receive(_left(deadline))
            yield event
            if ends_turn(event, stream_id):
                return

    def receive_turn(
        self, stream_id: Lane = ANY_LANE, *, timeout: float | None = None
    ) -> list[Event]:
        """The events of :meth:`iter_turn`, as a list."""
        return list(self.iter_turn(stream_id, timeout=timeout))

    def close(self) -> None:
        if self._opened is not None:
            self._opened.close()
        else:
            self.connection.close()


def connect(
    base_url: str,
    path: str = DEFAULT_PATH,
    *,
    headers: Mapping[str, str] | None = None,
    open_timeout: float | None = 60.0,
    compression: bool = True,
    pings: bool = True,
    max_message_bytes: int | None = DEFAULT_MAX_MESSAGE_BYTES,
) -> SyncSocket:
    """Open a socket at :func:`socket_url` ``(base_url, path)``; ``pings=False`` opens it
    without keep-alive pings (as a client that never pings sees a deployment). The socket
    reads messages of at most ``max_message_bytes`` (None: any size, which lets the server
    decide how much memory the client takes); a larger one raises :class:`MessageTooLarge`.
    Raises what ``websockets.sync.client.connect`` raises (InvalidURI, InvalidHandshake,
    TimeoutError, OSError)."""
    options = _options(headers, compression, max_message_bytes)
    if not pings:
        options["ping_interval"] = None
    # websockets' sync connect() is a context manager: entered, it opens the connection, in
    # every version this supports. Its result used as the connection directly is deprecated
    # since websockets 17.1 (a DeprecationWarning at the first send or receive). Before 17,
    # entering it is typed as giving the base class of the client connection it gives.
    opened = contextlib.ExitStack()
    connection = opened.enter_context(
        sync_connect(socket_url(base_url, path), open_timeout=open_timeout, **options)
    )
    return SyncSocket(cast(SyncConnection, connection), opened)


# ----------------------------------------------------------------------------- asyncio

#: What a lane's queue gets when the socket is gone.
_CLOSED: Final[Event] = {"type": "socket.closed"}
ErrorCallback = Callable[[str, str], None]
"""Told ``(kind, detail)`` of what the demultiplexer could not hand to a lane."""


class AsyncSocket:
    """A WebSocket mode connection on asyncio (``websockets.asyncio``); an async context
    manager."""

    def __init__(self, connection: AsyncConnection) -> None:
        self.connection = connection
        #: As :attr:`SyncSocket.received`.
        self.received = 0
        self._lanes: dict[str | None, asyncio.Queue[Event]] | None = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncSocket:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def send(self, event: Mapping[str, Any] | str) -> int:
        """Send one event (an object, or its JSON text) as a text frame; its size in bytes;
        :class:`MessageTooLarge` as :meth:`SyncSocket.send` says."""
        frame = _frame(event)
        try:
            await self.connection.send(frame)
        except ConnectionClosed as exc:
            _raise_too_large(exc, self.connection)
            raise
        return len(frame.encode())

    async def receive_frame(self) -> str | bytes:
        """The next frame as it came, undecoded; :class:`SocketClosed`
        (:class:`MessageTooLarge` past the client's limit)."""
        try:
            frame = await self.connection.recv()
        except ConnectionClosed as exc:
            raise _closed(exc, self.connection) from exc
        self.received += len(frame) + MESSAGE_OVERHEAD
        return frame

    async def receive(self) -> Event:
        """The next event (of the socket, not of a lane); like :meth:`SyncSocket.receive`.
        Bound the wait with ``asyncio.timeout``, here as in the other methods."""
        return _frame_event(await self.receive_frame())

    async def iter_turn(self, stream_id: Lane = ANY_LANE) -> AsyncIterator[Event]:
        """Like :meth:`SyncSocket.iter_turn`. Once :meth:`demultiplex` runs, only the events
        of lane ``stream_id`` come, from its queue."""
        while True:
            if self._lanes is None:
                event = await self.receive()
            else:
                event = await self._lanes[None if stream_id is ANY_LANE else stream_id].get()
                if event is _CLOSED:
                    raise SocketClosed("the socket closed during the turn")
            yield event
            if ends_turn(event, stream_id):
                return

    async def receive_turn(self, stream_id: Lane = ANY_LANE) -> list[Event]:
        """The events of :meth:`iter_turn`, as a list."""
        return [event async for event in self.iter_turn(stream_id)]

    def demultiplex(self, lanes: Iterable[str | None], on_error: ErrorCallback) -> None:
        """Read the socket in a task from now on, handing each event to the queue of its
        ``stream_id`` (None: the default lane), so concurrent turns on different lanes each
        read their own. What fits no lane goes to ``on_error``: ``binary_frame``, ``not_json``,
        ``not_object``, ``unknown_stream_id``, ``message_too_large`` (a message past the
        client's limit, :class:`MessageTooLarge`), ``socket:<exception>``."""
        self._lanes = {lane: asyncio.Queue() for lane in lanes}
        self._reader = asyncio.create_task(self._read(self._lanes, on_error))

    async def _read(
        self, queues: dict[str | None, asyncio.Queue[Event]], on_error: ErrorCallback
    ) -> None:
        try:
            async for frame in self.connection:
                self.received += len(frame) + MESSAGE_OVERHEAD
                try:
                    event = _frame_event(frame)
                except FrameError as exc:
                    on_error(exc.kind, str(exc))
                    continue
                queue = queues.get(event.get("stream_id"))
                if queue is None:
                    on_error("unknown_stream_id", repr(frame[:200]))
                    continue
                queue.put_nowait(event)
        except ConnectionClosed as exc:
            closed = _closed(exc, self.connection)
            if isinstance(closed, MessageTooLarge):
                on_error("message_too_large", str(closed))
            else:
                on_error(f"socket:{type(exc).__name__}", str(exc))
        except Exception as exc:  # the connection failed: each waiting lane hears it below
            on_error(f"socket:{type(exc).__name__}", str(exc))
        finally:
            # The socket is gone: a lane still waiting for its turn's end learns it at once.
            for queue in queues.values():
                queue.put_nowait(_CLOSED)

    async def close(self) -> None:
        """Stop the demultiplexer, if any, and close the socket."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        with contextlib.suppress(Exception):
            await self.connection.close()


async def connect_async(
    base_url: str,
    path: str = DEFAULT_PATH,
    *,
    headers: Mapping[str, str] | None = None,
    open_timeout: float | None = 60.0,
    compression: bool = True,
    max_message_bytes: int | None = DEFAULT_MAX_MESSAGE_BYTES,
) -> AsyncSocket:
    """Open a socket at :func:`socket_url` ``(base_url, path)``, like :func:`connect`
    (``max_message_bytes`` too)."""
    options = _options(headers, compression, max_message_bytes)
    connection = await async_connect(
        socket_url(base_url, path), open_timeout=open_timeout, **options
    )
    return AsyncSocket(connection)
