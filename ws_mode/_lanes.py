"""The lane scheduler: requests run first in, first out per `stream_id`, lanes concurrently.

A connection hands each `response.create` to `Lanes.submit`. Requests on one lane never
overlap; lanes run at once, at most `Limits.max_in_flight` of them holding a turn, and the
rest wait. The scheduler also bounds how many named lanes a connection may open and how many
requests may wait, and keeps a lane's refusals in that lane's order. It knows nothing of
sockets: it calls `run` for each request and `refuse` for each refusal.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ._budget import MemoryBudget
from ._client_events import CreateEvent, ProtocolError
from ._limits import Limits
from ._protocol import SERVER_IS_OVERLOADED, memory_budget_message

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _Lane:
    stream_id: str | None
    # Creates, and refusals of creates, answered in order.
    queue: deque[CreateEvent | ProtocolError] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None


class Lanes:
    """The lanes of one connection.

    `run(create)` serves one request (a turn); `refuse(error)` answers a refusal that waited
    for its lane. An exception of a type in `ends_lane` (the client went away) ends that
    lane's work quietly. With a `budget`, each request holds what it costs (`submit`'s `cost`)
    there from its submission until its turn ends.
    """

    def __init__(
        self,
        limits: Limits,
        *,
        run: Callable[[CreateEvent], Awaitable[None]],
        refuse: Callable[[ProtocolError], Awaitable[None]],
        ends_lane: tuple[type[BaseException], ...] = (),
        budget: MemoryBudget | None = None,
    ) -> None:
        self._limits = limits
        self._run = run
        self._refuse = refuse
        self._ends_lane = ends_lane
        self._lanes: dict[str | None, _Lane] = {}
        self._named: set[str] = set()
        self._in_flight = asyncio.Semaphore(limits.max_in_flight)
        self._waiting = 0  # requests taken off their lane, waiting for an in-flight slot
        self._queued_bytes = 0  # the frame bytes of every request not yet running
        self._budget = budget
        self._costs: dict[int, int] = {}  # id(create) -> what it holds in the budget

    def submit(self, create: CreateEvent, cost: int = 0) -> None:
        """Queue a request on its lane; raise `ProtocolError` when a bound refuses it. `cost`:
        what it holds in memory until its turn ends (reserved in the budget)."""
        lane = self._lanes.get(create.stream_id)
        if lane is None:
            if create.stream_id is not None:
                if (
                    create.stream_id not in self._named
                    and len(self._named) >= self._limits.max_streams
                ):
                    raise ProtocolError(
                        f"This connection already uses {self._limits.max_streams} stream_ids, "
                        "the most it may.",
                        code="websocket_stream_limit_reached",
                        param="stream_id",
                        stream_id=create.stream_id,
                    )
                self._named.add(create.stream_id)
            lane = self._lanes[create.stream_id] = _Lane(create.stream_id)
        if self.queued() and self._queued_bytes + create.size > self._limits.max_queued_bytes:
            raise ProtocolError(
                f"The requests waiting on this connection already hold {self._queued_bytes} "
                f"bytes (Limits.max_queued_bytes is {self._limits.max_queued_bytes}); wait for "
                "responses to finish before sending more.",
                code="too_many_queued_requests",
                param=None,
                status=429,
                stream_id=create.stream_id,
            )
        if self.queued() >= self._limits.max_queued:
            raise ProtocolError(
                f"Too many requests are waiting on this connection ({self._limits.max_queued}); "
                "wait for responses to finish before sending more.",
                code="too_many_queued_requests",
                param=None,
                status=429,
                stream_id=create.stream_id,
            )
        if self._budget is not None:
            if not self._budget.reserve(cost):
                raise ProtocolError(
                    memory_budget_message("this request"),
                    code=SERVER_IS_OVERLOADED,
                    param=None,
                    status=503,
                    type="server_error",
                    stream_id=create.stream_id,
                )
            self._costs[id(create)] = cost
        self._enqueue(lane, create)

    def refuse_in_order(self, error: ProtocolError) -> bool:
        """Queue a refusal behind what its busy lane runs before it; False when the lane is
        idle, or too much already waits (the caller answers it at once)."""
        lane = self._lanes.get(error.stream_id) if error.on_lane else None
        if lane is None or self.queued() >= self._limits.max_queued:
            return False
        # A waiting refusal keeps its message only: its traceback and the exception it was
        # raised from hold the frame it refused, parsed and raw.
        error.__traceback__ = None
        error.__context__ = None
        self._enqueue(lane, error)
        return True

    @property
    def queued_bytes(self) -> int:
        """The frame bytes of the requests that wait."""
        return self._queued_bytes

    def queued(self) -> int:
        """How many requests wait: on their lanes, or for an in-flight slot."""
        return self._waiting + sum(len(lane.queue) for lane in self._lanes.values())

    def tasks(self) -> list[asyncio.Task[None]]:
        """The lanes' running tasks."""
        return [lane.task for lane in self._lanes.values() if lane.task is not None]

    def cancel(self) -> None:
        """Cancel every lane's task, without waiting."""
        for task in self.tasks():
            task.cancel()

    async def stop(self) -> None:
        """Drop what waits, cancel what runs and wait for it to end. Called from a lane's own
        run (its credentials were refused), that lane is left to end itself."""
        tasks = [task for task in self.tasks() if task is not asyncio.current_task()]
        for lane in self._lanes.values():
            lane.queue.clear()
        self._queued_bytes = 0
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._lanes.clear()
        # What waited and was dropped, or was cancelled before it ran, holds nothing more.
        for create_id in list(self._costs):
            self._let_go(create_id)

    def let_go(self, create: CreateEvent) -> None:
        """`create` no longer holds what it cost (its response is being cached, which holds
        its own); harmless when it held nothing or already let go."""
        self._let_go(id(create))

    def _let_go(self, create_id: int) -> None:
        cost = self._costs.pop(create_id, 0)
        if self._budget is not None:
            self._budget.release(cost)

    def _enqueue(self, lane: _Lane, item: CreateEvent | ProtocolError) -> None:
        if isinstance(item, CreateEvent):
            self._queued_bytes += item.size
        lane.queue.append(item)
        if lane.task is None:
            lane.task = asyncio.create_task(self._serve(lane))

    async def _serve(self, lane: _Lane) -> None:
        try:
            while lane.queue:
                item = lane.queue.popleft()
                if isinstance(item, ProtocolError):
                    await self._refuse(item)
                    continue
                # Still waiting while it waits for a slot: `max_queued` counts it.
                self._waiting += 1
                try:
                    await self._in_flight.acquire()
                finally:
                    self._waiting -= 1
                    self._queued_bytes -= item.size
                try:
                    await self._run(item)
                except self._ends_lane:
                    raise
                except Exception:
                    # `run` answers its own failures; this is the last guard, so that one
                    # request's fault never stops the requests queued behind it.
                    logger.exception("a WebSocket mode request failed")
                finally:
                    self._in_flight.release()
                    self._let_go(id(item))
        except self._ends_lane:
            pass
        finally:
            lane.task = None
            if not lane.queue and self._lanes.get(lane.stream_id) is lane:
                del self._lanes[lane.stream_id]
