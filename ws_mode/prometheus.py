"""Prometheus metrics for a WebSocket mode middleware (needs `prometheus-client`).

from prometheus_client import make_asgi_app
from ws_mode.prometheus import register

register(middleware)                 # into the default registry
app.mount("/metrics", make_asgi_app())
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    REGISTRY,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from .middleware import WebSocketModeMiddleware

__all__ = ["StatsCollector", "register"]

_COUNTERS = (
    ("connections_total", "WebSocket mode connections accepted."),
    ("connections_refused", "WebSocket mode upgrades refused (limits, switched off, auth)."),
    ("turns", "Handler calls made for generated responses."),
    ("turns_failed", "Handler calls whose response failed or errored."),
    ("warm_ups", "generate: false warm-ups answered without calling the handler."),
    ("cache_hits", "Requests whose previous_response_id was cached on the connection."),
    ("cache_misses", "Requests whose previous_response_id was not cached on the connection."),
    ("cache_evictions", "Responses evicted from connection caches."),
    ("bytes_received", "Bytes of client frames received."),
    ("bytes_saved", "Context bytes clients did not have to re-send, joined from the cache."),
    ("store_hydrations", "Parents missing from a connection's cache found in the store."),
    ("store_writes", "Records written to the store."),
    ("store_failures", "Store reads and writes that failed, timed out or were cancelled."),
    ("store_refused", "Conversations not stored: larger than max_stored_bytes_per_principal."),
    ("store_dropped", "Conversations dropped to keep a principal within its store bound."),
)

_MEMORY_GAUGES = (
    ("memory_bytes", "Bytes WebSocket mode holds in this process (the memory budget's use)."),
    ("memory_limit_bytes", "The memory budget: Limits.max_memory_bytes."),
)


class StatsCollector(Collector):
    """Reads a middleware's `stats` at every scrape."""

    def __init__(self, middleware: WebSocketModeMiddleware, *, prefix: str = "ws_mode") -> None:
        self.middleware = middleware
        self.prefix = prefix

    def collect(self) -> Iterator[Metric]:
        snapshot = self.middleware.stats.snapshot()
        name = self.prefix
        yield GaugeMetricFamily(
            f"{name}_connections_open",
            "Open WebSocket mode connections.",
            value=snapshot["connections_open"],
        )
        for key, documentation in _COUNTERS:
            yield CounterMetricFamily(f"{name}_{key}", documentation, value=snapshot[key])
        if "memory_bytes" in snapshot:  # the process's memory budget (Limits.max_memory_bytes)
            for key, documentation in _MEMORY_GAUGES:
                yield GaugeMetricFamily(f"{name}_{key}", documentation, value=snapshot[key])
            yield CounterMetricFamily(
                f"{name}_memory_refusals",
                "Work refused because the memory budget could not hold it.",
                value=snapshot["memory_refusals"],
            )
        errors = CounterMetricFamily(
            f"{name}_errors", "Error events sent to clients, by code.", labels=["code"]
        )
        for code, count in sorted(snapshot["errors"].items()):
            errors.add_metric([code], count)
        yield errors
        latency = snapshot["turn_latency"]
        yield HistogramMetricFamily(
            f"{name}_turn_seconds",
            "Time from a handler call's start to its response's terminal event.",
            buckets=[(_bound(bound), count) for bound, count in latency["buckets"]],
            sum_value=latency["sum"],
        )


def _bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def register(
    middleware: WebSocketModeMiddleware,
    registry: CollectorRegistry = REGISTRY,
    *,
    prefix: str = "ws_mode",
) -> StatsCollector:
    """Expose `middleware.stats` as Prometheus metrics in `registry`."""
    collector = StatsCollector(middleware, prefix=prefix)
    registry.register(collector)
    return collector
