"""Stateful HTTP from a store: `previous_response_id` over plain HTTP, `GET` and `DELETE`,
the same responses the sockets use."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from tests.client_tls import CLIENT_TLS
from tests.principals import by_bearer_token
from ws_mode import ConfigError, Limits, WebSocketModeMiddleware
from ws_mode._store import MemoryStore, StoredResponse
from ws_mode.testing._loopback import ServerThread
from ws_mode.toolkit.reference import ReferenceConfig, create_app

FIELDS: dict[str, Any] = {"model": "reference"}
KEY = {"Authorization": "Bearer sk-one"}
TERMINAL = ("response.completed", "response.failed", "error")


class Running:
    def __init__(self, base_url: str, store: MemoryStore, plain: str) -> None:
        self.base_url = base_url
        self.store = store
        self.plain = plain  # the same handler with no middleware: stateless HTTP


@pytest.fixture(scope="module")
def running() -> Iterator[Running]:
    reference = create_app(ReferenceConfig(tool_calls=2, answer_tokens=4))
    store = MemoryStore()
    app = WebSocketModeMiddleware(
        reference, store=store, stateful_http=True, authenticate=by_bearer_token
    )
    with ServerThread(app) as base_url, ServerThread(reference) as plain:
        yield Running(base_url, store, plain)


def post(base: str, stream: bool = False, headers: Any = KEY, **body: Any) -> dict[str, Any]:
    payload = {**FIELDS, **body, "stream": stream}
    with httpx.Client(verify=CLIENT_TLS, base_url=base, headers=headers, timeout=10) as client:
        if not stream:
            answer = client.post("/v1/responses", json=payload)
            return {**answer.json(), "http_status": answer.status_code}
        events = []
        with client.stream("POST", "/v1/responses", json=payload) as answer:
            for line in answer.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
        return {**events[-1]["response"], "events": events, "http_status": answer.status_code}


def answers(response: dict[str, Any]) -> list[dict[str, Any]]:
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    return [
        {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
        for call in calls
    ] or [{"role": "user", "content": "Go on."}]


@pytest.mark.parametrize("stream", [False, True])
def test_previous_response_id_over_http_gives_the_handler_the_whole_context(
    running: Running, stream: bool
) -> None:
    history: list[dict[str, Any]] = [{"role": "user", "content": "Start"}]
    previous: str | None = None
    new_input: Any = "Start"
    for _ in range(3):
        fields = {"previous_response_id": previous} if previous else {}
        response = post(running.base_url, stream, input=new_input, **fields)
        assert response["http_status"] == 200
        assert response["previous_response_id"] == previous  # echoed, as OpenAI does
        direct = post(running.plain, input=history)  # stateless, with the whole history
        assert response["output"] == direct["output"]
        if stream:
            created = response["events"][0]["response"]
            assert created["previous_response_id"] == previous
        new_input = answers(response)
        history += [*response["output"], *new_input]
        previous = response["id"]


def test_get_and_delete_answer_from_the_store(running: Running) -> None:
    response = post(running.base_url, input="Keep me")
    with httpx.Client(
        verify=CLIENT_TLS, base_url=running.base_url, headers=KEY, timeout=10
    ) as client:
        got = client.get(f"/v1/responses/{response['id']}")
        assert got.status_code == 200
        assert got.json()["id"] == response["id"]
        assert got.json()["output"] == response["output"]
        other = client.get(f"/v1/responses/{response['id']}", headers={"Authorization": "Bearer x"})
        assert other.status_code == 404  # another key never learns it exists
        deleted = client.delete(f"/v1/responses/{response['id']}")
        assert deleted.json() == {
            "id": response["id"],
            "object": "response.deleted",
            "deleted": True,
        }
        assert client.get(f"/v1/responses/{response['id']}").status_code == 404
        assert client.delete(f"/v1/responses/{response['id']}").status_code == 404
    gone = post(running.base_url, input="More", previous_response_id=response["id"])
    assert gone["http_status"] == 400
    assert gone["error"]["code"] == "previous_response_not_found"


def test_store_false_over_http_is_not_kept(running: Running) -> None:
    before = len(running.store)
    response = post(running.base_url, input="Secret", store=False)
    assert response["http_status"] == 200
    assert len(running.store) == before
    with httpx.Client(
        verify=CLIENT_TLS, base_url=running.base_url, headers=KEY, timeout=10
    ) as client:
        assert client.get(f"/v1/responses/{response['id']}").status_code == 404


def test_the_socket_and_http_continue_each_others_responses(running: Running) -> None:
    url = running.base_url.replace("http", "ws", 1) + "/v1/responses"
    with connect(url, additional_headers=KEY) as socket:
        socket.send(json.dumps({"type": "response.create", **FIELDS, "input": "Socket"}))
        while (event := json.loads(socket.recv(timeout=10)))["type"] not in TERMINAL:
            pass
    over_socket = event["response"]
    over_http = post(
        running.base_url, input=answers(over_socket), previous_response_id=over_socket["id"]
    )
    assert over_http["http_status"] == 200
    with connect(url, additional_headers=KEY) as socket:
        socket.send(
            json.dumps(
                {
                    "type": "response.create",
                    **FIELDS,
                    "input": answers(over_http),
                    "previous_response_id": over_http["id"],
                }
            )
        )
        while (event := json.loads(socket.recv(timeout=10)))["type"] not in (
            "response.completed",
            "error",
        ):
            pass
    assert event["type"] == "response.completed", event


class HangingStore(MemoryStore):
    """A store whose reads and deletes never answer."""

    async def get(self, principal: str, response_id: str) -> StoredResponse | None:
        await asyncio.sleep(3600)
        return None

    async def delete(self, principal: str, response_id: str) -> bool:
        await asyncio.sleep(3600)
        return False


def test_get_and_delete_answer_503_once_store_read_seconds_passed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="ws_mode._persistence")
    app = WebSocketModeMiddleware(
        create_app(ReferenceConfig()),
        store=HangingStore(),
        stateful_http=True,
        authenticate=by_bearer_token,
        limits=Limits(store_read_seconds=0.3),
    )
    with (
        ServerThread(app) as base_url,
        httpx.Client(verify=CLIENT_TLS, base_url=base_url, headers=KEY, timeout=10) as client,
    ):
        for method in ("GET", "DELETE"):
            started = time.monotonic()
            answer = client.request(method, "/v1/responses/resp_hung")
            elapsed = time.monotonic() - started
            assert answer.status_code == 503, method
            assert answer.json()["error"]["code"] == "store_unavailable"
            assert elapsed >= 0.3 - 0.005  # asyncio may fire a timer that early
    # The bound set, not the 5 s default, named with the store in the operator's log line;
    # the outage's first failure a warning, the next one at DEBUG.
    said = [r for r in caplog.records if "failed to answer" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING, logging.DEBUG]
    for record in said:
        line = record.getMessage()
        assert line.startswith("the store failed to answer for 'resp_hung': ")
        assert (
            "TimeoutError: no answer within 0.3 s (Limits.store_read_seconds) (HangingStore)"
        ) in line


def test_stateful_http_needs_a_store() -> None:
    with pytest.raises(ConfigError, match="store"):
        WebSocketModeMiddleware(create_app(), stateful_http=True)


def test_without_stateful_http_plain_http_reaches_the_handler_untouched() -> None:
    reference = create_app()
    app = WebSocketModeMiddleware(reference, store=MemoryStore(), authenticate=by_bearer_token)
    with ServerThread(app) as base_url:
        answer = post(base_url, input="Hi", previous_response_id="resp_anything")
    # The stateless handler itself refuses an id it cannot resolve.
    assert answer["http_status"] == 400


def test_ids_longer_than_any_issued_are_refused_unread(running: Running) -> None:
    long_id = "resp_" + "x" * 300
    with httpx.Client(
        verify=CLIENT_TLS, base_url=running.base_url, headers=KEY, timeout=10
    ) as client:
        answers = [
            client.get(f"/v1/responses/{long_id}"),
            client.delete(f"/v1/responses/{long_id}"),
        ]
    posted = post(running.base_url, input="Go on.", previous_response_id=long_id)
    errors = [answer.json()["error"] for answer in answers] + [posted["error"]]
    assert [answer.status_code for answer in answers] + [posted["http_status"]] == [400] * 3
    assert [(error["code"], error["param"]) for error in errors] == [
        ("string_above_max_length", "response_id"),
        ("string_above_max_length", "response_id"),
        ("string_above_max_length", "previous_response_id"),
    ]
    assert all("maximum length 256" in error["message"] for error in errors)
