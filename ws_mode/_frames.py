"""Large client frames and request bodies parsed in a helper process, so the event loop serves
other sockets.

Decoding JSON holds the interpreter for its whole length (about 16 ms per MiB of tiny items):
one large frame would stall every socket of the worker. A frame of `OFF_LOOP_BYTES` or more is
parsed and validated in a helper process instead (a few shared by the whole server process,
started on first use, ending with it); stateful HTTP sends its large request bodies the same
way (`in_helper`). A create's input items come back encoded only, one bytes object cheap to
hand over, and are decoded here again only if something asks for them as objects (a
cache-aware handler's `Turn.history()`, a renderer). Smaller frames are parsed in place.

The helpers are spoken to from the pool's own few threads, never the event loop's default
executor (which name lookups for Redis and upstreams need). A helper that dies (an OOM kill) is
replaced, and the request it held is retried once in another helper; a request that kills two
answers an error. Only when helpers fail to start `MAX_FAILURES` times in a row are large
frames parsed in place, for `RETRY_SECONDS`, before helpers are tried again.
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
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, TypeVar

import orjson

from ._cache import decoded_size
from ._client_events import (
    CreateEvent,
    InterruptEvent,
    ProcessedEvent,
    ProtocolError,
    SteerEvent,
    parse_client_event,
)
from ._logs import for_log

logger = logging.getLogger(__name__)

#: Frames (and stateful HTTP bodies) this long or longer are parsed in a helper process.
OFF_LOOP_BYTES = 1 << 20
#: Helper processes at most (each parses one frame at a time), and the pool's threads.
WORKERS = min(2, os.cpu_count() or 1)
#: Helpers failing to start this many times in a row pause the pool (a helper that dies is
#: replaced: an OOM kill says nothing about the next one).
MAX_FAILURES = 3
#: How long a paused pool leaves large frames to be parsed in place before trying again.
RETRY_SECONDS = 30.0

ClientEvent = CreateEvent | SteerEvent | InterruptEvent | ProcessedEvent
T = TypeVar("T")
R = TypeVar("R")

# What a helper process runs.
_HELPER = (
    "import sys; from ws_mode._frames import serve; serve(sys.stdin.buffer, sys.stdout.buffer)"
)


class HelperUnavailable(Exception):
    """No helper can run now: do the work in place."""


class HelperDied(Exception):
    """The helpers given this request died twice: it is answered with an error, not retried."""


async def in_helper(function: Callable[[T], R], argument: T) -> R:
    """`function(argument)` in a helper process (`function` defined at a module's top level,
    its argument and result picklable). Raises what it raises when that is a `ProtocolError`,
    `HelperUnavailable` when no helper can run it now (do it in place), and `HelperDied` when
    the helpers given it died twice."""
    if not _POOL.available():
        raise HelperUnavailable
    loop = asyncio.get_running_loop()
    kind, value = await loop.run_in_executor(_POOL.executor(), _POOL.run, function, argument)
    if kind == "value":
        result: R = value
        return result
    if kind == "refused":
        raise value
    logger.error("work in a helper process failed: %s", for_log(value))
    raise HelperUnavailable


async def parse_frame(text: str) -> ClientEvent:
    """Parse and validate one text frame (`parse_client_event`), off the event loop when it
    is large; raise `ProtocolError` when it is not acceptable."""
    if len(text) >= OFF_LOOP_BYTES:
        try:
            return await in_helper(_parse_encoded, text)
        except HelperDied:
            raise ProtocolError(
                "The message could not be parsed: the process parsing it ended, twice (it may "
                "need more memory than the server has). It was not run.",
                code="server_error",
                status=500,
                type="server_error",
            ) from None
        except HelperUnavailable:
            pass
    return parse_client_event(text)


def held_cost(text: str, create: CreateEvent) -> int:
    """What a parsed create holds until its turn ends (reserved in the memory budget): its
    text's worth of encoded items and fields, plus its items decoded when it was parsed in
    place (a large frame's come back from the helper encoded only), counted as the cache
    counts them (`ws_mode._budget.PARSE_FACTOR` covers the parse itself)."""
    return len(text) + (decoded_size(text) if create.items.decoded else 0)


def _parse_encoded(text: str) -> ClientEvent:
    """In a helper: parse, and keep a create's items encoded only, to send them back."""
    event = parse_client_event(text)
    if isinstance(event, CreateEvent):
        # Nested too deeply to encode: sent back decoded, the turn refuses it as any frame.
        with contextlib.suppress(orjson.JSONEncodeError):
            event.items = event.items.encoded_only()
            # Counted here, off the event loop: what a handler's body decoded costs.
            event.items.decoded_estimate = decoded_size(event.items.fragment)
    return event


class _Helper:
    """One helper process, spoken to over its pipes: a length, then that many bytes."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _HELPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self._to: IO[bytes] = self.process.stdin  # type: ignore[assignment]
        self._from: IO[bytes] = self.process.stdout  # type: ignore[assignment]
        # Reaped as soon as it ends, busy or idle (an OOM kill): otherwise an idle helper that
        # died stays a zombie until the next large frame finds it dead.
        threading.Thread(
            target=self.process.wait, name="ws_mode-helper-reaper", daemon=True
        ).start()

    def request(self, request: bytes) -> tuple[str, Any]:
        _write(self._to, request)
        answer: tuple[str, Any] = pickle.loads(_read(self._from))
        return answer

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._to.close()  # the helper ends at the end of its input
            self.process.wait(timeout=2)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        with contextlib.suppress(Exception):
            self._from.close()


class _Pool:
    """The helpers of this process, shared by every event loop and thread in it, and the
    threads that speak to them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Helper] = []
        self._all: list[_Helper] = []
        self._executor: ThreadPoolExecutor | None = None
        self._failures = 0  # in a row
        self._paused_until = 0.0

    def available(self) -> bool:
        """Whether helpers may be used (not paused after failing to start again and again)."""
        return time.monotonic() >= self._paused_until

    def executor(self) -> ThreadPoolExecutor:
        """The pool's own threads (the event loop's default executor is left to others)."""
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(WORKERS, thread_name_prefix="ws_mode-helpers")
            return self._executor

    def pids(self) -> list[int]:
        """The helper processes' ids (for tests and operators)."""
        with self._lock:
            return [helper.process.pid for helper in self._all]

    def run(self, function: Callable[[Any], Any], argument: Any) -> tuple[str, Any]:
        """In one of the pool's threads: the answer of a helper, in another one once when
        the first dies with the request."""
        request = pickle.dumps((function, argument), protocol=pickle.HIGHEST_PROTOCOL)
        for _ in range(2):
            helper = self._take()
            try:
                answer = helper.request(request)
            except Exception as exc:
                self._discard(helper)
                logger.warning("a helper process died (%r); it is replaced", exc)
                continue
            with self._lock:
                self._idle.append(helper)
            return answer
        raise HelperDied

    def stop(self) -> None:
        with self._lock:
            helpers, self._all, self._idle = self._all, [], []
            executor, self._executor = self._executor, None
        for helper in helpers:
            helper.stop()
        if executor is not None:
            executor.shutdown(wait=False)

    def _take(self) -> _Helper:
        dead: list[_Helper] = []
        found: _Helper | None = None
        with self._lock:
            while self._idle and found is None:
                candidate = self._idle.pop()
                if candidate.process.poll() is None:
                    found = candidate
                else:
                    dead.append(candidate)
        for gone in dead:
            self._discard(gone)
            logger.warning(
                "a helper process ended (status %s); it is replaced", gone.process.returncode
            )
        if found is not None:
            return found
        try:
            helper = _Helper()
        except OSError as exc:
            self._start_failed(f"no helper process can start ({exc!r})")
            raise HelperUnavailable from exc
        with self._lock:
            self._failures = 0
            self._all.append(helper)
        return helper

    def _discard(self, helper: _Helper) -> None:
        with self._lock:
            if helper in self._all:
                self._all.remove(helper)
        helper.stop()

    def _start_failed(self, reason: str) -> None:
        with self._lock:
            self._failures += 1
            pause = self._failures >= MAX_FAILURES
            if pause:
                self._failures = 0
                self._paused_until = time.monotonic() + RETRY_SECONDS
        if pause:
            logger.warning(
                "%s; helpers failed %d times in a row: large frames are parsed on the event "
                "loop for %.0f s, then helpers are tried again",
                reason,
                MAX_FAILURES,
                RETRY_SECONDS,
            )
        else:
            logger.warning("%s", reason)


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
    """A helper process's loop: run each request it is given until its input ends."""
    while True:
        try:
            request = _read(source)
        except EOFError:
            return
        answer: tuple[str, Any]
        try:
            function, argument = pickle.loads(request)
            del request  # a large request is not held twice while it is worked on
            answer = ("value", function(argument))
        except ProtocolError as refusal:
            answer = ("refused", refusal.with_traceback(None))
        except Exception as exc:
            answer = ("failed", repr(exc))
        _write(sink, pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))
