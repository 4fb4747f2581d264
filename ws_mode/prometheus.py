"""Prometheus metrics for a WebSocket mode middleware (needs `prometheus-client`).

from prometheus_client import make_asgi_app
from .prometheus import register

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

from ._middleware import WebSocketModeMiddleware
from ._stats import METRICS

__all__ = ["StatsCollector", "register"]


class StatsCollector(Collector):
    """Reads a middleware's `stats` at every scrape."""

    def __init__(self, middleware: WebSocketModeMiddleware, *, prefix: str = "ws_mode") -> None:
        self.middleware = middleware
        self.prefix = prefix

    def collect(self) -> Iterator[Metric]:
        snapshot = self.middleware.stats.snapshot()
        name = self.prefix
        for key, kind, documentation in METRICS:
            if key not in snapshot:  # the memory budget's numbers, without a budget
                continue
            family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            yield family(f"{name}_{key}", documentation, value=snapshot[key])
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
