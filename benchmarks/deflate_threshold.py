"""What compressing a turn's frames costs and saves, per size threshold.

A WebSocket-mode turn is a burst of small events (``response.output_item.added``, argument
deltas of 100 to 200 bytes) and one or two large ones (``response.output_item.done`` and
``response.completed`` carry whole items). permessage-deflate lets a server leave any message
uncompressed (RFC 7692); :class:`ws_mode.server.BatchingWebSocketProtocol` compresses only the
messages of at least its ``deflate_threshold`` bytes. This benchmark chooses that threshold::

    python -m benchmarks.deflate_threshold
    python -m benchmarks.deflate_threshold --thresholds 0 256 1024 --repeat 50

It records the frames of real chains in this process: the load bench's server app
(:func:`benchmarks.server.build_load_app`, the reference model behind the middleware)
driven through the ASGI interface, one socket running ``--turns``-turn tool-call chains with
``--tool-output-bytes`` tool outputs (the load bench's defaults), in the drop-in and the
cache-aware modes. Then it frames every message of a chain in order, over a fresh negotiation
each time (websockets' server and client, with uvicorn's permessage-deflate settings), and
reports per chain: the bytes on the wire, how many messages were compressed, and the CPU per
frame (the median of ``--repeat`` runs), for websockets' own framing (``ServerProtocol.send_text``
and ``data_to_send``, what uvicorn's protocol does), framing without deflate, and
:func:`ws_mode._batching.data_frame` at each threshold. A websockets client reads back every
chain framed at each threshold, which must give the messages sent.

The other way, what the server spends reading a client's frames: the same messages compressed
by a websockets client (every message, as websockets and the openai SDK send them) and parsed by
websockets' server parser, inflated by websockets' own permessage-deflate and by
:class:`ws_mode._batching.BudgetedInflate` (inflating in budgeted steps, what
``BatchingWebSocketProtocol`` installs), interleaved, the CPU per frame the median of
``--repeat`` runs (``measure_reading``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson
from starlette.types import Message
from websockets.client import ClientProtocol
from websockets.extensions.permessage_deflate import (
    ClientPerMessageDeflateFactory,
    PerMessageDeflate,
)
from websockets.frames import Frame
from websockets.http11 import Request
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from ws_mode._batching import BatchingWebSocketProtocol, BudgetedInflate, data_frame
from ws_mode.toolkit.bench.in_process import socket_scope, uvicorn_deflate

__all__ = ["DEFAULT_THRESHOLDS", "Row", "main", "measure", "measure_reading", "record_chain"]

#: The thresholds measured by default, in bytes.
DEFAULT_THRESHOLDS: Final = (0, 64, 128, 256, 512, 1024, 2048)


async def _record(full_context: str, turns: int, tool_output_bytes: int) -> list[str]:
    from benchmarks.load import chains, server

    spec = {
        "turns": turns,
        "tokens_per_second": 0.0,
        "full_context": full_context,
        "connections": 1,
        "max_cached_bytes": 8 * 1024 * 1024,
        "max_cached_responses": 512,
    }
    app = server.build_load_app(spec)
    incoming: asyncio.Queue[Message] = asyncio.Queue()
    sent: list[str] = []
    turn_done: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def receive() -> Message:
        return await incoming.get()

    async def send(message: Message) -> None:
        if message["type"] != "websocket.send":
            return
        text: str = message["text"]
        sent.append(text)
        event = orjson.loads(text)
        if event["type"] in ("response.completed", "response.failed", "error"):
            turn_done.put_nowait(event)

    scope = socket_scope(server.SOCKET_PATH)
    incoming.put_nowait({"type": "websocket.connect"})

    async def serve() -> None:
        await app(scope, receive, send)

    task = asyncio.create_task(serve())
    previous: str | None = None
    new_input = chains.first_input(0)
    for step in range(turns):
        create: dict[str, Any] = {
            "type": "response.create",
            "model": "reference",
            "input": new_input,
            "tools": [chains.TOOL],
            "instructions": chains.INSTRUCTIONS,
        }
        if previous is not None:
            create["previous_response_id"] = previous
        incoming.put_nowait({"type": "websocket.receive", "text": orjson.dumps(create).decode()})
        event = await asyncio.wait_for(turn_done.get(), 30)
        if event["type"] != "response.completed":
            raise RuntimeError(f"the reference turn failed: {event}")
        response = event["response"]
        previous = response["id"]
        call = response["output"][0]
        if call.get("type") == "function_call":
            new_input = [
                {
                    "type": "function_call_output",
                    "call_id": call["call_id"],
                    "output": chains.tool_output(0, step + 1, tool_output_bytes),
                }
            ]
    incoming.put_nowait({"type": "websocket.disconnect", "code": 1000})
    await asyncio.wait_for(task, 30)
    return sent


def record_chain(full_context: str, turns: int, tool_output_bytes: int) -> list[bytes]:
    """The messages (UTF-8) one socket receives running one tool-call chain of ``turns``
    turns against the load bench's server app, in order."""
    texts = asyncio.run(_record(full_context, turns, tool_output_bytes))
    return [text.encode() for text in texts]


def _negotiated() -> tuple[ServerProtocol, ClientProtocol]:
    """A server and a client after the opening handshake, permessage-deflate negotiated as
    uvicorn's websockets-sansio protocol and a default websockets client negotiate it."""
    server = ServerProtocol(extensions=[uvicorn_deflate()])
    client = ClientProtocol(
        parse_uri("ws://127.0.0.1/v1/responses"),
        extensions=[ClientPerMessageDeflateFactory(client_max_window_bits=True)],
    )
    client.send_request(client.connect())
    for data in client.data_to_send():
        server.receive_data(data)
    (request,) = server.events_received()
    assert isinstance(request, Request)
    server.send_response(server.accept(request))
    for data in server.data_to_send():
        client.receive_data(data)
    client.events_received()
    return server, client


def _deflate_of(server: ServerProtocol) -> PerMessageDeflate:
    (extension,) = server.extensions
    assert isinstance(extension, PerMessageDeflate)
    return extension


Framer = Callable[[list[bytes]], list[bytes]]


def _websockets_framer(deflate: bool) -> Framer:
    def frame(messages: list[bytes]) -> list[bytes]:
        server, _ = _negotiated()
        if not deflate:
            server.extensions = []
        out: list[bytes] = []
        for message in messages:
            server.send_text(message)
            out.extend(server.data_to_send())
        return out

    return frame


def _direct_framer(threshold: int | None) -> Framer:
    def frame(messages: list[bytes]) -> list[bytes]:
        server, _ = _negotiated()
        deflate = None if threshold is None else _deflate_of(server)
        limit = threshold or 0
        return [data_frame(m, text=True, deflate=deflate, threshold=limit) for m in messages]

    return frame


def _read_back(frames: list[bytes]) -> list[bytes]:
    """What a websockets client that negotiated deflate reads from ``frames``."""
    _, client = _negotiated()
    client.receive_data(b"".join(frames))
    events = client.events_received()
    return [bytes(event.data) for event in events if isinstance(event, Frame)]


@dataclass
class Row:
    """One way of framing a chain's messages."""

    name: str
    wire_bytes: int
    compressed: int
    frames: int
    cpu_per_frame: float


def _rsv1_count(frames: list[bytes]) -> int:
    return sum(1 for frame in frames if frame[0] & 0x40)


def measure(
    messages: list[bytes], thresholds: Sequence[int], repeat: int, check: bool = True
) -> list[Row]:
    """Frame ``messages`` every way, ``repeat`` times each (interleaved), and report each."""
    framers: dict[str, Framer] = {
        "websockets, deflate": _websockets_framer(True),
        "websockets, no deflate": _websockets_framer(False),
        "direct, no deflate": _direct_framer(None),
    }
    for threshold in thresholds:
        framers[f"direct, threshold {threshold}"] = _direct_framer(threshold)
    outputs = {name: framer(messages) for name, framer in framers.items()}
    if check:
        for name, frames in outputs.items():
            if "no deflate" not in name and _read_back(frames) != messages:
                raise AssertionError(f"{name}: the client read other messages back")
    times: dict[str, list[float]] = {name: [] for name in framers}
    # The negotiation is outside the timing: each run times its framing alone.
    for _ in range(repeat):
        for name in framers:
            server, _ = _negotiated()
            deflate = _deflate_of(server)
            times[name].append(_time_one(name, messages, server, deflate))
    rows = []
    for name, frames in outputs.items():
        rows.append(
            Row(
                name,
                wire_bytes=sum(len(frame) for frame in frames),
                compressed=_rsv1_count(frames),
                frames=len(frames),
                cpu_per_frame=statistics.median(times[name]) / len(messages),
            )
        )
    return rows


def _time_one(
    name: str, messages: list[bytes], server: ServerProtocol, deflate: PerMessageDeflate
) -> float:
    if name.startswith("websockets"):
        if "no deflate" in name:
            server.extensions = []
        send_text, data_to_send = server.send_text, server.data_to_send
        started = time.process_time()
        for message in messages:
            send_text(message)
            data_to_send()
        return time.process_time() - started
    threshold = 0 if "no deflate" in name else int(name.rsplit(" ", 1)[1])
    extension = None if "no deflate" in name else deflate
    started = time.process_time()
    for message in messages:
        data_frame(message, text=True, deflate=extension, threshold=threshold)
    return time.process_time() - started


#: The ways of inflating a client's frames ``measure_reading`` compares.
READERS: Final = ("websockets, inflate", "ws_mode, inflate in steps")


def _reader(name: str) -> ServerProtocol:
    server, _ = _negotiated()
    if name != READERS[0]:
        # A protocol with no budget (nothing read from uvicorn's state): the extension's own
        # path, each step held without a reservation.
        protocol = BatchingWebSocketProtocol.__new__(BatchingWebSocketProtocol)
        server.extensions = [BudgetedInflate(_deflate_of(server), protocol)]
    return server


def _read(server: ServerProtocol, wire: list[bytes]) -> list[bytes]:
    read: list[bytes] = []
    for data in wire:
        server.receive_data(data)
        read.extend(bytes(e.data) for e in server.events_received() if isinstance(e, Frame))
    return read


def measure_reading(messages: list[bytes], repeat: int) -> list[Row]:
    """Compress ``messages`` as a websockets client does, then parse them with each of
    :data:`READERS`, ``repeat`` times each (interleaved), and report each; every reader must
    read the messages back."""
    _, client = _negotiated()
    wire = []
    for message in messages:
        client.send_text(message)
        wire.append(b"".join(client.data_to_send()))
    for name in READERS:
        if _read(_reader(name), wire) != messages:
            raise AssertionError(f"{name}: the server read other messages")
    times: dict[str, list[float]] = {name: [] for name in READERS}
    for _ in range(repeat):
        for name in READERS:
            server = _reader(name)
            receive_data, events_received = server.receive_data, server.events_received
            started = time.process_time()
            for data in wire:
                receive_data(data)
                events_received()
            times[name].append(time.process_time() - started)
    wire_bytes = sum(len(data) for data in wire)
    return [
        Row(
            name,
            wire_bytes=wire_bytes,
            compressed=len(wire),
            frames=len(wire),
            cpu_per_frame=statistics.median(times[name]) / len(wire),
        )
        for name in READERS
    ]


def _sizes(messages: list[bytes]) -> str:
    sizes = sorted(len(message) for message in messages)
    return (
        f"{len(sizes)} messages, median {statistics.median(sizes):.0f} B, "
        f"largest {sizes[-1]} B, {sum(sizes)} B in all; "
        + ", ".join(
            f"{sum(1 for size in sizes if size >= t)} of at least {t} B" for t in (256, 512, 1024)
        )
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.deflate_threshold``: record, frame, report."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.deflate_threshold")
    parser.add_argument("--thresholds", type=int, nargs="+", default=list(DEFAULT_THRESHOLDS))
    parser.add_argument("--turns", type=int, default=5, help="turns per chain")
    parser.add_argument("--tool-output-bytes", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=200, help="timed runs per way of framing")
    args = parser.parse_args(argv)
    # The frames are the same in both modes (the events do not depend on how the handler got
    # its context): the drop-in one's are recorded.
    for full_context in ("always",):
        messages = record_chain(full_context, args.turns, args.tool_output_bytes)
        rows = measure(messages, args.thresholds, args.repeat)
        plain = next(row for row in rows if row.name == "websockets, no deflate")
        base = next(row for row in rows if row.name == "websockets, deflate")
        print(f"full_context={full_context}, {args.turns} turns: {_sizes(messages)}")
        print(
            f"  {'framing':26s} {'B/turn':>7s} {'/plain':>7s} {'compressed':>10s} "
            f"{'µs/frame':>9s} {'µs/turn':>8s} {'/websockets deflate':>20s}"
        )
        for row in rows:
            per_turn = row.cpu_per_frame * row.frames / args.turns
            print(
                f"  {row.name:26s} {row.wire_bytes / args.turns:7.0f} "
                f"{row.wire_bytes / plain.wire_bytes:7.2f} {row.compressed:4d} of {row.frames:3d} "
                f"{row.cpu_per_frame * 1e6:9.2f} {per_turn * 1e6:8.1f} "
                f"{row.cpu_per_frame / base.cpu_per_frame:20.2f}"
            )
        reading = measure_reading(messages, args.repeat)
        print(f"  {'reading the client':26s} {'µs/frame':>9s} {'/websockets inflate':>20s}")
        for row in reading:
            print(
                f"  {row.name:26s} {row.cpu_per_frame * 1e6:9.2f} "
                f"{row.cpu_per_frame / reading[0].cpu_per_frame:20.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
