"""`ws_mode.server.BatchingWebSocketProtocol`: uvicorn's websockets-sansio with batched writes."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import logging
import os
import random
import socket
import struct
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.extensions.base import Extension
from websockets.extensions.permessage_deflate import (
    PerMessageDeflate,
)
from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.server import ServerProtocol
from websockets.streams import StreamReader
from websockets.typing import ExtensionName

from tests.servers import serve
from ws_mode import WebSocketModeMiddleware
from ws_mode._batching import FLUSH_BYTES, BatchingTransport, data_frame
from ws_mode.server import BatchingWebSocketProtocol
from ws_mode.testing._client import connect
from ws_mode.toolkit.bench.in_process import uvicorn_deflate
from ws_mode.toolkit.reference import ReferenceConfig, create_app


class RecordingTransport:
    """What a transport was asked to do, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True
        self.calls.append(("close", None))

    def abort(self) -> None:
        self.closing = True
        self.calls.append(("abort", None))

    def write_eof(self) -> None:
        self.calls.append(("write_eof", None))

    def get_write_buffer_size(self) -> int:
        return 7

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


async def _batching() -> tuple[BatchingTransport, RecordingTransport]:
    real = RecordingTransport()
    return BatchingTransport(real, asyncio.get_running_loop()), real  # type: ignore[arg-type]


async def _next_pass() -> None:
    await asyncio.sleep(0)


def test_writes_of_one_pass_go_out_as_one_in_order() -> None:
    async def scenario() -> list[tuple[str, Any]]:
        batching, real = await _batching()
        batching.write(b"one ")
        batching.write(bytearray(b"two "))
        batching.writelines([b"three ", memoryview(b"four")])
        batching.write(b"")
        assert real.calls == []  # nothing written until the pass ends
        assert batching.get_write_buffer_size() == len(b"one two three four") + 7
        await _next_pass()
        batching.write(b"five")
        await _next_pass()
        return real.calls

    calls = asyncio.run(scenario())
    assert calls == [("write", b"one two three four"), ("write", b"five")]


def test_close_writes_what_is_kept_first_and_abort_drops_it() -> None:
    async def scenario() -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
        closed, closed_real = await _batching()
        closed.write(b"close frame")
        closed.close()
        aborted, aborted_real = await _batching()
        aborted.write(b"never sent")
        aborted.abort()
        await _next_pass()  # the scheduled flushes find nothing left
        return closed_real.calls, aborted_real.calls

    closed, aborted = asyncio.run(scenario())
    assert closed == [("write", b"close frame"), ("close", None)]
    assert aborted == [("abort", None)]


def test_a_long_burst_is_written_without_waiting_for_the_end_of_the_pass() -> None:
    async def scenario() -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
        batching, real = await _batching()
        half = b"x" * (FLUSH_BYTES // 2)
        batching.write(half)
        batching.write(half)  # FLUSH_BYTES kept: written now, where flow control sees them
        within_the_pass = list(real.calls)
        batching.write(b"tail")
        batching.write_eof()  # what is kept goes before the end of the writing side
        await _next_pass()
        return within_the_pass, real.calls

    within_the_pass, calls = asyncio.run(scenario())
    burst = ("write", b"x" * (FLUSH_BYTES // 2 * 2))
    assert within_the_pass == [burst]
    assert calls == [burst, ("write", b"tail"), ("write_eof", None)]


def test_nothing_is_written_to_a_closing_transport_and_the_rest_is_the_transports() -> None:
    async def scenario() -> tuple[list[tuple[str, Any]], str]:
        batching, real = await _batching()
        batching.write(b"late")
        real.closing = True
        await _next_pass()
        info: str = batching.get_extra_info("peername")
        return real.calls, info

    calls, info = asyncio.run(scenario())
    assert calls == []
    assert info == "info:peername"


@pytest.mark.parametrize("deflate", [True, False], ids=["deflate", "plain"])
def test_a_rollout_over_the_batched_protocol(deflate: bool) -> None:
    app = WebSocketModeMiddleware(create_app(ReferenceConfig(tool_calls=2, answer_tokens=5)))
    options: dict[str, Any] = {"ws": "ws_mode.server:BatchingWebSocketProtocol"}
    with (
        serve(app, lifetime=60, ws_per_message_deflate=deflate, **options) as base_url,
        connect(base_url, "/v1/responses", open_timeout=30) as socket,
    ):
        previous: str | None = None
        kinds: list[list[str]] = []
        for _ in range(3):
            event: dict[str, Any] = {
                "type": "response.create",
                "model": "reference",
                "input": [{"role": "user", "content": "x" * 5000}],
            }
            if previous is not None:
                event["previous_response_id"] = previous
            socket.send(event)
            events = socket.receive_turn(timeout=30)
            kinds.append([e["type"] for e in events])
            numbers = [e["sequence_number"] for e in events]
            assert numbers == sorted(numbers)
            previous = events[-1]["response"]["id"]
    for turn in kinds:
        assert turn[0] == "response.created"
        assert turn[-1] == "response.completed"
    assert all("response.function_call_arguments.done" in turn for turn in kinds)


# ----------------------------------------------------------------------------- framing
# BatchingWebSocketProtocol frames the application's messages itself and compresses only those
# of at least `deflate_threshold` bytes. A real uvicorn server on loopback, real clients.

THRESHOLD = BatchingWebSocketProtocol.deflate_threshold
_random = random.Random(7692)

#: What the app sends on "burst", in order: around the threshold (by UTF-8 bytes: the é's
#: are two bytes each), around the frame header's length boundaries, large text and binary
#: (over 64 KiB and over 1 MiB, compressible and not), empty messages.
BURST: list[str | bytes] = [
    "",
    b"",
    '{"type":"response.function_call_arguments.delta","delta":"{\\"step\\": 1"}',
    "a" * (THRESHOLD - 1),
    "a" * THRESHOLD,
    "é" * (THRESHOLD // 2 - 1) + "a",  # THRESHOLD - 1 bytes, fewer characters
    "é" * (THRESHOLD // 2),  # THRESHOLD bytes in THRESHOLD / 2 characters
    "日本語のテキスト🙂" * 40,
    b"\x00\xff" * (THRESHOLD // 2 - 1),
    bytes(range(256)) * (THRESHOLD // 256 + 1),
    "b" * 125,
    "b" * 126,
    "c" * 65535,
    "c" * 65536,
    "".join(chr(0x20 + _random.randrange(0x3000)) for _ in range(40_000)),  # > 64 KiB
    _random.randbytes(70 * 1024),  # incompressible: stays > 64 KiB compressed
    ("response.output_text.delta " * 60_000),  # > 1 MiB
    _random.randbytes(1_200_000),
    "the end",
]


def _asgi_message(message: str | bytes) -> dict[str, Any]:
    if isinstance(message, bytes):
        return {"type": "websocket.send", "bytes": message}
    return {"type": "websocket.send", "text": message}


def _framing_app(outcomes: list[str]) -> Any:
    """Sends BURST on "burst", closes with 4000 on "close", echoes anything else; records what
    a send raises after the close (its own, or the client's) in ``outcomes``."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "websocket"
        await receive()
        await send({"type": "websocket.accept"})
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                try:
                    await send(_asgi_message("late"))
                except Exception as exc:
                    outcomes.append(type(exc).__name__)
                return
            if message.get("text") == "burst":
                for each in BURST:
                    await send(_asgi_message(each))
            elif message.get("text") == "close":
                await send({"type": "websocket.close", "code": 4000, "reason": "done"})
                try:
                    await send(_asgi_message("after close"))
                except RuntimeError as exc:
                    outcomes.append(type(exc).__name__)
                return
            else:
                await send(message | {"type": "websocket.send"})

    return app


@contextlib.contextmanager
def _framing_server(
    outcomes: list[str],
    protocol: type[BatchingWebSocketProtocol] = BatchingWebSocketProtocol,
    deflate: bool = True,
) -> Iterator[str]:
    # Server pings every 10 ms, so that uvicorn's pings (and the client's pongs) fall between
    # the data frames framed here.
    options: dict[str, Any] = {"ws": protocol, "ws_ping_interval": 0.01, "ws_ping_timeout": 5.0}
    with serve(
        _framing_app(outcomes), lifetime=60, ws_per_message_deflate=deflate, **options
    ) as base_url:
        yield base_url.replace("http://", "ws://")


async def _receive_burst(socket: Any, ping_at: int) -> list[str | bytes]:
    received: list[str | bytes] = []
    pong = None
    for index in range(len(BURST)):
        if index == ping_at:
            pong = await socket.ping()  # a ping from the client mid-burst
        received.append(await socket.recv())
    if pong is not None:
        await asyncio.wait_for(pong, 10)
    return received


@pytest.mark.parametrize("compression", ["deflate", None], ids=["client-deflate", "client-plain"])
@pytest.mark.parametrize("deflate", [True, False], ids=["server-deflate", "server-plain"])
def test_the_client_reads_exactly_what_the_app_sent(compression: str | None, deflate: bool) -> None:
    from websockets.asyncio.client import connect as ws_connect
    from websockets.exceptions import ConnectionClosed

    outcomes: list[str] = []

    async def scenario() -> tuple[list[list[str | bytes]], list[str | bytes], int | None, str]:
        async with ws_connect(
            url, compression=compression, max_size=None, ping_interval=None
        ) as socket:
            negotiated = socket.response.headers.get("Sec-WebSocket-Extensions", "")
            bursts = []
            for ping_at in (0, len(BURST) // 2, len(BURST)):
                await socket.send("burst")
                bursts.append(await _receive_burst(socket, ping_at))
            echoed = []
            for each in BURST:  # what the client sends, compressed or not, read back
                await socket.send(each)
                echoed.append(await socket.recv())
            await socket.send("close")
            with pytest.raises(ConnectionClosed):
                await socket.recv()
            return bursts, echoed, socket.close_code, negotiated

    with _framing_server(outcomes, deflate=deflate) as url:
        bursts, echoed, close_code, negotiated = asyncio.run(scenario())
    assert ("permessage-deflate" in negotiated) == (deflate and compression is not None)
    assert all(burst == BURST for burst in bursts)
    assert echoed == BURST
    assert close_code == 4000
    assert outcomes == ["RuntimeError"]  # uvicorn's: no message after the app's close


def test_a_send_after_the_client_closed_raises_client_disconnected() -> None:
    from websockets.asyncio.client import connect as ws_connect

    outcomes: list[str] = []

    async def scenario() -> None:
        async with ws_connect(url, ping_interval=None) as socket:
            await socket.send("echo")
            assert await socket.recv() == "echo"

    with _framing_server(outcomes) as url:
        asyncio.run(scenario())
        for _ in range(1000):  # the app's task runs on the server's thread
            if outcomes:
                break
            time.sleep(0.01)
    assert outcomes == ["ClientDisconnected"]


# A client of raw bytes, to see each frame's RSV1 bit (websockets' clients clear it before
# anything else sees the frame).


def _read_exactly(sock: socket.socket, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        data += chunk
    return bytes(data)


def _raw_burst(url: str, offer_deflate: bool) -> tuple[list[tuple[bool, int, bytes]], str]:
    """Send "burst" from a raw socket; each data frame of the answer as (RSV1, opcode, payload)
    (pings and pongs skipped), and the extensions the server accepted."""
    host, port = url.removeprefix("ws://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        extension = "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
        request = (
            f"GET /raw HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\n"
            f"{extension if offer_deflate else ''}\r\n"
        )
        sock.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += _read_exactly(sock, 1)
        assert head.startswith(b"HTTP/1.1 101")
        accepted = [
            line.split(b":", 1)[1].strip().decode()
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"sec-websocket-extensions:")
        ]
        mask = os.urandom(4)
        payload = bytes(byte ^ mask[index % 4] for index, byte in enumerate(b"burst"))
        sock.sendall(bytes((0x81, 0x80 | len(payload))) + mask + payload)
        frames: list[tuple[bool, int, bytes]] = []
        while len(frames) < len(BURST):
            first, second = _read_exactly(sock, 2)
            length = second & 0x7F
            if length == 126:
                (length,) = struct.unpack("!H", _read_exactly(sock, 2))
            elif length == 127:
                (length,) = struct.unpack("!Q", _read_exactly(sock, 8))
            assert not second & 0x80  # a server's frames are never masked
            data = _read_exactly(sock, length)
            assert first & 0x80  # FIN: each message in one frame
            if first & 0x0F in (0x1, 0x2):
                frames.append((bool(first & 0x40), first & 0x0F, data))
        return frames, ", ".join(accepted)


def _inflated(frames: list[tuple[bool, int, bytes]]) -> list[str | bytes]:
    """The messages of ``frames``, as a client keeping the compression context reads them."""
    decoder = zlib.decompressobj(wbits=-15)
    messages: list[str | bytes] = []
    for rsv1, opcode, data in frames:
        payload = decoder.decompress(data + b"\x00\x00\xff\xff") if rsv1 else data
        messages.append(payload.decode() if opcode == 0x1 else payload)
    return messages


def _expected_rsv1(threshold: int) -> list[bool]:
    return [len(each.encode() if isinstance(each, str) else each) >= threshold for each in BURST]


def test_only_messages_of_at_least_the_threshold_are_compressed() -> None:
    with _framing_server([]) as url:
        frames, accepted = _raw_burst(url, offer_deflate=True)
    assert accepted.startswith("permessage-deflate")
    assert [rsv1 for rsv1, _, _ in frames] == _expected_rsv1(THRESHOLD)
    # Some of each, around the threshold by UTF-8 bytes, not by characters.
    assert [rsv1 for rsv1, _, _ in frames[3:7]] == [False, True, False, True]
    assert [opcode for _, opcode, _ in frames] == [
        0x2 if isinstance(each, bytes) else 0x1 for each in BURST
    ]
    assert _inflated(frames) == BURST


class CompressEverything(BatchingWebSocketProtocol):
    deflate_threshold = 0


class CompressNothing(BatchingWebSocketProtocol):
    deflate_threshold = 1 << 62


@pytest.mark.parametrize("protocol", [CompressEverything, CompressNothing])
def test_the_threshold_is_a_class_attribute(protocol: type[BatchingWebSocketProtocol]) -> None:
    with _framing_server([], protocol) as url:
        frames, _ = _raw_burst(url, offer_deflate=True)
    assert [rsv1 for rsv1, _, _ in frames] == _expected_rsv1(protocol.deflate_threshold)
    assert _inflated(frames) == BURST


def test_nothing_is_compressed_when_deflate_is_not_negotiated() -> None:
    with _framing_server([], CompressEverything) as url:
        frames, accepted = _raw_burst(url, offer_deflate=False)
    assert accepted == ""
    assert not any(rsv1 for rsv1, _, _ in frames)
    assert _inflated(frames) == BURST
    with _framing_server([], CompressEverything, deflate=False) as url:
        frames, accepted = _raw_burst(url, offer_deflate=True)
    assert accepted == ""
    assert not any(rsv1 for rsv1, _, _ in frames)


# data_frame against websockets' own framing, byte for byte.


def _negotiated(offer: str) -> ServerProtocol:
    """A websockets server after the handshake, with uvicorn's permessage-deflate settings, the
    client having offered ``offer`` ('' for no extension)."""
    server = ServerProtocol(extensions=[uvicorn_deflate()])
    headers = (
        "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        + (f"Sec-WebSocket-Extensions: {offer}\r\n" if offer else "")
        + "\r\n"
    )
    server.receive_data(headers.encode())
    (request,) = server.events_received()
    assert isinstance(request, Request)
    server.send_response(server.accept(request))
    server.data_to_send()
    return server


@pytest.mark.parametrize(
    "offer",
    [
        "",
        "permessage-deflate; client_max_window_bits",
        "permessage-deflate; server_no_context_takeover",
        "permessage-deflate; server_max_window_bits=9",
    ],
    ids=["none", "deflate", "no-context-takeover", "window-9"],
)
def test_data_frame_at_threshold_0_is_websockets_framing(offer: str) -> None:
    """Compressing every message, the frames are websockets' byte for byte: the same
    compressor, in the same state, with the negotiated settings."""
    ours, theirs = _negotiated(offer), _negotiated(offer)
    extensions = ours.extensions
    deflate = extensions[0] if extensions else None
    assert deflate is None or isinstance(deflate, PerMessageDeflate)
    for each in BURST:
        if isinstance(each, bytes):
            theirs.send_binary(each)
            frame = data_frame(each, text=False, deflate=deflate, threshold=0)
        else:
            theirs.send_text(each.encode())
            frame = data_frame(each.encode(), text=True, deflate=deflate, threshold=0)
        assert frame == b"".join(theirs.data_to_send())


def test_skipped_messages_keep_the_peers_decompressor_in_step() -> None:
    """Messages left uncompressed between compressed ones, read by websockets' client-side
    extension (what websockets' and the openai SDK's clients use)."""
    server = _negotiated("permessage-deflate; client_max_window_bits")
    (deflate,) = server.extensions
    assert isinstance(deflate, PerMessageDeflate)
    client = PerMessageDeflate(False, False, deflate.local_max_window_bits, 12)
    messages = [each.encode() if isinstance(each, str) else each for each in BURST] * 2
    for message in messages:
        frame = data_frame(message, text=False, deflate=deflate, threshold=THRESHOLD)
        assert bool(frame[0] & 0x40) == (len(message) >= THRESHOLD)
        assert _parse_frame(frame, client).data == message


def _parse_frame(data: bytes, extension: PerMessageDeflate) -> Frame:
    """The one whole frame ``data`` holds, parsed and decoded by websockets."""
    reader = StreamReader()
    reader.feed_data(data)
    parser = Frame.parse(reader.read_exact, mask=False, max_size=None, extensions=[extension])
    with pytest.raises(StopIteration) as stop:
        next(parser)
    assert not reader.buffer
    frame: Frame = stop.value.value
    return frame


# The protocol driven by hand (no socket): the branches a real client does not reach.


class _SocketlessTransport(RecordingTransport):
    """A transport with no socket behind it, as uvicorn's protocol asks of one."""

    def get_extra_info(self, name: str) -> None:  # type: ignore[override]
        return None

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _accepted_protocol(offer: str) -> tuple[BatchingWebSocketProtocol, _SocketlessTransport]:
    """A protocol whose app accepted a client that offered ``offer``; what it wrote so far is
    cleared."""
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        await receive()  # until the test ends the connection

    config = Config(app, ws=BatchingWebSocketProtocol, log_config=None, ws_ping_interval=None)
    config.load()
    protocol = BatchingWebSocketProtocol(config, ServerState(), {}, asyncio.get_running_loop())
    real = _SocketlessTransport()
    protocol.connection_made(real)  # type: ignore[arg-type]
    protocol.data_received(
        (
            "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            + (f"Sec-WebSocket-Extensions: {offer}\r\n" if offer else "")
            + "\r\n"
        ).encode()
    )
    for _ in range(100):
        await _next_pass()
        if protocol.handshake_complete:
            break
    await _next_pass()
    assert real.calls[0][1].startswith(b"HTTP/1.1 101")
    real.calls.clear()
    return protocol, real


def _written(real: RecordingTransport) -> bytes:
    return b"".join(data for call, data in real.calls if call == "write")


def _end(protocol: BatchingWebSocketProtocol) -> None:
    protocol.connection_lost(None)


def test_frames_websockets_queued_go_first_and_debug_logs_each_frame() -> None:
    async def scenario() -> tuple[bytes, list[str]]:
        protocol, real = await _accepted_protocol("")
        protocol.conn.send_ping(b"queued")  # queued in websockets, not yet written
        records: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
        logger = logging.getLogger("tests.batching.frames")
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        protocol.conn.logger, protocol.conn.debug = logger, True
        await protocol.send({"type": "websocket.send", "text": "hello"})
        await protocol.send({"type": "websocket.send"})  # neither text nor bytes: no frame
        await _next_pass()
        _end(protocol)
        return _written(real), records

    written, records = asyncio.run(scenario())
    assert written == b"\x89\x06queued" + b"\x81\x05hello"
    assert records == ["> TEXT 'hello' [5 bytes]"]


def test_flow_control_holds_the_send_until_the_transport_resumes() -> None:
    async def scenario() -> tuple[bool, bytes, bytes]:
        protocol, real = await _accepted_protocol("")
        protocol.pause_writing()
        sending = asyncio.create_task(protocol.send({"type": "websocket.send", "bytes": b"hi"}))
        for _ in range(3):
            await _next_pass()
        held, before = not sending.done(), _written(real)
        protocol.resume_writing()
        await sending
        await _next_pass()
        _end(protocol)
        return held, before, _written(real)

    held, before, after = asyncio.run(scenario())
    assert held
    assert before == b""
    assert after == b"\x82\x02hi"


def test_a_send_once_the_client_closed_is_uvicorns_client_disconnected() -> None:
    from uvicorn.protocols.utils import ClientDisconnected

    async def scenario() -> bytes:
        protocol, real = await _accepted_protocol("permessage-deflate")
        mask = b"\x01\x02\x03\x04"
        code = bytes(byte ^ mask[index] for index, byte in enumerate(b"\x03\xe8"))
        protocol.data_received(b"\x88\x82" + mask + code)  # the client's close, 1000
        with pytest.raises(ClientDisconnected):
            await protocol.send({"type": "websocket.send", "text": "x" * 1000})
        await _next_pass()
        _end(protocol)
        return _written(real)

    assert asyncio.run(scenario()) == b"\x88\x02\x03\xe8"  # uvicorn's close reply, only


class _Shouting(Extension):
    """An extension websockets applies to data frames (upper-casing them)."""

    name = ExtensionName("x-shouting")

    def decode(self, frame: Frame, *, max_size: int | None = None) -> Frame:
        return frame

    def encode(self, frame: Frame) -> Frame:
        if frame.opcode is Opcode.TEXT:
            return dataclasses.replace(frame, data=bytes(frame.data).upper())
        return frame


def test_an_extension_other_than_deflate_leaves_the_framing_to_websockets() -> None:
    async def scenario() -> bytes:
        protocol, real = await _accepted_protocol("")
        protocol.conn.extensions = [_Shouting()]
        await protocol.send({"type": "websocket.send", "text": "quiet"})
        await _next_pass()
        _end(protocol)
        return _written(real)

    assert asyncio.run(scenario()) == b"\x81\x05QUIET"
