"""RedisStore against a real redis-server on loopback: records, chains, scoping, expiry, one
round trip per call, a stopped or stalled Redis, and the same answers as MemoryStore."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import uvloop

from tests.redis_server import RedisServer, ping
from ws_mode._store import (
    DEFAULT_TTL_SECONDS,
    MemoryStore,
    QuotaExceeded,
    ResponseStore,
    StoredResponse,
    chain_of,
)
from ws_mode.redis_store import RedisStore, RedisStoreError

pytestmark = pytest.mark.anyio

ALICE = "alice@example.com"
BOB = "bob:{tenant}"  # the characters keys are made of, to show they do not matter


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


@pytest.fixture
async def raw(server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(server.url)
    await client.flushall()
    yield client
    await client.aclose()


@pytest.fixture
async def store(server: RedisServer, raw: aioredis.Redis) -> AsyncIterator[RedisStore]:
    opened = RedisStore(server.url, timeout=1.0)
    yield opened
    await opened.aclose()


def record(
    response_id: str, parent: StoredResponse | None = None, *, digest: bytes | None = None
) -> StoredResponse:
    return StoredResponse(
        id=response_id,
        parent_id=parent.id if parent else None,
        chain_id=parent.chain_id if parent else response_id,
        input=b'{"type":"message","role":"user","content":"' + response_id.encode() + b'"}',
        output=b'{"type":"message","role":"assistant","content":"\xc3\xa9t\xc3\xa9"}',
        response=b'{"id":"' + response_id.encode() + b'","status":"completed"}',
        tools_digest=digest,
    )


async def test_a_record_comes_back_equal(store: RedisStore) -> None:
    first = record("resp_1", digest=hashlib.sha256(b"tools").digest())
    await store.put(ALICE, first)
    assert await store.get_chain(ALICE, "resp_1") == {"resp_1": first}
    assert await store.get_chain(ALICE, "resp_unknown") == {}


async def test_a_chain_with_forks_comes_back_whole_in_one_call(store: RedisStore) -> None:
    a = record("a")
    b = record("b", a)
    c = record("c", b)
    d = record("d", b)  # a fork at b
    e = record("e", a)  # a fork at a
    other = record("other")  # another conversation
    for each in (a, b, c, d, e, other):
        await store.put(ALICE, each)
    whole = {r.id: r for r in (a, b, c, d, e)}
    for member in whole:
        assert await store.get_chain(ALICE, member) == whole
    chain = await store.get_chain(ALICE, "d")
    assert chain_of(chain, "d") == [a, b, d]
    assert chain_of(chain, "c") == [a, b, c]
    assert chain_of(chain, "e") == [a, e]
    assert await store.get_chain(ALICE, "other") == {"other": other}


async def test_records_are_scoped_by_principal(store: RedisStore) -> None:
    mine, theirs = record("resp_1"), record("resp_1", digest=b"\x01")
    await store.put(ALICE, mine)
    assert await store.get_chain(BOB, "resp_1") == {}
    assert await store.delete(BOB, "resp_1") is False
    await store.put(BOB, theirs)
    assert await store.get_chain(ALICE, "resp_1") == {"resp_1": mine}
    assert await store.get_chain(BOB, "resp_1") == {"resp_1": theirs}
    assert await store.delete(BOB, "resp_1") is True
    assert await store.get_chain(ALICE, "resp_1") == {"resp_1": mine}


async def test_keys_carry_a_digest_of_the_principal_not_the_principal(
    store: RedisStore, raw: aioredis.Redis
) -> None:
    await store.put(ALICE, record("resp_1"))
    await store.put(BOB, record("resp_1"))
    keys = sorted(key.decode() for key in await raw.keys("*") if isinstance(key, bytes))
    assert len(keys) == 4
    for principal in (ALICE, BOB):
        digest = hashlib.sha256(principal.encode()).hexdigest()[:32]
        scope = f"ws_mode:{{{digest}}}:"
        assert sorted(k for k in keys if k.startswith(scope)) == [
            f"{scope}c:resp_1",
            f"{scope}r:resp_1",
        ]
        assert not any(principal in key or "alice" in key or "bob" in key for key in keys)


async def test_delete_forgets_one_response_and_leaves_its_chain(
    store: RedisStore, raw: aioredis.Redis
) -> None:
    a = record("a")
    b = record("b", a)
    c = record("c", b)
    for each in (a, b, c):
        await store.put(ALICE, each)
    assert await store.delete(ALICE, "b") is True
    assert await store.delete(ALICE, "b") is False
    assert await store.get_chain(ALICE, "b") == {}
    chain = await store.get_chain(ALICE, "c")
    assert chain == {"a": a, "c": c}
    assert chain_of(chain, "c") is None  # a link is missing: the chain cannot be rebuilt
    assert await store.delete(ALICE, "a") is True
    assert await store.delete(ALICE, "c") is True
    # What is left: the chain's hash, with a tombstone (an id) for each deleted response, so
    # continuing one is no sign of a loss; it expires with the chain.
    (left,) = await raw.keys("*")
    assert left == store.chain_key(ALICE, "a").encode()
    assert sorted(await raw.hkeys(left)) == [b"\0a", b"\0b", b"\0c"]
    assert set((await raw.hgetall(left)).values()) == {b""}
    assert 0 < await raw.pttl(left) <= DEFAULT_TTL_SECONDS * 1000
    await store.put(ALICE, record("d", c))  # continuing a deleted response: written, as asked
    assert await store.get(ALICE, "d") is not None
    assert await store.get(ALICE, "c") is None  # and the deleted one never comes back


async def test_records_expire_and_a_write_restarts_the_chains_time_to_live(
    server: RedisServer, raw: aioredis.Redis
) -> None:
    store = RedisStore(server.url, ttl_seconds=1.0)
    try:
        a = record("a")
        await store.put(ALICE, a)
        a_written = time.monotonic()
        index, chain = store.index_key(ALICE, "a"), store.chain_key(ALICE, "a")
        assert 0 < await raw.pttl(index) <= 1000
        assert 0 < await raw.pttl(chain) <= 1000
        await asyncio.sleep(0.5)
        await store.put(ALICE, record("b", a))
        assert await raw.pttl(chain) > 700  # restarted by the second write
        assert await raw.pttl(index) <= 500  # the first record's index key was not
        await asyncio.sleep(max(0.0, a_written + 1.05 - time.monotonic()))
        assert await store.get_chain(ALICE, "a") == {}  # its index key expired
        assert set(await store.get_chain(ALICE, "b")) == {"a", "b"}  # the chain lives on
        await asyncio.sleep(0.5)
        assert await store.get_chain(ALICE, "b") == {}
        assert await raw.keys("*") == []
    finally:
        await store.aclose()


async def test_the_default_time_to_live_is_thirty_days(
    store: RedisStore, raw: aioredis.Redis
) -> None:
    await store.put(ALICE, record("a"))
    for key in (store.index_key(ALICE, "a"), store.chain_key(ALICE, "a")):
        assert DEFAULT_TTL_SECONDS - 5 < await raw.ttl(key) <= DEFAULT_TTL_SECONDS


async def commands_run(raw: aioredis.Redis) -> dict[str, int]:
    stats = await raw.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(values["calls"])
        for name, values in stats.items()
        if not name.startswith(("cmdstat_config", "cmdstat_info"))
    }


async def test_each_call_is_one_script_call(store: RedisStore, raw: aioredis.Redis) -> None:
    a = record("a")
    await store.put(ALICE, a)
    await store.put(ALICE, record("b", a))
    await store.get_chain(ALICE, "a")  # loads the scripts and opens the connection
    await store.delete(ALICE, "nothing")

    # One EVALSHA from the client; GET, HGETALL, DEL, HDEL are counted as the script runs them.
    await raw.config_resetstat()
    assert len(await store.get_chain(ALICE, "b")) == 2
    assert await commands_run(raw) == {"evalsha": 1, "get": 1, "hgetall": 1}

    await raw.config_resetstat()
    assert await store.delete(ALICE, "b") is True
    assert await commands_run(raw) == {
        "evalsha": 1, "get": 1, "hstrlen": 1, "del": 1, "hdel": 1, "hset": 1, "pttl": 1,
        "exists": 1,
    }  # fmt: skip

    await raw.config_resetstat()
    await store.put(ALICE, record("c", a))  # a continuation: its chain is checked first
    assert await commands_run(raw) == {
        "evalsha": 1, "hexists": 1, "set": 1, "hset": 1, "pexpire": 1,
    }  # fmt: skip


async def test_a_client_given_to_the_store_stays_open(server: RedisServer) -> None:
    client = aioredis.Redis.from_url(server.url)
    store = RedisStore.from_client(client, prefix="elsewhere", timeout=1.0)
    await store.put(ALICE, record("a"))
    await store.aclose()
    assert await client.get(store.index_key(ALICE, "a")) == b"a"
    assert store.index_key(ALICE, "a").startswith("elsewhere:{")
    await client.flushall()
    await client.aclose()


def test_time_to_live_and_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        RedisStore(ttl_seconds=0)
    with pytest.raises(ValueError, match="positive"):
        RedisStore(timeout=-1)


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


async def assert_every_call_fails_fast(store: RedisStore) -> None:
    calls = (
        lambda: store.put(ALICE, record("z")),
        lambda: store.get_chain(ALICE, "a"),
        lambda: store.delete(ALICE, "a"),
    )
    for call in calls:
        started = time.monotonic()
        with pytest.raises((RedisStoreError, TimeoutError)):
            await call()
        # A hang, not a speed: the callers' deadlines are under a second and a refused
        # connection fails at once; without them a frozen Redis blocks the call forever. The
        # bound stays under the 10 s default write deadline, so waiting it out still fails.
        assert time.monotonic() - started < 8


async def test_a_stopped_redis_fails_each_call_fast_and_a_restarted_one_serves_again(
    own_server: RedisServer,
) -> None:
    store = RedisStore(own_server.url, timeout=0.5)
    try:
        await store.put(ALICE, record("a"))
        own_server.stop()
        await assert_every_call_fails_fast(store)
        own_server.start()
        assert await store.get_chain(ALICE, "a") == {}  # nothing was persisted
        await store.put(ALICE, record("a"))
        # A restart between two calls: the pooled connection is broken, and replaced.
        own_server.restart()
        assert await store.get_chain(ALICE, "a") == {}
        await store.put(ALICE, record("b"))
        assert list(await store.get_chain(ALICE, "b")) == ["b"]
    finally:
        await store.aclose()


async def test_a_stalled_redis_times_out_and_serves_again_when_it_resumes(
    own_server: RedisServer,
) -> None:
    store = RedisStore(own_server.url, timeout=0.3, write_timeout=0.3)
    try:
        await store.put(ALICE, record("a"))
        own_server.freeze()
        try:
            await assert_every_call_fails_fast(store)
        finally:
            own_server.thaw()
        assert list(await store.get_chain(ALICE, "a")) == ["a"]
    finally:
        await store.aclose()


@pytest.mark.parametrize("watchdog", [False, True], ids=["pdeathsig", "watchdog"])
def test_the_server_dies_with_the_process_that_started_it(watchdog: bool) -> None:
    helper = Path(__file__).parent.parent / "redis_server.py"
    argv = [sys.executable, str(helper), *(["watchdog"] if watchdog else [])]
    parent = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        port = int(parent.stdout.readline())
        assert ping(port)
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
    deadline = time.monotonic() + 5
    while ping(port):
        assert time.monotonic() < deadline, "redis-server outlived its parent"
        time.sleep(0.02)


@pytest.fixture(params=["memory", "redis"])
async def any_store(
    request: pytest.FixtureRequest, server: RedisServer, raw: aioredis.Redis
) -> AsyncIterator[ResponseStore]:
    opened: ResponseStore = MemoryStore() if request.param == "memory" else RedisStore(server.url)
    yield opened
    await opened.aclose()


async def test_memory_and_redis_stores_answer_alike(any_store: ResponseStore) -> None:
    store = any_store
    a = record("a")
    b = record("b", a)
    c = record("c", b)
    d = record("d", b)
    for each in (a, b, c, d):
        await store.put(ALICE, each)
    await store.put(BOB, record("a", digest=b"\x02"))
    assert await store.get_chain(ALICE, "nothing") == {}
    assert await store.get_chain(ALICE, "c") == {"a": a, "b": b, "c": c, "d": d}
    assert await store.get_chain(BOB, "a") == {"a": record("a", digest=b"\x02")}
    assert await store.get_chain(BOB, "c") == {}
    # Writing a record again replaces it.
    b2 = record("b", a, digest=b"\x03")
    await store.put(ALICE, b2)
    assert (await store.get_chain(ALICE, "d"))["b"] == b2
    assert await store.delete(BOB, "c") is False
    assert await store.delete(ALICE, "c") is True
    assert await store.delete(ALICE, "c") is False
    assert await store.get_chain(ALICE, "c") == {}
    assert await store.get_chain(ALICE, "d") == {"a": a, "b": b2, "d": d}
    assert chain_of(await store.get_chain(ALICE, "d"), "d") == [a, b2, d]
    assert await store.delete(ALICE, "a") is True
    assert chain_of(await store.get_chain(ALICE, "d"), "d") is None
    assert await store.get_chain(BOB, "a") == {"a": record("a", digest=b"\x02")}


# --- the bound per principal (Limits.max_stored_bytes_per_principal) ------------------------

KiB = 1024


def sized(id: str, parent: StoredResponse | None = None, size: int = 10 * KiB) -> StoredResponse:
    return StoredResponse(
        id=id,
        parent_id=parent.id if parent else None,
        chain_id=parent.chain_id if parent else id,
        input=b'{"role":"user","content":"' + b"x" * size + b'"}',
        output=b"",
        response=b'{"id":"' + id.encode() + b'"}',
    )


async def test_past_the_bound_the_principals_oldest_conversations_go_first(
    any_store: ResponseStore,
) -> None:
    store = any_store
    store.limit_principal_bytes(35 * KiB)
    a = sized("a")
    await store.put("p", a)
    b = sized("b")
    await store.put("p", b)
    await store.put("p", sized("a2", a))  # conversation a was written last
    assert await store.put("q", sized("other", size=30 * KiB)) == 0  # its own bound
    assert await store.put("p", sized("c")) == 1  # b, the least recently written, went
    assert await store.get("p", "b") is None
    assert [r.id for r in await store.get_ancestors("p", "a2")] == ["a", "a2"]
    assert await store.get("q", "other") is not None
    # A conversation that alone exceeds the bound is refused, and drops nothing.
    with pytest.raises(QuotaExceeded):
        await store.put("p", sized("huge", size=40 * KiB))
    assert await store.get("p", "huge") is None
    assert await store.get("p", "c") is not None
    # Deleting gives the room back.
    assert await store.delete("p", "a2")
    assert await store.delete("p", "a")
    assert await store.put("p", sized("d")) == 0
    assert await store.put("p", sized("e")) == 0
    # Rewriting a record counts it once.
    for _ in range(5):
        assert await store.put("p", sized("e")) == 0
    assert await store.get("p", "c") is not None


def test_a_connection_closed_just_before_a_write_is_replaced_and_the_write_lands(
    server: RedisServer,
) -> None:
    """Under uvloop (what uvicorn runs on), a write on a connection whose transport closed
    after the pool checked it (Redis died or failed over at that moment) raises RuntimeError,
    which redis-py passes on as it is: the store takes it for the connection error it is and
    sends the write again on a new connection, where it failed the write before."""

    async def scenario() -> bool:
        store = RedisStore(server.url, timeout=1.0)
        try:
            await store.put("p", record("warm"))  # one connection, back in the pool
            (idle,) = store.client.connection_pool._available_connections  # type: ignore[attr-defined]
            # Closed now; the loop tells its reader only on its next pass, after the pool's
            # check of the connection and the write.
            idle._writer.transport.close()
            await store.put("p", record("after"))
            return await store.get("p", "after") is not None
        finally:
            await store.aclose()

    assert uvloop.run(scenario())
