"""Large client frames parsed in a worker process, so the event loop serves other sockets.

Decoding JSON holds the interpreter for its whole length (about 16 ms per MiB of tiny items):
one large frame would stall every socket of the worker. A frame of `OFF_LOOP_BYTES` or more is
parsed and validated in a helper process instead (a few shared by the whole server process,
started on first use, ending with it). Its input items come back encoded only, one
bytes object cheap to hand over, and are decoded here again only if something asks for them as
objects (a cache-aware handler's `Turn.history()`, a renderer). Smaller frames, and every frame
when no helper can run, are parsed in place.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import pickle
import subprocess
import sys
import threading
from typing import IO, Any

import orjson

from .cache import decoded_size
from .client_events import (
    CreateEvent,
    ProcessedEvent,
    ProtocolError,
    SteerEvent,
    parse_client_event,
)
from .logs import for_log

__all__ = ["OFF_LOOP_BYTES", "held_cost", "parse_frame"]

logger = logging.getLogger(__name__)

#: Frames this long or longer are parsed in a helper process.
OFF_LOOP_BYTES = 1 << 20
#: Helper processes at most (each parses one frame at a time).
WORKERS = min(2, os.cpu_count() or 1)

ClientEvent = CreateEvent | SteerEvent | ProcessedEvent

# What a helper process runs.
_HELPER = "import sys; from ws_mode.frames import serve; serve(sys.stdin.buffer, sys.stdout.buffer)"


async def parse_frame(text: str) -> ClientEvent:
    """Parse and validate one text frame (`parse_client_event`), off the event loop when it
    is large; raise `ProtocolError` when it is not acceptable."""
    if len(text) >= OFF_LOOP_BYTES and not _POOL.failed:
        event = await asyncio.to_thread(_POOL.parse, text)
        if event is not None:
            return event
    return parse_client_event(text)


def held_cost(text: str, create: CreateEvent) -> int:
    """What a parsed create holds until its turn ends (reserved in the memory budget): its
    text's worth of encoded items and fields, plus its items decoded when it was parsed in
    place (a large frame's come back from the helper encoded only), counted as the cache
    counts them (`ws_mode.budget.PARSE_FACTOR` covers the parse itself)."""
    return len(text) + (decoded_size(text) if create.items.decoded else 0)


def _parse_encoded(text: str) -> ClientEvent:
    """In a helper: parse, and keep a create's items encoded only, to send them back."""
    event = parse_client_event(text)
    if isinstance(event, CreateEvent):
        # Nested too deeply to encode: sent back decoded, the turn refuses it as any frame.
        with contextlib.suppress(orjson.JSONEncodeError):
            event.items = event.items.encoded_only()
    return event


class _Helper:
    """One helper process, spoken to over its pipes: a length, then that many bytes."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _HELPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self._to: IO[bytes] = self.process.stdin  # type: ignore[assignment]
        self._from: IO[bytes] = self.process.stdout  # type: ignore[assignment]

    def request(self, text: str) -> tuple[str, Any]:
        _write(self._to, text.encode("utf-8", "surrogatepass"))
        answer: tuple[str, Any] = pickle.loads(_read(self._from))
        return answer

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._to.close()  # the helper ends at the end of its input
            self.process.wait(timeout=2)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class _Pool:
    """The helpers of this process, shared by every event loop and thread in it."""

    def __init__(self) -> None:
        self.failed = False
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(WORKERS)
        self._idle: list[_Helper] = []
        self._all: list[_Helper] = []

    def parse(self, text: str) -> ClientEvent | None:
        """Parse in a helper (in a thread of the event loop's executor); None when no helper
        could, and the frame is to be parsed in place."""
        with self._slots:
            try:
                helper = self._take()
            except OSError:
                self._fail("no frame parser process can start")
                return None
            try:
                kind, value = helper.request(text)
            except Exception:
                self._discard(helper)
                self._fail("a frame parser process died")
                return None
            with self._lock:
                self._idle.append(helper)
        if kind == "event":
            event: ClientEvent = value
            return event
        if kind == "refused":
            raise value
        logger.error("parsing a frame in a helper process failed: %s", for_log(value))
        return None

    def stop(self) -> None:
        with self._lock:
            helpers, self._all, self._idle = self._all, [], []
        for helper in helpers:
            helper.stop()

    def _take(self) -> _Helper:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        helper = _Helper()
        with self._lock:
            self._all.append(helper)
        return helper

    def _discard(self, helper: _Helper) -> None:
        with self._lock:
            if helper in self._all:
                self._all.remove(helper)
        helper.stop()

    def _fail(self, reason: str) -> None:
        logger.warning("%s; large frames are parsed on the event loop from now on", reason)
        self.failed = True


_POOL = _Pool()
atexit.register(_POOL.stop)


def _write(stream: IO[bytes], data: bytes) -> None:
    stream.write(len(data).to_bytes(8, "big"))
    stream.write(data)
    stream.flush()


def _read(stream: IO[bytes]) -> bytes:
    header = stream.read(8)
    if len(header) < 8:
        raise EOFError("the other side closed its pipe")
    size = int.from_bytes(header, "big")
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the other side closed its pipe")
    return data


def serve(source: IO[bytes], sink: IO[bytes]) -> None:
    """A helper process's loop: parse each frame it is given until its input ends."""
    while True:
        try:
            text = _read(source).decode("utf-8", "surrogatepass")
        except EOFError:
            return
        answer: tuple[str, Any]
        try:
            answer = ("event", _parse_encoded(text))
        except ProtocolError as refusal:
            answer = ("refused", refusal.with_traceback(None))
        except Exception as exc:
            answer = ("failed", repr(exc))
        _write(sink, pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))
