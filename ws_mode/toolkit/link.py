"""A userspace link model: a TCP relay on loopback that adds delay and limits bandwidth.

``ws-mode bench`` runs client and server on one machine, where re-sending a long history costs
nothing. Put the relay between them (no root, no ``tc``) and a benchmark sees what a remote
client would see::

    spec = LinkSpec.parse("rtt=30ms,up=10mbit,down=50mbit")
    with link_process(spec, "http://127.0.0.1:8000") as base_url:  # http://127.0.0.1:RELAY
        run_socket(base_url, turns=25)

The model. Each direction of each connection is an independent pipe. A chunk read from one side
at time ``t`` departs at ``max(t, when the pipe is free) + len / rate`` (serialization; the pipe
is free again at that departure) and is written to the other side ``rtt / 2`` later. Order is
kept, and reading goes on while earlier chunks are in flight (a pipe, not stop-and-wait), up to
:data:`QUEUE_LIMIT` bytes queued for a side; past that the relay stops reading from the sender,
whose TCP window then fills (backpressure). A half-close (EOF) reaches the other side after the
data before it; a reset, or a write to a side that is gone, resets both. A connection's upload
pipe is free only one ``rtt`` after the relay accepted it: its first bytes reach the server at
``1.5 rtt``, as after a real TCP handshake, so a new connection costs one extra round trip.

:func:`link_process` runs the relay in a child process (``python -m ws_mode.toolkit.link``, on a
listening socket bound here and passed down by :func:`~ws_mode.testing._loopback.server_process`),
so it never shares the GIL with benchmark clients; it exits with its parent. Rates are in
bytes per second inside, and in bits per second (decimal) in the text :meth:`LinkSpec.parse`
reads and :meth:`LinkSpec.describe` writes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import re
import resource
import socket
import struct
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from ws_mode.testing._loopback import HOST, add_child_arguments, exit_with_parent, server_process

from .args import number

__all__ = ["CHUNK_BYTES", "QUEUE_LIMIT", "LinkSpec", "link_process", "main", "relay"]

#: The most bytes read from a side at once: one chunk of a pipe.
CHUNK_BYTES: Final = 64 * 1024
#: The most bytes queued for one side before the relay stops reading from the other.
QUEUE_LIMIT: Final = 4 * 1024 * 1024
#: Seconds per unit of a round-trip time.
TIME_UNITS: Final = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
#: Bits per second per unit of a rate (decimal); ``bps`` and friends are synonyms.
RATE_UNITS: Final = {
    **{"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9},
    **{"bps": 1.0, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9},
}
_QUANTITY = re.compile(r"((?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)\s*([a-z]*)")
_RATE_NAMES = ((1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s"), (1.0, "bit/s"))


@dataclass(frozen=True)
class LinkSpec:
    """A link: its round-trip time in seconds (each direction gets half as propagation delay),
    and its client-to-server (``up``) and server-to-client (``down``) rates in bytes per second,
    ``None`` for unlimited."""

    rtt: float
    up: float | None
    down: float | None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rtt) and self.rtt >= 0):
            raise ValueError(f"rtt must be a finite number of seconds >= 0, got {self.rtt!r}")
        for name, rate in (("up", self.up), ("down", self.down)):
            if rate is not None and not (math.isfinite(rate) and rate > 0):
                raise ValueError(f"{name} must be a rate > 0 in bytes/s or None, got {rate!r}")

    @classmethod
    def parse(cls, text: str) -> LinkSpec:
        """Read ``rtt=30ms,up=10mbit,down=50mbit``: rtt in us, ms or s (a bare number is ms),
        rates in bit, kbit, mbit or gbit per second (decimal; bps, kbps, mbps and gbps are
        synonyms). Each key at most once; an omitted key is 0 (rtt) or unlimited (rates).
        Raises ValueError saying what is wrong."""
        values: dict[str, float] = {}
        for item in (part.strip() for part in text.lower().split(",")):
            if not item and not text.strip():
                continue
            key, equals, value = (piece.strip() for piece in item.partition("="))
            if not equals or not key or not value:
                raise ValueError(f"expected key=value (rtt, up, down), got {item!r} in {text!r}")
            if key not in ("rtt", "up", "down"):
                raise ValueError(f"unknown key {key!r} in {text!r}: expected rtt, up or down")
            if key in values:
                raise ValueError(f"{key} given twice in {text!r}")
            values[key] = _quantity(key, value)
        up, down = values.get("up"), values.get("down")
        return cls(
            rtt=values.get("rtt", 0.0),
            up=None if up is None else up / 8,
            down=None if down is None else down / 8,
        )

    def describe(self) -> str:
        """The link for people: ``rtt 30 ms, up 10 Mbit/s, down 50 Mbit/s``."""
        up, down = _describe_rate(self.up), _describe_rate(self.down)
        return f"rtt {_describe_time(self.rtt)}, up {up}, down {down}"


def _quantity(key: str, text: str) -> float:
    """The value of one ``key=text``: seconds for rtt, bits per second for a rate."""
    match = _QUANTITY.fullmatch(text)
    units = TIME_UNITS if key == "rtt" else RATE_UNITS
    if match is None:
        if text.startswith("-"):
            raise ValueError(f"{key} must not be negative, got {text!r}")
        raise ValueError(f"{key}: expected a number and a unit, got {text!r}")
    amount, unit = float(match[1]), match[2] or ("ms" if key == "rtt" else "")
    if unit not in units:
        raise ValueError(
            f"{key}: unknown unit {unit or 'none'!r} in {text!r}: use {', '.join(units)}"
        )
    if not math.isfinite(amount):
        raise ValueError(f"{key} must be finite, got {text!r}")
    if key != "rtt" and amount == 0:
        raise ValueError(f"{key} must be > 0 (omit it for unlimited), got {text!r}")
    return amount * units[unit]


def _describe_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:g} s"
    if seconds >= 1e-3 or seconds == 0:
        return f"{seconds * 1e3:g} ms"
    return f"{seconds * 1e6:g} us"


def _describe_rate(rate: float | None) -> str:
    if rate is None:
        return "unlimited"
    bits = rate * 8
    scale, name = next(((s, n) for s, n in _RATE_NAMES if bits >= s), _RATE_NAMES[-1])
    return f"{bits / scale:g} {name}"


# ----------------------------------------------------------------------------- the relay


class _Pipe:
    """One direction of one connection: when each chunk arrives, and how much is queued."""

    def __init__(self, rate: float | None, delay: float, free: float) -> None:
        self.rate = rate
        self.delay = delay
        self.free = free  # when the last chunk finished departing
        self.queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()
        self.queued = 0
        self.room = asyncio.Event()
        self.room.set()

    def push(self, now: float, data: bytes | None) -> None:
        """Queue a chunk read at `now` (None: EOF) for its arrival."""
        departure = max(now, self.free)
        if data is not None:
            if self.rate is not None:
                departure += len(data) / self.rate
            self.queued += len(data)
            if self.queued >= QUEUE_LIMIT:
                self.room.clear()
        self.free = departure
        self.queue.put_nowait((departure + self.delay, data))

    def release(self, size: int) -> None:
        """`size` bytes left the relay."""
        self.queued -= size
        if self.queued < QUEUE_LIMIT:
            self.room.set()


async def _feed(reader: asyncio.StreamReader, pipe: _Pipe) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await pipe.room.wait()
        data = await reader.read(CHUNK_BYTES)
        pipe.push(loop.time(), data or None)
        if not data:
            return


async def _deliver(pipe: _Pipe, writer: asyncio.StreamWriter) -> None:
    loop = asyncio.get_running_loop()
    while True:
        arrival, data = await pipe.queue.get()
        delay = arrival - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if data is None:
            if writer.can_write_eof():
                writer.write_eof()
            return
        writer.write(data)
        await writer.drain()
        pipe.release(len(data))


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (linger 0), dropping what is unsent."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _connection(
    spec: LinkSpec,
    target: tuple[str, int],
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
) -> None:
    accepted = asyncio.get_running_loop().time()
    try:
        server_reader, server_writer = await asyncio.open_connection(*target, limit=CHUNK_BYTES)
    except OSError:
        _reset(client_writer)
        return
    up = _Pipe(spec.up, spec.rtt / 2, accepted + spec.rtt)  # the handshake's round trip
    down = _Pipe(spec.down, spec.rtt / 2, accepted)
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(_feed(client_reader, up))
            group.create_task(_deliver(up, server_writer))
            group.create_task(_feed(server_reader, down))
            group.create_task(_deliver(down, client_writer))
    except* OSError:  # a reset or a side that is gone: reset the other
        _reset(client_writer)
        _reset(server_writer)
    else:
        client_writer.close()
        server_writer.close()


async def relay(spec: LinkSpec, listener: socket.socket, target: tuple[str, int]) -> None:
    """Relay every connection `listener` accepts to `target` (host, port) through `spec`'s
    link, until cancelled."""

    # The loop holds tasks weakly: a connection paused on both sides would be collected.
    connections: set[asyncio.Task[None]] = set()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        connections.add(task)
        try:
            await _connection(spec, target, reader, writer)
        finally:
            connections.discard(task)

    server = await asyncio.start_server(accept, sock=listener, limit=CHUNK_BYTES)
    async with server:
        await server.serve_forever()


# ----------------------------------------------------------------------------- the process


def _split_target(target: str) -> tuple[str, str, int, str]:
    """The scheme, host, port and path of a base URL."""
    parts = urlsplit(target)
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
        raise ValueError(f"target must be a base URL like http://127.0.0.1:8000, got {target!r}")
    secure = parts.scheme in ("https", "wss")
    return parts.scheme, parts.hostname, parts.port or (443 if secure else 80), parts.path


@contextlib.contextmanager
def link_process(spec: LinkSpec, target: str) -> Iterator[str]:
    """Run the relay in a child process in front of `target` (a base URL like
    http://127.0.0.1:PORT); yield the relay's base URL (same scheme, 127.0.0.1, the relay's
    port, the target's path). Stops it on exit; it also exits if this process dies. The relay
    is ready when yielded: an HTTP ``GET /`` went through it and the target answered."""
    scheme, host, port, path = _split_target(target)
    arguments = ["--target-host", host, "--target-port", str(port), "--rtt", repr(spec.rtt)]
    for name, rate in (("--up", spec.up), ("--down", spec.down)):
        if rate is not None:
            arguments += [name, repr(rate)]
    with server_process("ws_mode.toolkit.link", arguments, backlog=4096) as child:
        yield urlunsplit((scheme, child.base_url.partition("://")[2], path, "", ""))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ws_mode.toolkit.link``: the child :func:`link_process` starts."""
    parser = argparse.ArgumentParser(prog="python -m ws_mode.toolkit.link", description=__doc__)
    parser.add_argument("--target-host", default=HOST, help="where to relay to")
    parser.add_argument("--target-port", type=int, required=True)
    parser.add_argument("--rtt", type=number(float, 0), default=0.0, help="seconds")
    parser.add_argument("--up", type=number(float, 0, strict=True), help="bytes per second")
    parser.add_argument("--down", type=number(float, 0, strict=True), help="bytes per second")
    add_child_arguments(parser)
    args = parser.parse_args(argv)
    exit_with_parent(args.lifetime)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):  # two descriptors per connection
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    spec = LinkSpec(args.rtt, args.up, args.down)
    listener = socket.socket(fileno=args.fd)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(relay(spec, listener, (args.target_host, args.target_port)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
