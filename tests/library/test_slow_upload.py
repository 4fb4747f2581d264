"""A client uploading a message larger than its link carries within the server's ping timeout
is not closed by the server's keepalive: its pong waits behind the message on the wire (a frame
is not cut for a control frame), and ws_mode's protocol waits on while the client's bytes keep
coming. uvicorn's own protocol closes it with 1011 ("keepalive ping timeout") after the ping
interval and timeout (20 + 20 s by default; three tries of one gateway's users over a slow link).

A raw client over a plain TCP socket (a library would answer the ping between frames or buffer
the frame whole): the handshake, then one `response.create` of 1.5 MiB in one frame, written at
about 600 KiB/s, against pings every 0.2 s with a 1 s timeout (the defaults scaled down),
then every frame read until the response's terminal event or a close."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time
from typing import Any

import pytest

from tests.servers import serve
from ws_mode import WebSocketModeMiddleware
from ws_mode.toolkit.reference import create_app

SIZE = 1536 * 1024
CHUNK = 32 * 1024
PAUSE = 0.05  # about 640 KiB/s: the upload takes 2.4 s, twice uvicorn's interval and timeout
PINGS = {"ws_ping_interval": 0.2, "ws_ping_timeout": 1.0}
PROTOCOLS = {
    "ws_mode.server:BatchingWebSocketProtocol": "completed",
    "websockets-sansio": "closed 1011",  # uvicorn's own, what the fix is measured against
}


def handshake(sock: socket.socket, port: int) -> None:
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 101"), answer


def masked_frame_header(opcode: int, length: int, mask: bytes) -> bytes:
    first = bytes([0x80 | opcode])
    if length < 126:
        return first + bytes([0x80 | length]) + mask
    if length < 1 << 16:
        return first + bytes([0x80 | 126]) + struct.pack("!H", length) + mask
    return first + bytes([0x80 | 127]) + struct.pack("!Q", length) + mask


def masked(payload: bytes, mask: bytes, offset: int = 0) -> bytes:
    return bytes(byte ^ mask[(offset + index) % 4] for index, byte in enumerate(payload))


def read_frames(sock: socket.socket, deadline: float) -> tuple[list[dict[str, Any]], str]:
    """Server frames until a terminal event or a close; pings answered."""
    events: list[dict[str, Any]] = []
    buffer = b""
    while time.monotonic() < deadline:
        while len(buffer) < 2 or len(buffer) < _frame_length(buffer):
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return events, "dropped"
            if not chunk:
                return events, "dropped"
            buffer += chunk
        length = _frame_length(buffer)
        frame, buffer = buffer[:length], buffer[length:]
        opcode, payload = frame[0] & 0x0F, frame[length - _payload_length(frame) :]
        if opcode == 0x9:  # ping: pong
            mask = os.urandom(4)
            try:
                sock.sendall(masked_frame_header(0xA, len(payload), mask) + masked(payload, mask))
            except (BrokenPipeError, ConnectionResetError):
                return events, "dropped"
        elif opcode == 0x8:
            return events, f"closed {struct.unpack('!H', payload[:2])[0]}"
        elif opcode == 0x1:
            event = json.loads(payload)
            events.append(event)
            if event["type"] in ("response.completed", "response.failed", "error"):
                return events, event["type"].removeprefix("response.")
    return events, "timed out"


def _payload_length(frame: bytes) -> int:
    short = frame[1] & 0x7F
    if short == 126:
        return int(struct.unpack("!H", frame[2:4])[0])
    if short == 127:
        return int(struct.unpack("!Q", frame[2:10])[0])
    return short


def _frame_length(buffer: bytes) -> int:
    short = buffer[1] & 0x7F
    header = 2 + (2 if short == 126 else 8 if short == 127 else 0)
    if len(buffer) < header:
        return header + 1
    return header + _payload_length(buffer)


@pytest.mark.parametrize(("protocol", "outcome"), PROTOCOLS.items())
def test_a_slow_large_upload_outlives_the_servers_pings(protocol: str, outcome: str) -> None:
    app = WebSocketModeMiddleware(create_app())
    with serve(app, ws=protocol, **PINGS) as base:
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            handshake(sock, port)
            padding = "x" * SIZE
            item = {"role": "user", "content": padding}
            body = json.dumps({"type": "response.create", "model": "m", "input": [item]}).encode()
            mask = os.urandom(4)
            payload = masked(body, mask)  # before the clock starts: the loop only writes
            sock.sendall(masked_frame_header(0x1, len(body), mask))
            closed_early = False
            for offset in range(0, len(payload), CHUNK):
                try:
                    sock.sendall(payload[offset : offset + CHUNK])
                except (BrokenPipeError, ConnectionResetError):
                    closed_early = True
                    break
                time.sleep(PAUSE)
            events, ended = read_frames(sock, time.monotonic() + 30)
    if outcome == "completed":
        assert not closed_early
        assert ended == "completed", (ended, events[-1:] if events else None)
    else:
        assert ended in (outcome, "dropped"), ended
