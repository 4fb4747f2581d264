"""A Redis restarted without persistence: what it held is gone, and conversations that were
under way before it restarted are stored whole again by their next write, so a continuation
on another worker finds them (before, every such continuation got
`previous_response_not_found`, even of responses written after the restart: they were kept
without their ancestors)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from tests.redis_server import RedisServer
from tests.servers import serve
from tests.store_kit import ClosingStore, answers, key, stored_record, wait_for, who
from ws_mode import Limits, MemoryStore, Stats, WebSocketModeMiddleware
from ws_mode._persistence import start_write, write_records
from ws_mode._store import ParentNotStored, StoredResponse
from ws_mode.redis_store import RedisStore
from ws_mode.testing._client import connect
from ws_mode.toolkit.reference import ReferenceConfig, create_app

pytestmark = pytest.mark.anyio


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


async def test_a_continuation_of_a_conversation_lost_in_a_restart_is_refused(
    server: RedisServer,
) -> None:
    store = RedisStore(server.url)
    try:
        a = stored_record("a")
        await store.put("alice", a)
        server.restart()  # empty: nothing was persisted
        b = stored_record("b", a)
        with pytest.raises(ParentNotStored, match="does not hold"):
            await store.put("alice", b)
        assert await store.get("alice", "b") is None  # nothing written
        await store.put("alice", a)  # the conversation again, from its first response
        await store.put("alice", b)
        assert await store.get_ancestors("alice", "b") == [a, b]
    finally:
        await store.aclose()


async def test_a_continuation_of_a_response_lost_alone_is_refused_of_one_deleted_kept(
    server: RedisServer,
) -> None:
    store = RedisStore(server.url)
    try:
        a = stored_record("a")
        b = stored_record("b", a)
        await store.put("alice", a)
        await store.put("alice", b)
        # The last write lost, its conversation's hash kept (a failover that promoted a
        # replica a write behind, an RDB snapshot taken before it).
        with server.client() as client:
            client.hdel(store.chain_key("alice", "a"), "b")
        with pytest.raises(ParentNotStored):
            await store.put("alice", stored_record("c", b))
        # A response deleted on purpose is continued without a word, and stays deleted.
        await store.put("alice", b)
        assert await store.delete("alice", "b") is True
        await store.put("alice", stored_record("c", b))
        assert await store.get("alice", "b") is None
    finally:
        await store.aclose()


async def test_the_memory_store_refuses_a_continuation_of_a_conversation_it_dropped() -> None:
    store = MemoryStore(max_records=1)
    a = stored_record("a")
    await store.put("alice", a)
    await store.put("alice", stored_record("other"))  # a is dropped for the bound
    with pytest.raises(ParentNotStored):
        await store.put("alice", stored_record("b", a))
    kept = stored_record("kept")
    await store.put("alice", kept)
    await store.delete("alice", "kept")  # deleted on purpose: continuing it is no loss
    await store.put("alice", stored_record("after", kept))


async def test_a_write_whose_conversation_was_lost_writes_it_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, stats = MemoryStore(), Stats()
    a = stored_record("a")
    b = stored_record("b", a)
    c = stored_record("c", b)
    with caplog.at_level(logging.WARNING, logger="ws_mode"):
        landed = await write_records(store, stats, "alice", c, seconds=5.0, whole=lambda: [a, b, c])
    assert landed
    assert await store.get_ancestors("alice", "c") == [a, b, c]
    assert stats.store_writes == 3
    assert stats.store_failures == 0
    assert "no longer holds the conversation of 'c'" in caplog.text
    # Without the conversation at hand, the write fails and is counted.
    assert not await write_records(store, stats, "bob", c, seconds=5.0)
    assert stats.store_failures == 1


async def test_a_write_that_overtakes_its_parents_waits_for_it_and_rewrites_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class SlowRoots(MemoryStore):
        """A store whose first responses land only once `opened` is set."""

        opened = asyncio.Event()

        async def put(self, principal: str, record: StoredResponse) -> int:
            if record.parent_id is None:
                await self.opened.wait()
            return await super().put(principal, record)

    store, stats = SlowRoots(), Stats()
    a = stored_record("a")
    b = stored_record("b", a)
    with caplog.at_level(logging.WARNING, logger="ws_mode"):
        first = start_write(store, stats, "alice", a, seconds=5.0)
        second = start_write(store, stats, "alice", b, seconds=5.0, whole=lambda: [a, b])
        await asyncio.sleep(0.05)  # b's put found no conversation: it waits for a's write
        SlowRoots.opened.set()
        assert await first
        assert await second
    assert await store.get_ancestors("alice", "b") == [a, b]
    assert stats.store_writes == 2  # nothing written twice
    assert "no longer holds" not in caplog.text


def _turn(socket: Any, **fields: Any) -> dict[str, Any]:
    socket.send({"type": "response.create", "model": "reference", **fields})
    event: dict[str, Any] = socket.receive_turn(timeout=20)[-1]
    return event


def test_conversations_under_way_when_redis_restarts_go_on_on_another_worker(
    server: RedisServer,
) -> None:
    stores = [RedisStore(server.url), RedisStore(server.url)]
    apps = [
        WebSocketModeMiddleware(
            create_app(ReferenceConfig(tool_calls=2)),
            store=store,
            authenticate=who,
            limits=Limits(store_wait_seconds=2.0),
        )
        for store in stores
    ]
    first_app = apps[0]

    def written(count: int) -> bool:
        return bool(first_app.stats.snapshot()["store_writes"] >= count)

    with (
        serve(ClosingStore(apps[0], stores[0])) as first,
        serve(ClosingStore(apps[1], stores[1])) as second,
        connect(first, headers=key("alice")) as socket,
    ):
        started = _turn(socket, input="Plan it.")["response"]
        assert wait_for(lambda: written(1))
        server.restart()  # Redis comes back empty
        # The socket goes on from its cache; each response is written, once the store is
        # back, with the conversation it continues.
        on = _turn(socket, input=answers(started), previous_response_id=started["id"])
        assert on["type"] == "response.completed", on
        assert wait_for(lambda: written(3))  # `started` again, and the new one
        fresh = _turn(socket, input="Something else.")["response"]
        assert wait_for(lambda: written(4))
        with connect(second, headers=key("alice")) as elsewhere:
            for response in (on["response"], fresh):
                event = _turn(
                    elsewhere, input=answers(response), previous_response_id=response["id"]
                )
                assert event["type"] == "response.completed", event
