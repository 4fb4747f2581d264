"""`store: false` is honoured wherever it is said: `store` is validated as the API validates
it (a boolean or null; `0` and `"false"` are refused, never read as true), and a response
whose request or response object says false is never persisted, over the socket and over
stateful HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.client_tls import CLIENT_TLS
from tests.servers import serve
from tests.store_kit import FIELDS, answers, key, private_handler, turn, who
from ws_mode import WebSocketModeMiddleware
from ws_mode._store import MemoryStore
from ws_mode.testing._client import connect
from ws_mode.toolkit.reference import ReferenceConfig, create_app

NOT_BOOLEANS: list[Any] = [0, 1, "false", "true", [], {}]


class Served:
    def __init__(self, base_url: str, middleware: WebSocketModeMiddleware, store: MemoryStore):
        self.base_url = base_url
        self.middleware = middleware
        self.store = store


@pytest.fixture(scope="module")
def reference() -> Iterator[Served]:
    store = MemoryStore()
    app = create_app(ReferenceConfig(tool_calls=1, answer_tokens=3))
    middleware = WebSocketModeMiddleware(app, store=store, authenticate=who, stateful_http=True)
    with serve(middleware) as base_url:
        yield Served(base_url, middleware, store)


@pytest.fixture
def private() -> Iterator[Served]:
    store = MemoryStore()
    middleware = WebSocketModeMiddleware(
        private_handler, store=store, authenticate=who, stateful_http=True
    )
    with serve(middleware) as base_url:
        yield Served(base_url, middleware, store)


@pytest.mark.parametrize("value", NOT_BOOLEANS, ids=repr)
def test_a_store_that_is_not_a_boolean_is_refused_over_the_socket(
    reference: Served, value: Any
) -> None:
    before = (len(reference.store), reference.middleware.stats.turns)
    event = turn(reference.base_url, input="Keep this?", store=value, stream_id="lane")
    assert event["type"] == "error", event
    assert event["status"] == 400
    assert event["stream_id"] == "lane"
    error = event["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "invalid_type",
        "store",
    )
    assert "boolean" in error["message"]
    assert (len(reference.store), reference.middleware.stats.turns) == before  # no handler ran


@pytest.mark.parametrize("value", NOT_BOOLEANS, ids=repr)
def test_a_store_that_is_not_a_boolean_is_refused_over_stateful_http(
    private: Served, value: Any
) -> None:
    """Refused before the handler (which here validates nothing) is called."""
    body = {**FIELDS, "input": "Keep this?", "store": value}
    answer = httpx.post(
        private.base_url + "/v1/responses",
        json=body,
        headers=key("alice"),
        timeout=10,
        verify=CLIENT_TLS,
    )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "invalid_type",
        "store",
    )
    assert "boolean" in error["message"]


@pytest.mark.parametrize("value", [True, None], ids=repr)
def test_true_and_null_are_stored(reference: Served, value: Any) -> None:
    event = turn(reference.base_url, input="Keep this.", store=value)
    assert event["type"] == "response.completed", event
    response = event["response"]
    again = turn(reference.base_url, input=answers(response), previous_response_id=response["id"])
    assert again["type"] == "response.completed", again  # hydrated on a new socket


def test_a_response_object_saying_store_false_is_never_persisted_over_the_socket(
    private: Served,
) -> None:
    with connect(private.base_url, headers=key("alice")) as socket:
        socket.send({"type": "response.create", **FIELDS, "input": "Secret"})
        first = socket.receive_turn(timeout=10)[-1]
        assert first["type"] == "response.completed", first
        assert first["response"]["store"] is False
        socket.send(
            {
                "type": "response.create",
                **FIELDS,
                "input": "More",
                "store": True,  # the request allows it; its context does not
                "previous_response_id": first["response"]["id"],
            }
        )
        child = socket.receive_turn(timeout=10)[-1]
        assert child["type"] == "response.completed", child  # the connection's cache serves
    for response_id in (first["response"]["id"], child["response"]["id"]):
        event = turn(private.base_url, input="Again", previous_response_id=response_id)
        assert event["error"]["code"] == "previous_response_not_found", event
    assert len(private.store) == 0
    assert private.middleware.stats.store_writes == 0


@pytest.mark.parametrize("stream", [False, True])
def test_a_response_object_saying_store_false_is_not_kept_by_stateful_http(
    private: Served, stream: bool
) -> None:
    body = {**FIELDS, "input": "Secret", "stream": stream}
    with httpx.Client(
        verify=CLIENT_TLS, base_url=private.base_url, headers=key("alice"), timeout=10
    ) as http:
        answer = http.post("/v1/responses", json=body)
        assert answer.status_code == 200
        text = answer.text
        response_id = text.split('"id":"resp_', 1)[1].split('"', 1)[0]
        assert http.get(f"/v1/responses/resp_{response_id}").status_code == 404
    assert len(private.store) == 0
