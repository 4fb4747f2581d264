"""Nothing the handler never saw reaches the shared store, and one principal cannot fill it:
`generate: false` warm-ups are written only with a generated response that continues from
them, and `Limits.max_stored_bytes_per_principal` bounds what each principal keeps (its own
least recently written conversations go first), on a real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.redis_server import RedisServer
from tests.servers import serve
from tests.store_kit import FIELDS, ClosingStore, answers, key, turn, wait_for, who
from ws_mode import Limits, WebSocketModeMiddleware
from ws_mode.redis_store import RedisStore
from ws_mode.testing._client import connect
from ws_mode.toolkit.reference import ReferenceConfig, create_app

KiB = 1024


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


@pytest.fixture
def raw(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url)
    client.flushall()
    yield client
    client.config_set("maxmemory", 0)
    client.flushall()
    client.close()


class Served:
    def __init__(self, base_url: str, middleware: WebSocketModeMiddleware, store: RedisStore):
        self.base_url = base_url
        self.middleware = middleware
        self.store = store


def served(server: RedisServer, limits: Limits | None = None) -> Any:
    store = RedisStore(server.url)
    app = create_app(ReferenceConfig(tool_calls=1, answer_tokens=3))
    middleware = WebSocketModeMiddleware(app, store=store, authenticate=who, limits=limits)

    class Context:
        def __enter__(self) -> Served:
            self._serving = serve(ClosingStore(middleware, store))
            return Served(self._serving.__enter__(), middleware, store)

        def __exit__(self, *exc_info: Any) -> None:
            self._serving.__exit__(*exc_info)

    return Context()


def stored_ids(client: redis.Redis) -> set[str]:
    """The response ids that have an index key in Redis."""
    return {key.decode().rsplit(":r:", 1)[1] for key in client.keys("*:r:*")}


def test_warm_ups_alone_write_nothing_to_the_store(server: RedisServer, raw: redis.Redis) -> None:
    big = "w" * (64 * KiB)
    warm_ups: list[str] = []
    with served(server) as running, connect(running.base_url, headers=key("alice")) as socket:
        previous = None
        for _ in range(4):  # a chain of warm-ups, and loose ones
            socket.send(
                {"type": "response.create", **FIELDS, "generate": False, "input": big,
                 "previous_response_id": previous}
            )  # fmt: skip
            done = socket.receive_turn(timeout=10)[-1]
            assert done["type"] == "response.completed", done
            warm_ups.append(done["response"]["id"])
            previous = done["response"]["id"] if len(warm_ups) < 3 else None
        # A generated response of another conversation: its write starts after theirs would.
        socket.send({"type": "response.create", **FIELDS, "input": "Hello"})
        other = socket.receive_turn(timeout=10)[-1]["response"]["id"]
        assert wait_for(lambda: running.middleware.stats.store_writes >= 1)
        assert wait_for(lambda: other in stored_ids(raw))
    assert running.middleware.stats.warm_ups == 4
    assert stored_ids(raw) == {other}
    assert not any(warm_up.encode() in value for value in raw.keys("*") for warm_up in warm_ups)


def test_a_warm_up_continued_by_a_generated_turn_is_stored_with_it_and_hydrates_elsewhere(
    server: RedisServer, raw: redis.Redis
) -> None:
    task = "Plan the move of the files."
    with served(server) as running:
        with connect(running.base_url, headers=key("alice")) as socket:
            socket.send({"type": "response.create", **FIELDS, "generate": False, "input": task})
            warm_up = socket.receive_turn(timeout=10)[-1]["response"]
            socket.send(
                {"type": "response.create", **FIELDS, "input": "Begin.",
                 "previous_response_id": warm_up["id"]}
            )  # fmt: skip
            generated = socket.receive_turn(timeout=10)[-1]["response"]
        assert wait_for(lambda: running.middleware.stats.store_writes >= 2)
        assert stored_ids(raw) == {warm_up["id"], generated["id"]}
        new_input = answers(generated)
        event = turn(
            running.base_url, input=new_input, previous_response_id=generated["id"]
        )  # a new connection: hydrated from Redis, the warm-up's input included
        assert event["type"] == "response.completed", event
        history = [
            {"role": "user", "content": task},
            {"role": "user", "content": "Begin."},
            *generated["output"],
            *new_input,
        ]
        direct = httpx.post(
            running.base_url + "/v1/responses", json={**FIELDS, "input": history}, timeout=10
        ).json()
        assert event["response"]["output"] == direct["output"]
        # Another principal never sees it.
        theirs = turn(running.base_url, "mallory", input="x", previous_response_id=warm_up["id"])
        assert theirs["error"]["code"] == "previous_response_not_found"


def test_a_principal_past_its_bound_cannot_push_out_other_principals_keys(
    server: RedisServer, raw: redis.Redis
) -> None:
    """Redis evicts keys when it is full (the issue's 84 MiB, 20 keys evicted); with a bound
    per principal, one principal's flood drops its own oldest conversations instead."""
    bound = 200 * KiB
    raw.config_set("maxmemory-policy", "allkeys-lru")
    raw.config_set("maxmemory-samples", 64)
    with served(server, Limits(max_stored_bytes_per_principal=bound)) as running:
        stats = running.middleware.stats
        mine = turn(running.base_url, "alice", input="Keep mine.")["response"]
        assert wait_for(lambda: stats.store_writes == 1)
        used = int(raw.info("memory")["used_memory"])
        raw.config_set("maxmemory", used + 2 * 1024 * KiB)  # 2 MiB more fit
        flood = "m" * (128 * KiB)
        with connect(running.base_url, headers=key("mallory")) as socket:
            for _ in range(24):  # 3 MiB, each a new conversation
                socket.send({"type": "response.create", **FIELDS, "input": flood})
                assert socket.receive_turn(timeout=10)[-1]["type"] == "response.completed"
        assert wait_for(lambda: stats.store_writes == 25)
        assert raw.info("stats")["evicted_keys"] == 0
        assert mine["id"] in stored_ids(raw)
        assert stats.store_dropped > 0
        assert stats.store_failures == stats.store_refused == 0
        held = raw.get(running.store.account_keys("principal:mallory")[0])
        assert held is not None
        assert int(held) <= bound
        again = turn(
            running.base_url, "alice", input=answers(mine), previous_response_id=mine["id"]
        )
        assert again["type"] == "response.completed", again
