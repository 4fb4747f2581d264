"""Counters a deployment watches: connections, turns, the cache, bytes saved, errors, latency.

One `Stats` per middleware (one worker process): `middleware.stats.snapshot()` returns plain
numbers for logs, a health endpoint, or `ws_mode.prometheus`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable
from typing import Any

from .budget import MemoryBudget

__all__ = ["LATENCY_BUCKETS", "Stats"]

#: Upper bounds (seconds) of the turn latency histogram's buckets; the last is +Inf.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Stats:
    """Counters of one middleware. Everything counts since the middleware was created."""

    def __init__(self) -> None:
        self.connections_open = 0
        self.connections_total = 0
        self.connections_refused = 0
        self.turns = 0
        self.warm_ups = 0
        self.turns_failed = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.bytes_received = 0
        self.bytes_saved = 0
        #: Responses loaded from the store (`store=`) into a connection's cache; records
        #: written; lookups and writes that failed (a write cancelled too).
        self.store_hydrations = 0
        self.store_writes = 0
        self.store_failures = 0
        #: Records not stored because their conversation alone exceeds
        #: `Limits.max_stored_bytes_per_principal`, and conversations dropped to keep a
        #: principal within it.
        self.store_refused = 0
        self.store_dropped = 0
        self.errors: Counter[str] = Counter()
        self.latency_buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0
        self._closed_evictions = 0
        #: Reads the evictions of the caches of open connections (set by the middleware).
        self.live_evictions: Callable[[], int] = lambda: 0
        #: The middleware's share of the process's memory budget (set by the middleware).
        self.budget: MemoryBudget | None = None

    @property
    def cache_evictions(self) -> int:
        """Responses evicted from connection caches (by the bounds, or a failed continuation)."""
        return self._closed_evictions + self.live_evictions()

    def connection_closed(self, evictions: int) -> None:
        """A connection ended; keep its cache's evictions."""
        self.connections_open -= 1
        self._closed_evictions += evictions

    def error(self, code: str | None) -> None:
        """An error event was sent to a client."""
        self.errors[code or "unknown"] += 1

    def turn_finished(self, seconds: float, *, failed: bool) -> None:
        """A handler call ended after `seconds` (from its start to its terminal event)."""
        self.latency_buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.latency_sum += seconds
        if failed:
            self.turns_failed += 1

    def _memory(self) -> dict[str, int]:
        """The memory budget (`Limits.max_memory_bytes`): what WebSocket mode holds in this
        process (every middleware of it), this middleware's part, the limit, the most ever
        held, and the reservations refused (work answered `memory_budget_exceeded`)."""
        budget = self.budget
        if budget is None:
            return {}
        return {
            "memory_bytes": budget.used,
            "memory_held_bytes": budget.held,
            "memory_limit_bytes": budget.limit,
            "memory_peak_bytes": budget.account.peak,
            "memory_refusals": budget.refusals,
        }

    def snapshot(self) -> dict[str, Any]:
        """Every counter as plain numbers; `turn_latency` as cumulative histogram buckets."""
        cumulative: list[tuple[float, int]] = []
        total = 0
        bounds = (*LATENCY_BUCKETS, float("inf"))
        for bound, count in zip(bounds, self.latency_buckets, strict=True):
            total += count
            cumulative.append((bound, total))
        return {
            "connections_open": self.connections_open,
            "connections_total": self.connections_total,
            "connections_refused": self.connections_refused,
            "turns": self.turns,
            "turns_failed": self.turns_failed,
            "warm_ups": self.warm_ups,
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
            "cache_evictions": self.cache_evictions,
            "bytes_received": self.bytes_received,
            "bytes_saved": self.bytes_saved,
            "store_hydrations": self.store_hydrations,
            "store_writes": self.store_writes,
            "store_failures": self.store_failures,
            "store_refused": self.store_refused,
            "store_dropped": self.store_dropped,
            "errors": dict(self.errors),
            **self._memory(),
            "turn_latency": {"buckets": cumulative, "count": total, "sum": self.latency_sum},
        }
