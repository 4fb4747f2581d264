"""The reference server's Starlette app (`ws_mode.toolkit.reference.server`): routes, arguments, the
Turn that resolves `previous_response_id`, and answers behind the real middleware."""

from __future__ import annotations

import importlib
from typing import Any, Literal

import orjson
import pytest
from openai.types.responses import Response
from starlette.testclient import TestClient

from tests.toolkit.reference.helpers import USER, assert_error, call_output
from ws_mode._cache import CachedResponse
from ws_mode._protocol import FAILURE_EVENTS
from ws_mode._turn import Turn
from ws_mode.toolkit.reference import ReferenceConfig, create_app


def test_create_app_validates_arguments() -> None:
    with pytest.raises(ValueError, match="path"):
        create_app(path="v1/responses")
    with pytest.raises(TypeError, match="ReferenceConfig"):
        create_app({"tool_calls": 1})  # type: ignore[arg-type]


def test_full_agent_loop_over_http(client: TestClient) -> None:
    context: list[dict[str, Any]] = [USER]
    kinds = []
    for _ in range(3):
        data = client.post("/v1/responses", json={"input": context}).json()
        Response.model_validate(data)
        (item,) = data["output"]
        kinds.append(item["type"])
        context = [*context, item]
        if item["type"] == "function_call":
            context.append(call_output(item))
    assert kinds == ["function_call", "function_call", "message"]
    assert "after 2 tool calls." in context[-1]["content"][0]["text"]


def test_previous_response_id_without_a_turn(client: TestClient) -> None:
    reply = client.post("/v1/responses", json={"input": [USER], "previous_response_id": "resp_1"})
    message = assert_error(reply, "previous_response_not_found", "previous_response_id")
    assert message == "Previous response with id 'resp_1' not found."


def install_turn(monkeypatch: pytest.MonkeyPatch, found: Turn | None) -> list[object]:
    """Make `ws_mode._turn.turn` return `found`; return the arguments it gets called with."""
    calls: list[object] = []

    def fake(request_or_scope: object) -> Turn | None:
        calls.append(request_or_scope)
        return found

    monkeypatch.setattr(importlib.import_module("ws_mode._turn"), "turn", fake)
    return calls


def test_previous_response_id_uses_the_turn_history(monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_app(ReferenceConfig(tool_calls=1))
    with TestClient(app) as test_client:
        first = test_client.post("/v1/responses", json={"input": [USER]}).json()
        (call,) = first["output"]
        history = [USER, call, call_output(call)]
        over_http = test_client.post("/v1/responses", json={"input": history}).json()

        # A parent without the server's artifacts (made elsewhere): the whole history is used.
        parent = CachedResponse(
            id=first["id"], response=first, input_items=[USER], output_items=[call], parent=None
        )
        found = Turn(
            previous=parent, new_input=[call_output(call)], full_context=False, cache_aware=True
        )
        calls = install_turn(monkeypatch, found)
        app.state.reference_stats.reset()
        body = {"input": [call_output(call)], "previous_response_id": first["id"]}
        raw = orjson.dumps(body)
        continued = test_client.post("/v1/responses", content=raw).json()
    assert len(calls) == 1
    assert continued["previous_response_id"] == first["id"]
    assert continued["output"] == over_http["output"]
    assert continued["usage"] == over_http["usage"]
    assert continued["output"][0]["type"] == "message"
    stats = app.state.reference_stats
    assert (stats.requests, stats.bytes_parsed, stats.items_seen, stats.resumed) == (
        1,
        len(raw),
        3,
        0,
    )
    # The turn now carries what the next one resumes from.
    assert set(found.artifacts) == {"ws_mode.toolkit.reference"}


def test_turn_without_a_previous_is_a_miss(monkeypatch: pytest.MonkeyPatch) -> None:
    install_turn(monkeypatch, Turn(previous=None, new_input=[USER]))
    with TestClient(create_app()) as test_client:
        reply = test_client.post(
            "/v1/responses", json={"input": [USER], "previous_response_id": "resp_2"}
        )
        assert_error(reply, "previous_response_not_found", "previous_response_id")
        # Without previous_response_id the body's input is the context, Turn or not.
        assert test_client.post("/v1/responses", json={"input": [USER]}).status_code == 200


def test_healthz_and_custom_path() -> None:
    with TestClient(create_app(path="/api/responses")) as test_client:
        health = test_client.get("/healthz")
        assert (health.status_code, health.text) == (200, "ok")
        assert test_client.post("/api/responses", json={"input": "hi"}).status_code == 200
        assert test_client.post("/v1/responses", json={"input": "hi"}).status_code == 404
        assert test_client.get("/api/responses").status_code == 405


# --- behind the real middleware -------------------------------------------------------------


@pytest.mark.parametrize("full_context", ["always", "on_miss"])
def test_websocket_mode_matches_http(full_context: Literal["always", "on_miss"]) -> None:
    """Over ws_mode, each turn sends only its new items and gets what HTTP gets for the whole
    history (with on_miss, through `turn(request).history()`)."""
    from ws_mode import WebSocketModeMiddleware

    inner = create_app(ReferenceConfig(tool_calls=2, answer_tokens=5))
    app = WebSocketModeMiddleware(inner, full_context=full_context)
    new: list[dict[str, Any]] = [USER]
    history = list(new)
    previous: str | None = None
    kinds = []
    with TestClient(app) as test_client, test_client.websocket_connect("/v1/responses") as ws:
        for _ in range(3):
            create = {"type": "response.create", "input": new, "previous_response_id": previous}
            ws.send_text(orjson.dumps(create).decode())
            while (event := orjson.loads(ws.receive_text()))["type"] != "response.completed":
                assert event["type"] not in FAILURE_EVENTS, event
            response = event["response"]
            assert response["previous_response_id"] == previous
            over_http = test_client.post("/v1/responses", json={"input": history}).json()
            assert response["output"] == over_http["output"]
            (item,) = response["output"]
            kinds.append(item["type"])
            previous = response["id"]
            new = [call_output(item)] if item["type"] == "function_call" else [USER]
            history = [*history, item, *new]
    assert kinds == ["function_call", "function_call", "message"]
