"""`ws_mode.prometheus`: every key of the `Stats` table (`METRICS`) exported under its own name
and kind, read at every scrape; one middleware (`register`) or every middleware of the process,
told apart by a label (`metrics_app`, `with_metrics`), scraped over HTTP from a real uvicorn
after real socket turns; and docs/operations.md's table of metrics, kept in step with a scrape."""

from __future__ import annotations

import gc
import itertools
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from ws_mode import ConfigError, Limits, MemoryStore, WebSocketModeMiddleware, find_middlewares
from ws_mode._asgi import Receive, Scope, Send
from ws_mode._logs import LOG_VALUE_CHARS, cut
from ws_mode._stats import (
    CACHE_RATIO_BUCKETS,
    ERROR_CODE_LABELS,
    LATENCY_BUCKETS,
    METRICS,
    MODEL_LABELS,
    OTHER_LABEL,
    TOKEN_KINDS,
    live_stats,
)
from ws_mode._stats import Metric as StatsMetric
from ws_mode._tap import Usage
from ws_mode.prometheus import (
    MiddlewaresCollector,
    StatsCollector,
    metrics_app,
    register,
    register_all,
    with_metrics,
)
from ws_mode.testing._client import connect
from ws_mode.testing._loopback import ServerThread

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def scrape_text(text: str) -> dict[str, Metric]:
    """Metrics as a scraper reads them, by family name."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def scrape(registry: CollectorRegistry) -> dict[str, Metric]:
    return scrape_text(generate_latest(registry).decode())


def value(family: Metric, sample: str, **labels: str) -> float:
    (found,) = [s.value for s in family.samples if s.name == sample and s.labels == labels]
    return found


def family_name(metric: StatsMetric, prefix: str = "ws_mode") -> str:
    """The family a `METRICS` key is exported as, as the parser names it: a counter's samples
    end in `_total`, which its family's name leaves out (`connections_total` is sampled as
    `..._connections_total`); the latency histogram is in seconds."""
    if metric.key == "turn_latency":
        return f"{prefix}_turn_seconds"
    if metric.kind in ("counter", "counters by code", "tokens by model"):
        return f"{prefix}_{metric.key.removesuffix('_total')}"
    return f"{prefix}_{metric.key}"


def registered(middleware: WebSocketModeMiddleware, **options: str) -> CollectorRegistry:
    registry = CollectorRegistry()
    collector = register(middleware, registry, **options)
    assert isinstance(collector, StatsCollector)
    assert collector.middleware is middleware
    return registry


@pytest.fixture
def only_these() -> None:
    """The middlewares other tests let go, freed: the process's collector sees only the live."""
    gc.collect()


# --- one middleware: register ----------------------------------------------------------------


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
    for store in ("writes", "failures", "hydrations", "refused", "dropped"):
        assert f"ws_mode_store_{store}_total 0.0" in text  # every counter of the store too


def test_every_key_of_the_stats_table_is_exported_under_its_own_name_and_kind() -> None:
    # Both are made from one table (ws_mode._stats.METRICS): a key added to it is exported
    # with its kind and help, errors and the latency histogram included.
    middleware = WebSocketModeMiddleware(Starlette())
    middleware.stats.error("invalid_json")
    families = scrape(registered(middleware))
    prometheus_type = {
        "counters by code": "counter",
        "tokens by model": "counter",
        "histogram by model": "histogram",
    }
    assert len(METRICS) >= 23
    for metric in METRICS:
        family = families.get(family_name(metric))
        assert family is not None, metric.key
        assert family.type == prometheus_type.get(metric.kind, metric.kind), metric.key
        assert family.documentation == metric.help, metric.key
    assert set(families) == {family_name(metric) for metric in METRICS}


def test_without_a_memory_budget_its_numbers_are_left_out_and_the_rest_exported() -> None:
    middleware = WebSocketModeMiddleware(Starlette())
    middleware.stats.budget = None  # a Stats of its own, outside a middleware
    families = scrape(registered(middleware))
    exported = {family_name(metric) for metric in METRICS}
    memory = {family_name(metric) for metric in METRICS if metric.key.startswith("memory_")}
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
    middleware.stats.store_failures += 1
    middleware.stats.error("rate_limit_exceeded")
    families = scrape(registry)
    assert value(families["ws_mode_turns"], "ws_mode_turns_total") == 5
    assert value(families["ws_mode_connections_open"], "ws_mode_connections_open") == 2
    assert value(families["ws_mode_store_failures"], "ws_mode_store_failures_total") == 1
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
    assert buckets == middleware.stats.snapshot()["turn_latency"]["buckets"]
    assert buckets["0.005"] == 1
    assert buckets["0.1"] == 1
    assert buckets["0.25"] == 3  # cumulative
    assert buckets["60.0"] == 3
    assert buckets["+Inf"] == 4  # past the last bound
    assert value(histogram, "ws_mode_turn_seconds_count") == 4
    assert value(histogram, "ws_mode_turn_seconds_sum") == 0.003 + 0.2 + 0.2 + 100.0


def test_tokens_are_counted_by_model_and_kind_under_a_bounded_set_of_model_labels() -> None:
    middleware = WebSocketModeMiddleware(Starlette())
    stats = middleware.stats
    stats.count_tokens("gpt-a", Usage(100, 40, 20, 5))
    stats.count_tokens("gpt-a", Usage(10, 0, 2, 0))
    for index in range(MODEL_LABELS + 3):  # a handler echoing whatever model it was asked
        stats.count_tokens(f"echoed-{index}", Usage(1, 0, 1, 0))
    stats.count_tokens(None, Usage(7, 0, 0, 0))  # a response naming no model
    tokens = scrape(registered(middleware))["ws_mode_tokens"]
    assert tokens.type == "counter"
    counted = {
        (sample.labels["model"], sample.labels["kind"]): sample.value
        for sample in tokens.samples
        if sample.name == "ws_mode_tokens_total"
    }
    assert {kind for _model, kind in counted} == set(TOKEN_KINDS)
    assert [counted["gpt-a", kind] for kind in TOKEN_KINDS] == [110, 40, 22, 5]
    models = {model for model, _kind in counted}
    # The first models to report get labels of their own, the rest (and no model) one label.
    assert len(models) == MODEL_LABELS + 1
    assert "echoed-62" in models
    assert "echoed-63" not in models
    assert counted[OTHER_LABEL, "input"] == 4 + 7
    assert counted[OTHER_LABEL, "output"] == 4
    assert sum(count for (_m, kind), count in counted.items() if kind == "input") == (
        110 + MODEL_LABELS + 3 + 7
    )


def test_error_codes_are_counted_under_a_bounded_set_of_cut_code_labels() -> None:
    # A handler or an upstream failing with codes of its own making, each new and 1,000
    # characters long: unbounded, 20,000 of them made 20,000 series and a 20 MiB scrape.
    middleware = WebSocketModeMiddleware(Starlette())
    stats = middleware.stats
    stats.error("invalid_json")
    made_up = [f"{index:05d}-" + "x" * 994 for index in range(20_000)]
    for code in made_up:
        stats.error(code)
    stats.error("invalid_json")  # a code with a label already keeps counting under it
    stats.error("previous_response_not_found")  # a new code past the bound: `other`
    text = generate_latest(registered(middleware))
    errors = scrape_text(text.decode())["ws_mode_errors"]
    counted = {
        sample.labels["code"]: sample.value
        for sample in errors.samples
        if sample.name == "ws_mode_errors_total"
    }
    assert len(counted) == ERROR_CODE_LABELS + 1  # the first codes, then `other`
    assert counted["invalid_json"] == 2
    assert counted[OTHER_LABEL] == len(made_up) - (ERROR_CODE_LABELS - 1) + 1
    assert sum(counted.values()) == len(made_up) + 3
    # Each label is cut as a log value is: its start, and how long it was.
    assert cut(made_up[0]) in counted
    assert made_up[0] not in counted
    assert max(len(code) for code in counted) == len(cut(made_up[0])) < LOG_VALUE_CHARS + 30
    assert stats.snapshot()["errors"] == counted
    # The scrape holds a bounded number of series of bounded length: 20,000 codes' worth
    # would be over 20 MB.
    assert len(text) < (ERROR_CODE_LABELS + 1) * (LOG_VALUE_CHARS + 200) + 20_000


async def fail_with_a_code_of_its_own(request: Request) -> JSONResponse:
    """A handler answering each request with an error whose code it makes up from the input,
    1,000 characters long (an upstream's error passed on as it came)."""
    body = await request.json()
    code = f"{body['input']}-" + "x" * 1_000
    error = {"type": "invalid_request_error", "code": code, "message": "refused"}
    return JSONResponse({"error": error}, status_code=400)


def test_error_codes_a_real_handler_makes_up_are_bounded_in_a_scrape_over_http() -> None:
    app = FastAPI()
    app.post("/v1/responses")(fail_with_a_code_of_its_own)
    app.add_middleware(WebSocketModeMiddleware)
    (middleware,) = find_middlewares(app)
    middleware.stats.name = "made-up-codes"
    served = with_metrics(app, registry=CollectorRegistry())
    turns = ERROR_CODE_LABELS + 40
    with ServerThread(served, lifespan="on") as origin, connect(origin) as socket:
        # One socket, the creates sent at once: the lane answers them in order.
        for index in range(turns):
            socket.send({"type": "response.create", "model": "m", "input": f"turn-{index}"})
        codes = [socket.receive(timeout=10)["error"]["code"] for _ in range(turns)]
        samples = scraped(origin, "made-up-codes")["ws_mode_errors_total"]
    # The client heard every code whole; the metric counts them all, under bounded labels.
    assert codes == [f"turn-{index}-" + "x" * 1_000 for index in range(turns)]
    assert len(samples) == ERROR_CODE_LABELS + 1
    assert samples[f"code={OTHER_LABEL}"] == turns - ERROR_CODE_LABELS
    assert sum(samples.values()) == turns
    assert f"code={cut(codes[0])}" in samples
    assert all(len(label) <= len("code=") + len(cut(codes[0])) for label in samples)


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


# --- every middleware of the process: register_all, metrics_app, with_metrics ---------------


def test_every_middleware_of_the_process_is_exported_with_its_label(only_these: None) -> None:
    edge, internal = WebSocketModeMiddleware(Starlette()), WebSocketModeMiddleware(Starlette())
    edge.stats.name, internal.stats.name = "edge", "internal"
    edge.stats.turns, internal.stats.turns = 1, 2
    internal.stats.error("invalid_json")
    internal.stats.turn_finished(0.02, failed=False)
    registry = CollectorRegistry()
    collector = register_all(registry)
    assert isinstance(collector, MiddlewaresCollector)
    families = scrape(registry)
    turns = families["ws_mode_turns"]
    assert value(turns, "ws_mode_turns_total", middleware="edge") == 1
    assert value(turns, "ws_mode_turns_total", middleware="internal") == 2
    errors = families["ws_mode_errors"]
    assert value(errors, "ws_mode_errors_total", middleware="internal", code="invalid_json") == 1
    latency = families["ws_mode_turn_seconds"]
    assert value(latency, "ws_mode_turn_seconds_count", middleware="internal") == 1
    assert value(latency, "ws_mode_turn_seconds_bucket", middleware="internal", le="+Inf") == 1
    # Every family of the table, each sample labelled (other tests' middlewares that are still
    # alive in this process may be scraped too: only the label is asserted of those).
    assert {family_name(metric) for metric in METRICS} <= set(families)
    for metric in METRICS:
        samples = families[family_name(metric)].samples
        if metric.kind in ("counter", "gauge"):  # errors: only the codes that were counted
            assert {s.labels["middleware"] for s in samples} >= {"edge", "internal"}, metric
        assert all("middleware" in sample.labels for sample in samples)


def test_unnamed_middlewares_are_labelled_default_in_the_order_they_were_made(
    only_these: None,
) -> None:
    first, second = WebSocketModeMiddleware(Starlette()), WebSocketModeMiddleware(Starlette())
    twin_a, twin_b = WebSocketModeMiddleware(Starlette()), WebSocketModeMiddleware(Starlette())
    twin_a.stats.name = twin_b.stats.name = "twin-of-this-test"
    # Turn counts no other middleware has, to find these four among any other live ones (the
    # tests share a process: middlewares made before these, still alive, come first).
    for count, middleware in enumerate((first, second, twin_a, twin_b), start=1001):
        middleware.stats.turns = count
    registry = CollectorRegistry()
    register_all(registry)
    samples = scrape(registry)["ws_mode_turns"].samples
    label_of = {sample.value: sample.labels["middleware"] for sample in samples}

    def default_rank(label: str) -> int:
        assert label == "default" or label.startswith("default-"), label
        return 1 if label == "default" else int(label.removeprefix("default-"))

    assert default_rank(label_of[1001]) < default_rank(label_of[1002])
    assert (label_of[1003], label_of[1004]) == ("twin-of-this-test", "twin-of-this-test-2")


def test_a_middleware_let_go_leaves_the_scrape(only_these: None) -> None:
    middleware = WebSocketModeMiddleware(Starlette())
    middleware.stats.name = "short-lived"
    registry = CollectorRegistry()
    register_all(registry)
    assert "short-lived" in generate_latest(registry).decode()
    del middleware
    gc.collect()
    assert "short-lived" not in generate_latest(registry).decode()


def test_register_all_registers_once_per_registry_and_prefix() -> None:
    middleware = WebSocketModeMiddleware(Starlette())
    registry = CollectorRegistry()
    first = register_all(registry)
    assert register_all(registry) is first
    metrics_app(registry)  # registers nothing more
    assert register_all(registry, prefix="edge") is not first
    text = generate_latest(registry).decode()
    assert text.count("# TYPE ws_mode_turns_total counter") == 1
    assert "# TYPE edge_turns_total counter" in text
    assert middleware.stats in live_stats()


def test_one_middleware_and_every_middleware_under_one_prefix_clash_at_once() -> None:
    # Two collectors giving the same names would make a scrape Prometheus rejects: the registry
    # refuses the second when it is registered, even with no middleware alive yet.
    registry = CollectorRegistry()
    register_all(registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        register(WebSocketModeMiddleware(Starlette()), registry)
    register(WebSocketModeMiddleware(Starlette()), registry, prefix="one")


async def bare_app(scope: Scope, receive: Receive, send: Send) -> None:
    """A plain ASGI app: 200 "app" for every request."""
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"app"})


def test_with_metrics_answers_its_path_and_passes_everything_else_on() -> None:
    registry = CollectorRegistry()
    middleware = WebSocketModeMiddleware(bare_app)
    app = with_metrics(middleware, "/metrics", registry=registry)
    assert find_middlewares(app) == [middleware]  # drained by ws_mode.server.Server, found
    with ServerThread(app, lifespan="off") as origin:
        metrics = httpx.get(f"{origin}/metrics", timeout=10)
        other = httpx.get(f"{origin}/metrics/more", timeout=10)
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "# TYPE ws_mode_turns_total counter" in metrics.text
    assert other.text == "app"
    with pytest.raises(ConfigError, match="must start with /"):
        with_metrics(bare_app, "metrics")


def test_metrics_app_fits_where_any_asgi_app_goes() -> None:
    # Mounted as a route: HTTP gets the metrics; a socket to it is refused, not crashed.
    app = Starlette(routes=[Route("/metrics", metrics_app(CollectorRegistry()))])
    with ServerThread(app, lifespan="on") as origin:
        assert httpx.get(f"{origin}/metrics", timeout=10).status_code == 200
        with pytest.raises(Exception, match="403"):
            connect(origin, "/metrics")


# --- over HTTP from a real server, after real socket turns ----------------------------------


def responses_app(store: MemoryStore) -> FastAPI:
    """The documented FastAPI recipe: the middleware added, the metrics routed; a handler
    that answers each turn with one message."""
    app = FastAPI()
    numbers = itertools.count(1)

    @app.post("/v1/responses")
    async def create(request: Request) -> JSONResponse:
        await request.json()
        message = {
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "ok " * 50, "annotations": []}],
        }
        reply = {"object": "response", "status": "completed", "output": [message]}
        return JSONResponse({"id": f"resp_{next(numbers)}", **reply})

    @app.get("/healthz")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("ok")

    app.add_middleware(WebSocketModeMiddleware, store=store, shared_store=True)
    app.mount("/metrics", metrics_app())  # the default registry, registered once per process
    return app


def scraped(origin: str, name: str) -> dict[str, dict[str, float]]:
    """`GET /metrics` over HTTP: each sample of the middleware labelled `name`, by sample
    name and then by its other labels (`code=...`, `le=...`, or "")."""
    # As Prometheus scrapes it: Starlette redirects /metrics to the mount's /metrics/.
    answer = httpx.get(f"{origin}/metrics", timeout=10, follow_redirects=True)
    assert answer.status_code == 200
    samples: dict[str, dict[str, float]] = {}
    for family in scrape_text(answer.text).values():
        for sample in family.samples:
            labels = dict(sample.labels)
            if labels.pop("middleware", None) != name:
                continue
            rest = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
            samples.setdefault(sample.name, {})[rest] = sample.value
    return samples


def turn(origin: str, **fields: Any) -> dict[str, Any]:
    with connect(origin) as socket:
        socket.send({"type": "response.create", "model": "m", **fields})
        event: dict[str, Any] = socket.receive_turn(timeout=10)[-1]
    return event


def test_a_scrape_over_http_follows_real_socket_turns() -> None:
    app = responses_app(MemoryStore())
    with ServerThread(app, lifespan="on") as origin:
        # Only to find this middleware among the others of the test process: a deployment
        # has one, labelled "default", and needs no lookup.
        (middleware,) = find_middlewares(app)
        middleware.stats.name = "scraped"
        before = scraped(origin, "scraped")
        assert before["ws_mode_turns_total"] == {"": 0}
        assert before["ws_mode_store_writes_total"] == {"": 0}

        first = turn(origin, input="hello")
        assert first["type"] == "response.completed", first
        parent = first["response"]["id"]
        # A new socket: the parent is not in its cache, so it comes from the store.
        second = turn(
            origin, input=[{"role": "user", "content": "more"}], previous_response_id=parent
        )
        assert second["type"] == "response.completed", second
        missing = turn(origin, input="x", previous_response_id="resp_unknown")
        assert missing["type"] == "error"
        with connect(origin) as socket:
            socket.send("not json")
            assert socket.receive(timeout=10)["error"]["code"] == "invalid_json"
        plain = httpx.get(f"{origin}/healthz", timeout=10)  # plain HTTP passes by
        assert plain.text == "ok"
        after = scraped(origin, "scraped")

    assert after["ws_mode_connections_total"][""] == 4
    assert after["ws_mode_connections_open"][""] == 0
    assert after["ws_mode_turns_total"][""] == 2
    assert after["ws_mode_store_writes_total"][""] >= 2
    assert after["ws_mode_store_hydrations_total"][""] == 1
    assert after["ws_mode_store_failures_total"][""] == 0
    assert after["ws_mode_cache_misses_total"][""] == 2
    assert after["ws_mode_bytes_received_total"][""] > 0
    assert after["ws_mode_errors_total"] == {
        "code=previous_response_not_found": 1,
        "code=invalid_json": 1,
    }
    assert after["ws_mode_turn_seconds_count"][""] == 2
    assert after["ws_mode_turn_seconds_bucket"]["le=+Inf"] == 2
    assert after["ws_mode_memory_limit_bytes"][""] == Limits().max_memory_bytes


# --- docs/operations.md ----------------------------------------------------------------------


def metrics_table() -> str:
    """The table of every metric, made from a scrape of a middleware with every kind of
    sample: what docs/operations.md must show."""
    middleware = WebSocketModeMiddleware(Starlette())
    registry = CollectorRegistry()
    register(middleware, registry)
    families = scrape(registry)
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for metric in METRICS:
        family = families[family_name(metric)]
        if family.type == "counter":
            shown = f"`{family.name}_total`"
        elif family.type == "histogram":
            shown = f"`{family.name}_bucket`, `_sum`, `_count`"
        else:
            shown = f"`{family.name}`"
        labels = ["`middleware`"]
        if metric.kind == "counters by code":
            labels.append("`code`")
        if metric.kind == "tokens by model":
            labels += ["`model`", "`kind`"]
        if metric.kind == "histogram by model":
            labels += ["`model`", "`turn`"]
        if family.type == "histogram":
            labels.append("`le`")
        meaning = family.documentation
        rows.append(f"| {shown} | {family.type} | {', '.join(labels)} | {meaning} |")
    return "\n".join(rows) + "\n"


def test_the_operations_page_lists_every_metric_as_a_scrape_shows_it() -> None:
    page = OPERATIONS.read_text(encoding="utf-8")
    table = metrics_table()
    assert table in page, f"docs/operations.md's table of metrics should read:\n\n{table}"


def test_every_metric_the_operations_page_names_exists() -> None:
    # The alerts and queries quote real names: a renamed metric breaks this test, not an alert.
    middleware = WebSocketModeMiddleware(Starlette())
    registry = CollectorRegistry()
    register(middleware, registry)
    families = scrape(registry)
    samples = {
        f"{family.name}{suffix}"
        for family in families.values()
        for suffix in {
            "counter": ("_total",),
            "gauge": ("",),
            "histogram": ("_bucket", "_sum", "_count", ""),
        }[family.type]
    }
    page = OPERATIONS.read_text(encoding="utf-8")
    named = set(re.findall(r"\bws_mode_[a-z_]+[a-z]\b", page))
    assert named
    assert named - samples == set()


def test_the_operations_pages_alerts_are_prometheus_rules() -> None:
    page = OPERATIONS.read_text(encoding="utf-8")
    (block,) = re.findall(r"```yaml\n(.*?)```", page, flags=re.DOTALL)
    (group,) = yaml.safe_load(block)["groups"]
    alerts = {rule["alert"]: rule for rule in group["rules"]}
    assert {
        "WsModeStoreFailing",
        "WsModeMemoryBudgetNearFull",
        "WsModeConnectionsNearLimit",
    } <= set(alerts)
    for rule in alerts.values():
        assert re.search(r"\bws_mode_\w+", rule["expr"]), rule
        assert rule["annotations"]["summary"]


def test_the_prompt_cache_ratio_is_a_histogram_by_model_and_turn() -> None:
    middleware = WebSocketModeMiddleware(Starlette())
    stats = middleware.stats
    stats.count_tokens("m", Usage(1000, 0, 10, 0), continuation=False)  # a first turn: cold
    stats.count_tokens("m", Usage(1000, 900, 10, 0), continuation=True)
    stats.count_tokens("m", Usage(1000, 1000, 10, 0), continuation=True)
    stats.count_tokens("m", Usage(0, 0, 10, 0), continuation=True)  # no input: no ratio
    stats.count_tokens("m", Usage(1000, 500, 10, 0))  # not a turn's: tokens only
    histogram = scrape(registered(middleware))["ws_mode_prompt_cache_ratio"]
    assert histogram.type == "histogram"

    def buckets(turn: str) -> dict[str, float]:
        return {
            sample.labels["le"]: sample.value
            for sample in histogram.samples
            if sample.name == "ws_mode_prompt_cache_ratio_bucket"
            and sample.labels == {**sample.labels, "model": "m", "turn": turn}
        }

    first, continuation = buckets("first"), buckets("continuation")
    assert list(first) == [repr(bound) for bound in CACHE_RATIO_BUCKETS] + ["+Inf"]
    assert (first["0.0"], first["+Inf"]) == (1, 1)
    assert (continuation["0.75"], continuation["0.9"], continuation["1.0"]) == (0, 1, 2)
    ratio_sum = value(histogram, "ws_mode_prompt_cache_ratio_sum", model="m", turn="continuation")
    assert ratio_sum == pytest.approx(1.9)
    ratios = stats.snapshot()["prompt_cache_ratio"]
    assert ratios["m"]["continuation"]["count"] == 2
    assert ratios["m"]["first"]["buckets"] == first
