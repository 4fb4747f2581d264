"""What a socket turn costs ws_mode, counted rather than timed: the tasks it starts, the timers
it arms, the objects its cached response keeps for the garbage collector.

Each count is the difference between two runs of different lengths on fresh sockets, so what
a socket costs once (its own task, its send watchdog) drops out and what is left is per turn.
The turns are those of the per-turn microbenchmark (`ws_mode.toolkit.bench.turns`): a
13-event tool call answered in one chunk, short chains, each request sent once the previous
turn has wound down. No test asserts a time.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from starlette.types import Receive, Scope, Send

from ws_mode import WebSocketModeMiddleware
from ws_mode.toolkit.bench.turns import TURN_PATH, TurnHandler, drive_turns


def _app(handler: TurnHandler) -> WebSocketModeMiddleware:
    return WebSocketModeMiddleware(handler, path=TURN_PATH)


def _per_turn(count: Callable[[int], int], turns: int = 20) -> float:
    return (count(2 * turns) - count(turns)) / turns


def _tasks_started(turns: int) -> int:
    started = 0

    def factory(
        loop: asyncio.AbstractEventLoop,
        coro: Generator[Any, None, Any] | Coroutine[Any, Any, Any],
    ) -> asyncio.Task[Any]:
        nonlocal started
        started += 1
        return asyncio.Task(coro, loop=loop)

    async def run() -> None:
        asyncio.get_running_loop().set_task_factory(factory)
        handler = TurnHandler()
        await drive_turns(_app(handler), handler, turns)

    asyncio.run(run())
    return started


def test_a_turn_starts_two_tasks() -> None:
    """The lane's and the handler call's: waiting for the response to end starts none."""
    assert _per_turn(_tasks_started) == 2


def _timers_armed(turns: int) -> int:
    armed = 0

    async def run() -> None:
        loop = asyncio.get_running_loop()
        call_at = loop.call_at

        def counted(when: float, callback: Callable[..., object], *args: Any) -> Any:
            nonlocal armed
            armed += 1
            return call_at(when, callback, *args)

        loop.call_at = counted  # type: ignore[method-assign]
        handler = TurnHandler()
        await drive_turns(_app(handler), handler, turns)

    asyncio.run(run())
    return armed


def test_frames_and_turns_arm_no_timer_each() -> None:
    """The connection's lifetime and idle time are one timer, not a timeout per frame; a turn
    with no `max_turn_seconds` arms none."""
    assert _per_turn(_timers_armed) == 0


class _Counting(TurnHandler):
    """Counts the objects the collector tracks when it is called for chosen turns (after a
    collection): what the turns before it keep, cached, and the turn in flight."""

    def __init__(self, at: tuple[int, int]) -> None:
        super().__init__()
        self.at = at
        self.tracked: list[int] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.turns + 1 in self.at:
            gc.collect()
            self.tracked.append(len(gc.get_objects()))
        await super().__call__(scope, receive, send)


def test_a_cached_turn_keeps_five_objects_for_the_collector() -> None:
    """The node, its input's `Items` and list, the response object and its output list (the
    finished output is that list, not a copy; objects holding only strings and numbers are
    not tracked)."""
    handler = _Counting(at=(101, 301))
    asyncio.run(drive_turns(_app(handler), handler, 302))
    first, second = handler.tracked
    assert (second - first) / 200 <= 5
