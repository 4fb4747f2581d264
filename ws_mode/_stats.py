"""Counters a deployment watches: connections, turns, the cache, bytes saved, errors, latency.

One `Stats` per middleware (one worker process): `middleware.stats.snapshot()` returns plain
numbers for logs, a health endpoint, or `ws_mode.prometheus`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable
from typing import Any

from ._budget import MemoryBudget

__all__ = ["LATENCY_BUCKETS", "METRICS", "Stats"]

#: Upper bounds (seconds) of the turn latency histogram's buckets; the last is +Inf.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


#: Every number `Stats.snapshot()` gives, once: its key, whether it only grows ("counter") or
#: goes up and down ("gauge"), and what it means. `snapshot()` and `ws_mode.prometheus` are
#: both made from this table, so a number cannot be counted and not exported. The memory
#: budget's numbers are there when the middleware has a budget.
METRICS: tuple[tuple[str, str, str], ...] = (
    ("connections_open", "gauge", "Open WebSocket mode connections."),
    ("connections_total", "counter", "WebSocket mode connections accepted."),
    ("connections_refused", "counter", "WebSocket mode upgrades refused (limits, off, auth)."),
    ("turns", "counter", "Handler calls made for generated responses."),
    ("turns_failed", "counter", "Handler calls whose response failed or errored."),
    ("warm_ups", "counter", "generate: false warm-ups answered without calling the handler."),
    ("cache_hits", "counter", "Requests whose previous_response_id was cached on the connection."),
    ("cache_misses", "counter", "Requests whose previous_response_id was not cached there."),
    ("cache_evictions", "counter", "Responses evicted from connection caches."),
    ("bytes_received", "counter", "Bytes of client frames received."),
    ("bytes_saved", "counter", "Context bytes clients did not re-send, joined from the cache."),
    (
        "store_hydrations",
        "counter",
        "Parents missing from a connection cache, found in the store.",
    ),
    ("store_writes", "counter", "Records written to the store."),
    (
        "store_failures",
        "counter",
        "Store reads and writes that failed, timed out or were cut.",
    ),
    ("store_refused", "counter", "Conversations not stored: over max_stored_bytes_per_principal."),
    ("store_dropped", "counter", "Conversations dropped to keep a principal within its bound."),
    ("memory_bytes", "gauge", "Bytes WebSocket mode holds in this process (the memory budget)."),
    ("memory_held_bytes", "gauge", "This middleware's part of the memory budget's use."),
    ("memory_limit_bytes", "gauge", "The memory budget: Limits.max_memory_bytes."),
    ("memory_peak_bytes", "gauge", "The most the memory budget has held."),
    ("memory_refusals", "counter", "Work refused because the memory budget could not hold it."),
)


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
        memory = self._memory()
        numbers = {
            key: memory[key] if key.startswith("memory_") else getattr(self, key)
            for key, _kind, _help in METRICS
            if not key.startswith("memory_") or key in memory
        }
        return {
            **numbers,
            "errors": dict(self.errors),
            "turn_latency": {"buckets": cumulative, "count": total, "sum": self.latency_sum},
        }
