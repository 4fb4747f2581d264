"""Scale-out on a real Redis: two `ws-mode serve --store redis://...` processes share one
Redis; a conversation hops between them, each turn on a new socket with only the new items,
and gets what HTTP with the whole history gets. Redis stopping mid-run gives clear errors, and
everything works again when it returns."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.redis_server import RedisServer
from tests.servers import ServeProcess, ws_mode_serve
from ws_mode.testing._client import connect

FIELDS: dict[str, Any] = {"model": "reference"}


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


@pytest.fixture(scope="module")
def processes(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[ServeProcess]]:
    cwd = tmp_path_factory.mktemp("workers")
    flags = ("--tool-calls", "2", "--store", redis_server.url)
    with ws_mode_serve(*flags, cwd=cwd) as a, ws_mode_serve(*flags, cwd=cwd) as b:
        yield [a, b]


@pytest.fixture(scope="module")
def workers(processes: list[ServeProcess]) -> list[str]:
    return [process.origin for process in processes]


def turn(origin: str, token: str = "sk-test", **fields: Any) -> dict[str, Any]:
    with connect(origin, headers={"Authorization": f"Bearer {token}"}) as socket:
        socket.send({"type": "response.create", **FIELDS, **fields})
        event: dict[str, Any] = socket.receive_turn(timeout=10)[-1]
        return event


def answers(response: dict[str, Any]) -> list[dict[str, Any]]:
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    outputs = [
        {"type": "function_call_output", "call_id": call["call_id"], "output": f"ok {n}"}
        for n, call in enumerate(calls)
    ]
    return outputs or [{"role": "user", "content": "Go on."}]


@settings(max_examples=6, deadline=None)
@given(route=st.lists(st.integers(0, 1), min_size=2, max_size=4), seed=st.integers(0, 99))
def test_a_conversation_hopping_between_processes_equals_http_with_full_history(
    workers: list[str], route: list[int], seed: int
) -> None:
    history: list[dict[str, Any]] = [{"role": "user", "content": f"Task {seed}"}]
    new_input: Any = f"Task {seed}"
    previous: str | None = None
    with httpx.Client(timeout=10) as http:
        for hop in route:
            event = turn(workers[hop], input=new_input, previous_response_id=previous)
            assert event["type"] == "response.completed", event
            response = event["response"]
            direct = http.post(
                workers[1 - hop] + "/v1/responses", json={**FIELDS, "input": history}
            ).json()
            assert response["output"] == direct["output"]  # the same context on both sides
            new_input = answers(response)
            history += [*response["output"], *new_input]
            previous = response["id"]


def test_store_false_never_reaches_redis(workers: list[str], redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url)
    before = set(client.keys("*"))
    private = turn(workers[0], input="Secret", store=False)["response"]
    assert set(client.keys("*")) == before
    assert not any(private["id"].encode() in key for key in client.keys("*"))
    event = turn(workers[1], input=answers(private), previous_response_id=private["id"])
    assert event["error"]["code"] == "previous_response_not_found"
    client.close()


def test_serve_authenticates_nobody_so_its_store_is_shared_and_it_says_so(
    processes: list[ServeProcess], workers: list[str]
) -> None:
    """The reference server checks no key, so its store is one scope every caller shares
    (`shared_store=True`), and the banner says so; a store scoped per key is the library's,
    with an `authenticate` hook (tests/store/test_principals.py)."""
    assert all("a store every caller shares" in process.banner for process in processes)
    mine = turn(workers[0], token="sk-alice", input="Mine")["response"]
    theirs = turn(workers[1], token="sk-bob", input=answers(mine), previous_response_id=mine["id"])
    assert theirs["type"] == "response.completed"


def test_redis_stopping_mid_run_gives_errors_and_recovery(
    workers: list[str], redis_server: RedisServer
) -> None:
    kept = turn(workers[0], input="Before")["response"]
    redis_server.stop()
    try:
        event = turn(workers[1], input=answers(kept), previous_response_id=kept["id"])
        assert event["error"]["code"] == "store_unavailable"
        assert turn(workers[1], input="Fresh")["type"] == "response.completed"  # no crash
    finally:
        redis_server.restart()  # an empty Redis: what was kept before is gone
    later = turn(workers[0], input="After")["response"]
    event = turn(workers[1], input=answers(later), previous_response_id=later["id"])
    assert event["type"] == "response.completed"
