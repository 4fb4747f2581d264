"""The store's own option in a Redis store URL, `wait_replicas=N`: taken out before redis-py
reads the URL, as `RedisStore(wait_replicas=N)` does, against a real redis-server on loopback
(one Redis, no replica); a bad value, a cluster URL or a keyword that disagrees is a
ValueError that names the option and hides the URL's credentials."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.redis_server import RedisServer
from tests.store_kit import stored_record
from ws_mode import Stats
from ws_mode._persistence import write_records
from ws_mode.redis_store import RedisStore

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


async def test_wait_replicas_in_the_url_is_the_stores_and_the_other_options_redis_pys(
    server: RedisServer,
) -> None:
    """On one Redis with no replica, a write through `?wait_replicas=1` is never acknowledged
    (it fails, counted once, as with the keyword), while lookups, and the same URL without the
    option, work: the option reached the store, and redis-py got only its own
    (`socket_keepalive`). The startup check warns that no replica follows."""
    waiting = RedisStore(
        f"{server.url}?wait_replicas=1&socket_keepalive=true", timeout=1.0, write_timeout=0.5
    )
    plain = RedisStore(f"{server.url}?socket_keepalive=true", timeout=1.0, write_timeout=0.5)
    stats = {store: Stats() for store in (waiting, plain)}
    try:
        assert (waiting.wait_replicas, plain.wait_replicas) == (1, 0)
        for store in (waiting, plain):
            kwargs = store.client.connection_pool.connection_kwargs
            assert kwargs["socket_keepalive"] is True
            assert "wait_replicas" not in kwargs
        assert await waiting.get("alice", "nothing") is None  # it connects and reads
        with pytest.raises(TimeoutError, match="0 of the 1 replica"):
            await waiting.put("alice", stored_record("a"))
        landed = {
            store: await write_records(
                store, stats[store], "alice", stored_record("b"), seconds=0.5
            )
            for store in (waiting, plain)
        }
        assert landed == {waiting: False, plain: True}
        assert (stats[waiting].store_writes, stats[waiting].store_failures) == (0, 1)
        assert (stats[plain].store_writes, stats[plain].store_failures) == (1, 0)
        assert await plain.get("alice", "b") is not None
        # The startup check warns of it (and still lets the server start).
        short = f"{waiting.where} has 0 replica(s) following it, fewer than the 1 wait_replicas"
        assert [w for w in await waiting.check() if w.startswith(short)]
        assert not [w for w in await plain.check() if "wait_replicas" in w]
    finally:
        await waiting.aclose()
        await plain.aclose()


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("wait_replicas=x", "wait_replicas in a store URL is a whole number, 0 or more: got 'x'"),
        ("wait_replicas=-1", "wait_replicas in a store URL is a whole number, 0 or more"),
        ("wait_replicas=1.5", "wait_replicas in a store URL is a whole number, 0 or more"),
        ("wait_replicas=", "wait_replicas in a store URL is a whole number, 0 or more: got ''"),
        ("wait_replicas=1&wait_replicas=1", "wait_replicas is given 2 times"),
    ],
)
def test_a_bad_wait_replicas_in_the_url_is_a_value_error(query: str, said: str) -> None:
    for url in (
        "redis://:s3cret@127.0.0.1:6379/0",
        "rediss://user:s3cret@redis.internal:6380/2",
        "unix://:s3cret@/run/redis.sock",
        "redis+sentinel://:s3cret@127.0.0.1:26379/mymaster",
    ):
        with pytest.raises(ValueError, match=said) as raised:
            RedisStore(f"{url}?{query}&password=s3cret")
        assert "s3cret" not in str(raised.value)


def test_wait_replicas_in_a_cluster_url_is_refused_as_the_keyword_is() -> None:
    url = "redis+cluster://:s3cret@127.0.0.1:7000,127.0.0.1:7001"
    with pytest.raises(ValueError, match="not a cluster") as raised:
        RedisStore(f"{url}?wait_replicas=1")
    assert "s3cret" not in str(raised.value)
    assert "redis+cluster://127.0.0.1:7000,127.0.0.1:7001" in str(raised.value)


async def test_a_keyword_that_disagrees_with_the_url_is_a_value_error(
    server: RedisServer,
) -> None:
    """Neither is taken over the other: the error names both. A keyword that agrees, or a URL
    that says nothing, is fine."""
    url = server.url.replace("redis://", "redis://:s3cret@") + "?wait_replicas=1"
    for keyword in (0, 2):
        with pytest.raises(
            ValueError, match=f"wait_replicas={keyword} and the URL's wait_replicas=1 disagree"
        ) as raised:
            RedisStore(url, wait_replicas=keyword)
        assert "s3cret" not in str(raised.value)
    agreeing = RedisStore(url, wait_replicas=1)
    keyword_only = RedisStore(server.url, wait_replicas=2)
    try:
        assert (agreeing.wait_replicas, keyword_only.wait_replicas) == (1, 2)
    finally:
        await agreeing.aclose()
        await keyword_only.aclose()
