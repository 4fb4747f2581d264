"""The counters a deployment watches, read through `middleware.stats`: what each counts on real
sockets, the snapshot made of the `METRICS` table alone, and JSON-safe in every state (their
Prometheus export is tests/library/test_prometheus.py)."""

from __future__ import annotations

import gc
import json
import weakref
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.servers import serve
from ws_mode import Limits, Stats, WebSocketModeMiddleware
from ws_mode._budget import ACCOUNT
from ws_mode._stats import INF_BOUND, LATENCY_BUCKETS, METRICS, live_stats

MEMORY_KEYS = {metric.key for metric in METRICS if metric.key.startswith("memory_")}


async def handler(request: Request) -> JSONResponse:
    body = await request.json()
    if body.get("model") == "fail":
        error = {"type": "server_error", "code": "model_overloaded", "message": "busy"}
        return JSONResponse({"error": error}, status_code=503)
    item = {
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "x" * 100, "annotations": []}],
    }
    return JSONResponse(
        {
            "id": f"resp_{len(body['input'])}",
            "object": "response",
            "status": "completed",
            "output": [item],
        }
    )


def create(socket: ClientConnection, **fields: Any) -> dict[str, Any]:
    socket.send(json.dumps({"type": "response.create", "model": "m", **fields}))
    while True:
        event: dict[str, Any] = json.loads(socket.recv(timeout=10))
        if event["type"] in ("response.completed", "error"):
            return event


def test_counters_follow_the_traffic() -> None:
    app = Starlette(routes=[Route("/v1/responses", handler, methods=["POST"])])
    middleware = WebSocketModeMiddleware(
        app, limits=Limits(max_connections=1, max_cached_responses=2)
    )
    with serve(middleware) as base_url:
        url = base_url.replace("http", "ws", 1) + "/v1/responses"
        with connect(url) as socket:
            first = create(socket, input="hello there")["response"]["id"]
            second = create(socket, input="more", previous_response_id=first)["response"]["id"]
            create(socket, input="even more", previous_response_id=second)
            create(socket, input="x", previous_response_id="resp_unknown")
            create(socket, model="fail", input="x")
            create(socket, input="warm", generate=False)
            socket.send("not json")
            socket.recv(timeout=10)
            open_now = middleware.stats.snapshot()["connections_open"]
            with pytest.raises(InvalidStatus):
                connect(url)
        snapshot = middleware.stats.snapshot()
    assert open_now == 1
    assert snapshot["connections_open"] == 0
    assert snapshot["connections_total"] == 1
    assert snapshot["connections_refused"] == 1
    assert snapshot["turns"] == 4
    assert snapshot["turns_failed"] == 1
    assert snapshot["warm_ups"] == 1
    assert (snapshot["cache_hits"], snapshot["cache_misses"]) == (2, 1)
    assert snapshot["cache_evictions"] >= 2  # three responses and a warm-up in a cache of two
    # The client did not re-send the first turn's context, then the first two turns'.
    assert snapshot["bytes_saved"] > 2 * 100
    assert snapshot["errors"] == {
        "previous_response_not_found": 1,
        "model_overloaded": 1,
        "invalid_json": 1,
    }
    latency = snapshot["turn_latency"]
    assert latency["count"] == 4
    assert latency["buckets"]["+Inf"] == 4
    assert latency["sum"] > 0
    assert_json_safe(snapshot)


def assert_json_safe(snapshot: dict[str, Any]) -> None:
    """Standard JSON (no NaN, no Infinity) takes the snapshot, and orjson too, and both give it
    back as it was: only strings, numbers and dicts."""
    text = json.dumps(snapshot, allow_nan=False)
    assert json.loads(text) == snapshot
    assert orjson.loads(orjson.dumps(snapshot)) == snapshot


def test_a_fresh_snapshot_is_json() -> None:
    assert_json_safe(Stats().snapshot())  # no budget: no memory numbers
    middleware = WebSocketModeMiddleware(Starlette())
    snapshot = middleware.stats.snapshot()
    assert_json_safe(snapshot)
    assert snapshot["memory_limit_bytes"] == Limits().max_memory_bytes


def test_a_snapshot_with_every_bucket_and_a_used_budget_is_json() -> None:
    # The budget's account is the process's: the limit leaves room for 10 kB beyond its use.
    room = ACCOUNT.used + 10_000
    middleware = WebSocketModeMiddleware(Starlette(), limits=Limits(max_memory_bytes=room))
    stats = middleware.stats
    for seconds in (0.0, 0.004, 1.0, 59.0, 60.0, 61.0, 1e9):
        stats.turn_finished(seconds, failed=seconds > 60)
    stats.error("invalid_json")
    stats.error(None)
    assert stats.budget is not None
    assert stats.budget.reserve(4_000)
    assert not stats.budget.reserve(10_000)  # refused: counted
    try:
        snapshot = stats.snapshot()
    finally:
        stats.budget.release(4_000)
    assert_json_safe(snapshot)
    assert snapshot["memory_held_bytes"] == 4_000
    assert snapshot["memory_refusals"] == 1
    assert snapshot["errors"] == {"invalid_json": 1, "unknown": 1}
    latency = snapshot["turn_latency"]
    # Cumulative counts by bound, as Prometheus writes its `le` labels; the last "+Inf".
    assert list(latency["buckets"]) == [repr(bound) for bound in LATENCY_BUCKETS] + [INF_BOUND]
    assert latency["buckets"]["0.005"] == 2
    assert latency["buckets"]["1.0"] == 3
    assert latency["buckets"]["60.0"] == 5
    assert latency["buckets"][INF_BOUND] == latency["count"] == 7
    assert latency["sum"] == sum((0.0, 0.004, 1.0, 59.0, 60.0, 61.0, 1e9))
    assert snapshot["turns_failed"] == 2


def test_the_snapshot_gives_the_keys_of_the_table_and_only_them() -> None:
    with_budget = WebSocketModeMiddleware(Starlette()).stats.snapshot()
    assert list(with_budget) == [metric.key for metric in METRICS]
    without = Stats().snapshot()
    assert list(without) == [metric.key for metric in METRICS if metric.key not in MEMORY_KEYS]


def test_every_number_stats_keeps_is_in_the_table() -> None:
    # A counter added to Stats without its row in METRICS would be counted and never shown.
    keys = {metric.key for metric in METRICS}
    latency = {"latency_buckets", "latency_sum"}  # the parts of turn_latency
    kept = {
        name
        for name, value in vars(Stats()).items()
        if not name.startswith("_") and isinstance(value, int | float | dict | list)
    }
    assert kept - latency <= keys
    assert latency <= kept
    kinds = {metric.kind for metric in METRICS}
    assert kinds == {
        "counter",
        "gauge",
        "counters by code",
        "histogram",
        "tokens by model",
        "histogram by model",
    }


def test_every_stats_of_the_process_is_found_until_it_is_let_go() -> None:
    first, second = Stats(), Stats()
    found = live_stats()
    assert found.index(first) < found.index(second)  # oldest first
    middleware = WebSocketModeMiddleware(Starlette())
    assert middleware.stats in live_stats()
    gone = weakref.ref(middleware.stats)
    del middleware, found
    gc.collect()  # a middleware and its stats refer to each other: freed by a collection
    assert gone() is None
    assert all(stats is not None for stats in live_stats())
