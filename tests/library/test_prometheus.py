"""`ws_mode.prometheus`: a middleware's `stats` as Prometheus metrics, read at every scrape;
every number of the `Stats` table (`METRICS`) exported under its own name and kind, errors by
code, and the turn latency as a histogram."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette

from ws_mode import WebSocketModeMiddleware
from ws_mode._stats import LATENCY_BUCKETS, METRICS
from ws_mode.prometheus import StatsCollector, register


def scrape(registry: CollectorRegistry) -> dict[str, Metric]:
    """The registry's metrics as a scraper reads them, by family name."""
    text = generate_latest(registry).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(family: Metric, sample: str, **labels: str) -> float:
    (found,) = [s.value for s in family.samples if s.name == sample and s.labels == labels]
    return found


def family_name(key: str, kind: str, prefix: str = "ws_mode") -> str:
    """The family a `METRICS` key is exported as: a counter's samples end in `_total`, which
    its family's name leaves out (`connections_total` is sampled as `..._connections_total`)."""
    return f"{prefix}_{key.removesuffix('_total') if kind == 'counter' else key}"


def registered(middleware: WebSocketModeMiddleware, **options: str) -> CollectorRegistry:
    registry = CollectorRegistry()
    collector = register(middleware, registry, **options)
    assert isinstance(collector, StatsCollector)
    assert collector.middleware is middleware
    return registry


def test_prometheus_exposes_the_counters() -> None:
    middleware = WebSocketModeMiddleware(Starlette())
    middleware.stats.turns = 3
    middleware.stats.error("invalid_json")
    middleware.stats.turn_finished(0.02, failed=False)
    registry = CollectorRegistry()
    register(middleware, registry)
    text = generate_latest(registry).decode()
    assert "ws_mode_turns_total 3.0" in text
    assert 'ws_mode_errors_total{code="invalid_json"} 1.0' in text
    assert 'ws_mode_turn_seconds_bucket{le="0.025"} 1.0' in text
    assert "ws_mode_connections_open 0.0" in text
    assert "ws_mode_memory_limit_bytes 2.147483648e+09" in text
    assert "ws_mode_memory_refusals_total 0.0" in text
    assert "ws_mode_store_failures_total 0.0" in text  # every counter of the store too


def test_prometheus_exports_every_number_the_snapshot_gives() -> None:
    # Both are made from one table (ws_mode._stats.METRICS): a counter added to Stats is
    # exported, under its own name.
    middleware = WebSocketModeMiddleware(Starlette())
    registry = CollectorRegistry()
    register(middleware, registry)
    text = generate_latest(registry).decode()
    numbers = [k for k, v in middleware.stats.snapshot().items() if isinstance(v, int | float)]
    assert len(numbers) >= 20
    for key in numbers:
        assert f"\nws_mode_{key} " in text or f"\nws_mode_{key}_total " in text, key


def test_every_number_of_the_stats_table_is_exported_under_its_own_name_and_kind() -> None:
    middleware = WebSocketModeMiddleware(Starlette())
    families = scrape(registered(middleware))
    for key, kind, documentation in METRICS:
        family = families.get(family_name(key, kind))
        assert family is not None, key
        assert family.type == kind, key
        assert family.documentation == documentation, key


def test_without_a_memory_budget_its_numbers_are_left_out_and_the_rest_exported() -> None:
    middleware = WebSocketModeMiddleware(Starlette())
    middleware.stats.budget = None  # a Stats of its own, outside a middleware
    families = scrape(registered(middleware))
    exported = {family_name(key, kind) for key, kind, _doc in METRICS}
    memory = {family_name(key, kind) for key, kind, _doc in METRICS if key.startswith("memory_")}
    others = exported - memory
    assert memory
    assert not memory & set(families)
    assert others <= set(families)


def test_the_numbers_are_read_at_every_scrape() -> None:
    middleware = WebSocketModeMiddleware(Starlette())
    registry = registered(middleware)
    assert value(scrape(registry)["ws_mode_turns"], "ws_mode_turns_total") == 0
    middleware.stats.turns += 5
    middleware.stats.connections_open = 2
    middleware.stats.error("rate_limit_exceeded")
    families = scrape(registry)
    assert value(families["ws_mode_turns"], "ws_mode_turns_total") == 5
    assert value(families["ws_mode_connections_open"], "ws_mode_connections_open") == 2
    errors = families["ws_mode_errors"]
    assert value(errors, "ws_mode_errors_total", code="rate_limit_exceeded") == 1


def test_the_turn_latency_is_a_histogram_of_the_stats_buckets() -> None:
    middleware = WebSocketModeMiddleware(Starlette())
    for seconds in (0.003, 0.2, 0.2, 100.0):
        middleware.stats.turn_finished(seconds, failed=False)
    histogram = scrape(registered(middleware))["ws_mode_turn_seconds"]
    assert histogram.type == "histogram"
    buckets = {
        sample.labels["le"]: sample.value
        for sample in histogram.samples
        if sample.name == "ws_mode_turn_seconds_bucket"
    }
    assert list(buckets) == [repr(bound) for bound in LATENCY_BUCKETS] + ["+Inf"]
    assert buckets["0.005"] == 1
    assert buckets["0.1"] == 1
    assert buckets["0.25"] == 3  # cumulative
    assert buckets["60.0"] == 3
    assert buckets["+Inf"] == 4  # past the last bound
    assert value(histogram, "ws_mode_turn_seconds_count") == 4
    assert value(histogram, "ws_mode_turn_seconds_sum") == 0.003 + 0.2 + 0.2 + 100.0


def test_a_prefix_names_every_metric() -> None:
    middleware = WebSocketModeMiddleware(Starlette())
    names = set(scrape(registered(middleware, prefix="edge")))
    assert names
    assert all(name.startswith("edge_") for name in names)
    assert {"edge_turns", "edge_errors", "edge_turn_seconds"} <= names


def test_two_middlewares_are_told_apart_by_their_prefixes() -> None:
    first, second = WebSocketModeMiddleware(Starlette()), WebSocketModeMiddleware(Starlette())
    first.stats.turns = 1
    second.stats.turns = 2
    registry = CollectorRegistry()
    register(first, registry, prefix="a")
    register(second, registry, prefix="b")
    families = scrape(registry)
    assert value(families["a_turns"], "a_turns_total") == 1
    assert value(families["b_turns"], "b_turns_total") == 2
