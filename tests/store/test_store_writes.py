"""A store write outlives its socket: clients leaving while Redis stalls lose nothing, a write
that cannot land is counted and logged, a graceful shutdown waits for the writes under way,
and a continuation that reaches another worker before its parent's write landed waits for it
(only then: a genuine miss does not wait)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import redis

from tests.redis_server import RedisServer
from tests.servers import serve
from tests.store_kit import FIELDS, ClosingStore, answers, key, turn, wait_for, who
from ws_mode import Limits, WebSocketModeMiddleware
from ws_mode import _persistence as persistence_module
from ws_mode._persistence import load_chain
from ws_mode._stats import Stats
from ws_mode._store import MemoryStore, StoredResponse
from ws_mode.redis_store import RedisStore
from ws_mode.testing._client import connect
from ws_mode.toolkit.reference import ReferenceConfig, create_app

CLIENTS = 20


def reference() -> Any:
    return create_app(ReferenceConfig(tool_calls=1, answer_tokens=3))


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


@pytest.fixture
def raw(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url)
    client.flushall()
    yield client
    client.execute_command("CLIENT", "UNPAUSE")
    client.flushall()
    client.close()


#: Work after a response gets 0.1 s once its socket closed (5 s by default): a store write
#: must not depend on it.
SHORT_GRACE = Limits(after_response_grace_seconds=0.1)


def test_clients_leaving_while_redis_stalls_lose_no_stored_response(
    server: RedisServer, raw: redis.Redis
) -> None:
    store = RedisStore(server.url)
    middleware = WebSocketModeMiddleware(
        reference(), store=store, authenticate=who, limits=SHORT_GRACE
    )
    with serve(ClosingStore(middleware, store)) as base_url:
        turn(base_url, input="Open the pool.")  # connects the pool before Redis stalls
        assert wait_for(lambda: middleware.stats.store_writes == 1)
        raw.execute_command("CLIENT", "PAUSE", 2000, "WRITE")  # writes wait 2 s
        paused_at = time.monotonic()
        seen: list[str] = []

        def client(number: int) -> None:
            event = turn(base_url, f"tenant{number % 4}", input=f"Task {number}")
            assert event["type"] == "response.completed", event
            seen.append(event["response"]["id"])

        threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(seen) == CLIENTS  # every client saw its response completed, and left
        if time.monotonic() - paused_at < 1.5:  # (a loaded machine may take longer)
            assert middleware.stats.store_writes == 1  # Redis still holds every write back
        assert wait_for(lambda: middleware.stats.store_writes == 1 + CLIENTS, 15)
    stats = middleware.stats
    assert (stats.store_failures, stats.store_refused) == (0, 0)
    stored = {key.decode().rsplit(":r:", 1)[1] for key in raw.keys("*:r:*")}
    assert set(seen) <= stored


class HangingStore(MemoryStore):
    """A store whose writes never land."""

    async def put(self, principal: str, record: StoredResponse) -> int:
        await asyncio.sleep(3600)
        return 0


def test_a_write_that_cannot_land_is_counted_and_logged_after_its_client_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limits = replace(SHORT_GRACE, store_write_seconds=0.5)
    middleware = WebSocketModeMiddleware(
        reference(), store=HangingStore(), authenticate=who, limits=limits
    )
    with (
        caplog.at_level(logging.WARNING, logger="ws_mode._persistence"),
        serve(middleware) as base_url,
    ):
        response = turn(base_url, input="Hello")["response"]  # the client leaves at once
        assert wait_for(lambda: middleware.stats.store_failures == 1)
    assert middleware.stats.store_writes == 0
    assert any(
        "failed to keep" in record.getMessage() and response["id"] in record.getMessage()
        for record in caplog.records
    ), caplog.text


def test_a_cancelled_write_is_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> Stats:
        stats = Stats()
        record = StoredResponse(
            id="resp_cut", parent_id=None, chain_id="resp_cut", input=b"", output=b"",
            response=b"{}",
        )  # fmt: skip
        task = persistence_module.start_write(HangingStore(), stats, "p", record, seconds=15.0)
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return stats

    with caplog.at_level(logging.WARNING, logger="ws_mode._persistence"):
        stats = asyncio.run(scenario())
    assert (stats.store_failures, stats.store_writes) == (1, 0)
    assert "resp_cut" in caplog.text
    assert "cancelled" in caplog.text


class SlowStore(MemoryStore):
    """A store whose writes take `seconds` to land."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    async def put(self, principal: str, record: StoredResponse) -> int:
        await asyncio.sleep(self.seconds)
        return await super().put(principal, record)


def test_the_lifespan_shutdown_waits_for_a_pending_write() -> None:
    store = SlowStore(0.5)
    middleware = WebSocketModeMiddleware(
        reference(), store=store, authenticate=who, limits=SHORT_GRACE
    )
    with serve(middleware, lifespan="on") as base_url:
        response = turn(base_url, input="Hello")["response"]
        assert len(store) == 0  # the write is under way as the server shuts down
    assert len(store) == 1
    assert middleware.stats.store_writes == 1

    async def kept() -> StoredResponse | None:
        return await store.get("principal:alice", response["id"])

    assert asyncio.run(kept()) is not None


def test_drain_waits_for_the_writes_under_way() -> None:
    async def scenario() -> tuple[int, int]:
        store = SlowStore(0.3)
        middleware = WebSocketModeMiddleware(reference(), store=store, authenticate=who)
        record = StoredResponse(
            id="resp_d", parent_id=None, chain_id="resp_d", input=b"", output=b"",
            response=b"{}",
        )  # fmt: skip
        persistence_module.start_write(store, middleware.stats, "p", record, seconds=15.0)
        await middleware.drain()
        return len(store), persistence_module.pending_writes()

    assert asyncio.run(scenario()) == (1, 0)


def test_drain_waits_at_most_store_write_seconds() -> None:
    """The drain's wait for the writes under way is the middleware's `store_write_seconds`,
    even for a write that may take longer (one of another middleware of the process)."""

    async def scenario() -> tuple[float, int, int]:
        store = SlowStore(30.0)
        limits = Limits(store_write_seconds=0.3)
        middleware = WebSocketModeMiddleware(
            reference(), store=store, authenticate=who, limits=limits
        )
        record = StoredResponse(
            id="resp_slow", parent_id=None, chain_id="resp_slow", input=b"", output=b"",
            response=b"{}",
        )  # fmt: skip
        task = persistence_module.start_write(store, middleware.stats, "p", record, seconds=60.0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(middleware.drain(), 20)  # 20 s: a hang, not a speed
        elapsed = loop.time() - started
        pending = persistence_module.pending_writes()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return elapsed, pending, len(store)

    elapsed, pending, stored = asyncio.run(scenario())
    assert 0.3 <= elapsed < 10  # the bound set, not the 15 s default nor the write's 30 s
    assert (pending, stored) == (1, 0)  # the drain went on without it


def test_a_continuation_on_another_worker_before_the_write_landed_succeeds() -> None:
    """Two workers share a store whose writes take 0.3 s: a client continues on the other
    worker the moment it has `response.completed`."""
    store = SlowStore(0.3)
    limits = replace(SHORT_GRACE, store_wait_seconds=5.0)
    a, b = (
        WebSocketModeMiddleware(reference(), store=store, authenticate=who, limits=limits)
        for _ in range(2)
    )
    with serve(a) as first, serve(b) as second:
        for attempt in range(2):
            response = turn(first, input=f"Race {attempt}")["response"]
            event = turn(second, input=answers(response), previous_response_id=response["id"])
            assert event["type"] == "response.completed", event
    assert b.stats.store_hydrations == 2


# --- the marker a write sets in Redis ----------------------------------------------------------


def test_a_miss_waits_for_a_write_marked_in_redis_and_only_then(
    server: RedisServer, raw: redis.Redis
) -> None:
    """Two stores (two workers): one marks a response as being written and writes it 0.3 s
    later; the other's miss waits for it. A response nobody writes is a genuine miss, which
    looks twice and asks once whether a write is under way."""

    async def scenario() -> tuple[list[StoredResponse] | None, list[StoredResponse] | None]:
        writer, reader = RedisStore(server.url), RedisStore(server.url)
        record = StoredResponse(
            id="resp_w", parent_id=None, chain_id="resp_w", input=b"", output=b"",
            response=b'{"id":"resp_w"}',
        )  # fmt: skip
        await writer.mark_pending("p", ["resp_w"], 10.0)

        async def land() -> None:
            await asyncio.sleep(0.3)
            await writer.put("p", record)

        landing = asyncio.create_task(land())
        found = await load_chain(reader, Stats(), "p", "resp_w", read_seconds=5.0, wait=5.0)
        await landing
        await reader.get("p", "warm")  # loads the scripts
        raw.config_resetstat()
        missing = await load_chain(reader, Stats(), "p", "resp_never", read_seconds=5.0, wait=5.0)
        await writer.aclose()
        await reader.aclose()
        return found, missing

    found, missing = asyncio.run(scenario())
    assert found is not None
    assert [r.id for r in found] == ["resp_w"]
    assert missing is None
    calls = {
        name.removeprefix("cmdstat_"): int(values["calls"])
        for name, values in raw.info("commandstats").items()
    }
    assert calls.get("evalsha") == 2  # looked up, and once more
    assert calls.get("exists") == 1  # no write under way: no more waiting


class FlakyStore(MemoryStore):
    """A store that is down while `down` is set: its writes fail at once."""

    down = False

    async def put(self, principal: str, record: StoredResponse) -> int:
        if self.down:
            raise ConnectionError("the store is down")
        return await super().put(principal, record)


def test_a_response_whose_write_failed_is_written_with_the_next_one() -> None:
    """The store is down for one turn: the next response of the conversation is written with
    it, so the chain is whole again and continues on another worker."""
    store = FlakyStore()
    middleware = WebSocketModeMiddleware(reference(), store=store, authenticate=who)
    with serve(middleware) as base_url:
        with connect(base_url, headers=key("alice")) as socket:
            store.down = True
            socket.send({"type": "response.create", **FIELDS, "input": "First"})
            first = socket.receive_turn(timeout=10)[-1]["response"]
            assert wait_for(lambda: middleware.stats.store_failures == 1)
            store.down = False
            socket.send(
                {"type": "response.create", **FIELDS, "input": answers(first),
                 "previous_response_id": first["id"]}
            )  # fmt: skip
            second = socket.receive_turn(timeout=10)[-1]["response"]
        assert wait_for(lambda: middleware.stats.store_writes == 2)
        event = turn(base_url, input=answers(second), previous_response_id=second["id"])
        assert event["type"] == "response.completed", event
