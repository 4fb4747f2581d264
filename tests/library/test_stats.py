"""The counters a deployment watches, read through `middleware.stats` (their Prometheus export
is tests/library/test_prometheus.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.servers import serve
from ws_mode import Limits, WebSocketModeMiddleware


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
    assert latency["buckets"][-1] == (float("inf"), 4)
    assert latency["sum"] > 0
