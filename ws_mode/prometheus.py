"""Prometheus metrics of WebSocket mode (needs `prometheus-client`), read at every scrape.

    from ws_mode.prometheus import metrics_app

    app.mount("/metrics", metrics_app())        # FastAPI, Starlette
    application = with_metrics(application)    # any ASGI app: Django's, a bare one

`metrics_app()` serves a registry (the default one unless told otherwise) into which it has
registered, once, the collector of every middleware of the process (`MiddlewaresCollector`):
no middleware instance to look up, and several middlewares told apart by their `middleware`
label (`Stats.name`). `with_metrics(app)` answers HTTP requests to `/metrics` with it beside
any ASGI app; `ws-mode serve --metrics /metrics` and `ws-mode proxy --metrics /metrics` use it.
`register(middleware)` exports one middleware without the label (`StatsCollector`).

Every metric is made from the table of `Stats.snapshot()`'s keys (`ws_mode._stats.METRICS`):
a counter or gauge under `{prefix}_{key}`, the error events as the counter `{prefix}_errors`
labelled by `code` (at most `ws_mode._stats.ERROR_CODE_LABELS` of them, cut as log values
are, then `other`), the turn latency as the histogram `{prefix}_turn_seconds`, the tokens as
the counter `{prefix}_tokens` labelled by `model` (at most `ws_mode._stats.MODEL_LABELS` of
them, then `other`) and `kind` (`input`, `cached_input`, `output`, `reasoning`), each turn's
share of input tokens read from the prompt cache as the histogram `{prefix}_prompt_cache_ratio`
labelled by `model` and `turn` (`first`, `continuation`).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

from prometheus_client import make_asgi_app
from prometheus_client.core import (
    REGISTRY,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from ._asgi import ASGIApp, Receive, Scope, Send
from ._errors import ConfigError
from ._middleware import WebSocketModeMiddleware
from ._stats import METRICS, TOKEN_KINDS, Stats, live_stats
from ._stats import Metric as StatsMetric

__all__ = [
    "MiddlewaresCollector",
    "StatsCollector",
    "metrics_app",
    "register",
    "register_all",
    "with_metrics",
]

#: The label `MiddlewaresCollector` tells the middlewares of a process apart by.
_LABEL: Final = "middleware"
#: The name a middleware without `stats.name` is labelled by (then `default-2`, ...).
_DEFAULT_NAME: Final = "default"
#: The code label of `{prefix}_errors`.
_CODE_LABEL: Final = "code"
#: The labels of `{prefix}_tokens`: the model the response objects name, the kind of token.
_TOKEN_LABELS: Final = ("model", "kind")
#: The labels of `{prefix}_prompt_cache_ratio`: the model, the turn (`first`, `continuation`).
_RATIO_LABELS: Final = ("model", "turn")
#: Where Prometheus's naming differs from the snapshot key: a unit ends the name.
_EXPORTED_AS: Final = {"turn_latency": "turn_seconds"}


def _exported_name(metric: StatsMetric, prefix: str = "ws_mode") -> str:
    """The name of the family a `METRICS` key is exported as (a counter's samples add
    `_total`, a histogram's `_bucket`, `_sum` and `_count`)."""
    return f"{prefix}_{_EXPORTED_AS.get(metric.key, metric.key)}"


def _families(
    prefix: str,
    label_names: Sequence[str],
    snapshots: Sequence[tuple[Sequence[str], dict[str, Any]]],
    *,
    every: bool = False,
) -> Iterator[Metric]:
    """The metrics of `snapshots` (each with its label values), one family per `METRICS` key
    that some snapshot has (`every`: each family, for describing a collector)."""
    for metric in METRICS:
        name = _exported_name(metric, prefix)
        given = [
            (labels, snapshot[metric.key])
            for labels, snapshot in snapshots
            if metric.key in snapshot
        ]
        if not given and not every:
            continue  # the memory budget's numbers without a budget; no middleware at all
        family: Metric
        if metric.kind == "histogram":
            histogram = HistogramMetricFamily(name, metric.help, labels=label_names)
            for labels, latency in given:
                buckets = list(latency["buckets"].items())
                histogram.add_metric(labels, buckets, sum_value=latency["sum"])
            family = histogram
        elif metric.kind == "counters by code":
            counters = CounterMetricFamily(name, metric.help, labels=[*label_names, _CODE_LABEL])
            for labels, by_code in given:
                for code, count in sorted(by_code.items()):
                    counters.add_metric([*labels, code], count)
            family = counters
        elif metric.kind == "tokens by model":
            tokens = CounterMetricFamily(name, metric.help, labels=[*label_names, *_TOKEN_LABELS])
            for labels, counted in given:
                for model, by_kind in sorted(counted["by_model"].items()):
                    for token_kind in TOKEN_KINDS:
                        tokens.add_metric([*labels, model, token_kind], by_kind[token_kind])
            family = tokens
        elif metric.kind == "histogram by model":
            ratios = HistogramMetricFamily(name, metric.help, labels=[*label_names, *_RATIO_LABELS])
            for labels, by_model in given:
                for model, by_turn in sorted(by_model.items()):
                    for turn, histogram in sorted(by_turn.items()):
                        buckets = list(histogram["buckets"].items())
                        ratios.add_metric([*labels, model, turn], buckets, histogram["sum"])
            family = ratios
        else:
            kind = CounterMetricFamily if metric.kind == "counter" else GaugeMetricFamily
            number = kind(name, metric.help, labels=label_names)
            for labels, value in given:
                number.add_metric(labels, value)
            family = number
        yield family


class StatsCollector(Collector):
    """Reads one middleware's `stats` at every scrape, with no label."""

    def __init__(self, middleware: WebSocketModeMiddleware, *, prefix: str = "ws_mode") -> None:
        self.middleware = middleware
        self.prefix = prefix

    def collect(self) -> Iterator[Metric]:
        return _families(self.prefix, (), [((), self.middleware.stats.snapshot())])

    def describe(self) -> Iterator[Metric]:
        """Every family this collector may give (its names: the registry refuses a second
        collector of the same names)."""
        return _families(self.prefix, (), [], every=True)


class MiddlewaresCollector(Collector):
    """Reads the `stats` of every middleware of the process at every scrape, each sample
    labelled `middleware` with the middleware's `stats.name` (`default` when it has none;
    `default-2`, ... for the unnamed ones after the first, and a repeated name likewise)."""

    def __init__(self, *, prefix: str = "ws_mode") -> None:
        self.prefix = prefix

    def collect(self) -> Iterator[Metric]:
        snapshots = [([name], stats.snapshot()) for name, stats in _labelled(live_stats())]
        return _families(self.prefix, (_LABEL,), snapshots)

    def describe(self) -> Iterator[Metric]:
        """Every family this collector may give (its names: the registry refuses a second
        collector of the same names)."""
        return _families(self.prefix, (_LABEL,), [], every=True)


def _labelled(stats: Iterable[Stats]) -> list[tuple[str, Stats]]:
    """Each `Stats` with its `middleware` label: its name, `default` without one, and a name
    taken already followed by `-2`, `-3`, ... in the order given."""
    taken: set[str] = set()
    result: list[tuple[str, Stats]] = []
    for each in stats:
        base = each.name or _DEFAULT_NAME
        name, copy = base, 1
        while name in taken:
            copy += 1
            name = f"{base}-{copy}"
        taken.add(name)
        result.append((name, each))
    return result


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


_REGISTERED: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, MiddlewaresCollector]] = (
    weakref.WeakKeyDictionary()
)
_REGISTERED_LOCK = threading.Lock()


def register_all(
    registry: CollectorRegistry = REGISTRY, *, prefix: str = "ws_mode"
) -> MiddlewaresCollector:
    """Expose the `stats` of every middleware of the process in `registry`, labelled
    `middleware`: registers a `MiddlewaresCollector` the first time, returns that one after."""
    with _REGISTERED_LOCK:
        by_prefix = _REGISTERED.setdefault(registry, {})
        collector = by_prefix.get(prefix)
        if collector is None:
            collector = MiddlewaresCollector(prefix=prefix)
            registry.register(collector)
            by_prefix[prefix] = collector
        return collector


class _MetricsApp:
    """prometheus_client's ASGI app for HTTP; a socket is refused and a lifespan completed, so
    the app fits wherever an ASGI app goes."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._http = make_asgi_app(registry)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        elif scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return


def metrics_app(registry: CollectorRegistry = REGISTRY, *, prefix: str = "ws_mode") -> ASGIApp:
    """An ASGI app serving `registry` in Prometheus's text format, every middleware of the
    process in it (`register_all`); mount it at `/metrics`."""
    register_all(registry, prefix=prefix)
    return _MetricsApp(registry)


class _WithMetrics:
    """`app`, except HTTP requests to `path`, which get the metrics."""

    def __init__(self, app: ASGIApp, path: str, metrics: ASGIApp) -> None:
        self.app = app  # find_middlewares follows .app
        self.path = path
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in (
            self.path,
            scope.get("root_path", "") + self.path,
        ):
            await self.metrics(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def with_metrics(
    app: ASGIApp,
    path: str = "/metrics",
    *,
    registry: CollectorRegistry = REGISTRY,
    prefix: str = "ws_mode",
) -> ASGIApp:
    """`app` with the metrics of `metrics_app(registry)` answering HTTP requests to `path`;
    everything else (sockets, lifespan, other paths) reaches `app`."""
    if not path.startswith("/"):
        raise ConfigError(f"path must start with /, got {path!r}")
    return _WithMetrics(app, path, metrics_app(registry, prefix=prefix))
