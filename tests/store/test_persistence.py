"""Between a connection's cache and the store (`ws_mode._persistence`), with a real
`MemoryStore`: a missing parent is hydrated whole (its ancestors, never a fork) or not at all;
a miss waits for a write under way in this process; a failing store is unavailable, counted
and logged; a response is written with the ancestors never stored, ancestors first, as work of
the process that no caller cancels and `flush_writes` waits for."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import orjson
import pytest

from ws_mode import AuthenticationFailed, CachedResponse, Limits, MemoryStore, StoredResponse
from ws_mode._cache import ResponseCache
from ws_mode._items import encode_items
from ws_mode._persistence import (
    POLL_SECONDS,
    StoreLink,
    StoreUnavailable,
    flush_writes,
    pending_writes,
    store_scope,
)
from ws_mode._stats import Stats
from ws_mode._store import ResponseStore

pytestmark = pytest.mark.anyio

SCOPE = "principal:alice"
#: A miss looks once more a moment later; these tests never wait for a write from elsewhere.
QUICK = Limits(store_wait_seconds=0.05, store_read_seconds=10.0, store_write_seconds=10.0)
#: A bound on what must not hang (never a speed).
HANG = 10.0


def said(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


def asked(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def record(response_id: str, parent: str | None = None, chain: str | None = None) -> StoredResponse:
    response = {"id": response_id, "object": "response", "status": "completed"}
    return StoredResponse(
        id=response_id,
        parent_id=parent,
        chain_id=chain or parent or response_id,
        input=encode_items([asked(f"to {response_id}")]),
        output=encode_items([said(f"from {response_id}")]),
        response=orjson.dumps(response),
        tools_digest=b"\x01\x02",
    )


def node(
    response_id: str,
    parent: CachedResponse | None = None,
    *,
    storable: bool = True,
    remote: bool = False,
) -> CachedResponse:
    return CachedResponse(
        id=response_id,
        response={"id": response_id, "object": "response", "status": "completed"},
        input_items=[asked(f"to {response_id}")],
        output_items=[said(f"from {response_id}")],
        parent=parent,
        storable=storable,
        remote=remote,
    )


def cache() -> ResponseCache:
    return ResponseCache(max_entries=16, max_bytes=1 << 24)


class RecordingStore(MemoryStore):
    """A `MemoryStore` that records the ids it is asked to keep, in order; while `gate` is
    set to an unset event, writes wait for it; while `down`, they fail."""

    def __init__(self) -> None:
        super().__init__()
        self.puts: list[str] = []
        self.gate: asyncio.Event | None = None
        self.down = False
        self.lookups = 0

    async def get_ancestors(self, principal: str, response_id: str) -> list[StoredResponse]:
        self.lookups += 1
        return await super().get_ancestors(principal, response_id)

    async def put(self, principal: str, record: StoredResponse) -> int:
        self.puts.append(record.id)
        if self.gate is not None:
            await self.gate.wait()
        if self.down:
            raise ConnectionError("the store is down")
        return await super().put(principal, record)


async def stored(store: MemoryStore, *records: StoredResponse, scope: str = SCOPE) -> None:
    for each in records:
        await store.put(scope, each)


# --- hydrating a missing parent --------------------------------------------------------------


async def test_a_missing_parent_is_hydrated_with_its_ancestors_and_no_fork() -> None:
    store, stats = MemoryStore(), Stats()
    root, middle, leaf = record("r0"), record("r1", "r0"), record("r2", "r1", "r0")
    fork = record("r1b", "r0")
    await stored(store, root, middle, fork, leaf)
    held = cache()
    found = await StoreLink(store, stats, SCOPE, QUICK).hydrate("r2", "lane", held)
    assert found is not None
    assert held.get("r2") is found  # it joined the cache: the turn proceeds as a hit
    assert [each.id for each in found.chain()] == ["r0", "r1", "r2"]
    assert list(found.context_items()) == [
        item for each in ("r0", "r1", "r2") for item in (asked(f"to {each}"), said(f"from {each}"))
    ]
    assert found.response == {"id": "r2", "object": "response", "status": "completed"}
    assert found.stream_id == "lane"
    assert found.tools_digest == b"\x01\x02"
    assert found.storable
    assert not found.remote  # continuations are joined here, not passed on
    assert stats.store_hydrations == 1


async def test_a_response_not_stored_whole_for_this_scope_is_not_hydrated() -> None:
    store, stats = MemoryStore(), Stats()
    await stored(store, record("r0"), record("r1", "r0"), scope="principal:bob")
    await stored(store, record("r0"), record("r1", "r0"))
    await store.delete(SCOPE, "r0")  # ours, but its parent is not any more
    link = StoreLink(store, stats, SCOPE, QUICK)
    held = cache()
    assert await link.hydrate("r1", None, held) is None
    assert await link.hydrate("r_never", None, held) is None
    assert len(held) == 0
    assert stats.store_hydrations == 0
    assert stats.store_failures == 0  # a miss is no failure


async def test_a_miss_waits_for_the_write_of_that_response_under_way_here() -> None:
    store, stats = RecordingStore(), Stats()
    store.gate = asyncio.Event()
    patient = Limits(store_wait_seconds=60.0, store_read_seconds=HANG)
    writing = StoreLink(store, stats, SCOPE, QUICK).write(node("r1"))
    assert writing is not None
    reading = asyncio.create_task(
        StoreLink(store, stats, SCOPE, patient).hydrate("r1", None, cache())
    )
    # Longer than a genuine miss waits (it looks once more after `POLL_SECONDS`, then gives
    # up): a reader that ignored the write would have looked twice and returned None by now.
    await asyncio.sleep(POLL_SECONDS * 6)
    assert not reading.done()
    assert store.lookups == 1  # it waits on the write itself, not by polling the store
    store.gate.set()
    found = await asyncio.wait_for(reading, HANG)
    assert found is not None
    assert found.id == "r1"


class FailingStore(MemoryStore):
    async def get_ancestors(self, principal: str, response_id: str) -> list[StoredResponse]:
        raise ConnectionError("redis://user:secret@10.0.0.5 refused")


async def test_a_store_that_fails_is_unavailable_counted_and_logged_never_told(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stats = Stats()
    link = StoreLink(FailingStore(), stats, SCOPE, QUICK)
    with (
        caplog.at_level(logging.WARNING, logger="ws_mode._persistence"),
        pytest.raises(StoreUnavailable) as unavailable,
    ):
        await link.hydrate("r1", None, cache())
    assert "secret" not in str(unavailable.value)  # the client hears a generic message
    assert isinstance(unavailable.value.__cause__, ConnectionError)
    assert stats.store_failures == 1
    assert "refused" in caplog.text  # the operator reads why


class RequiredOnly:
    """A store of the application's own with only the required calls."""

    def __init__(self) -> None:
        self.memory = MemoryStore()
        self.chains_read = 0

    async def put(self, principal: str, record: StoredResponse) -> int | None:
        return await self.memory.put(principal, record)

    async def get_chain(self, principal: str, response_id: str) -> dict[str, StoredResponse]:
        self.chains_read += 1
        return await self.memory.get_chain(principal, response_id)

    async def delete(self, principal: str, response_id: str) -> bool:
        return await self.memory.delete(principal, response_id)


async def test_a_store_without_get_ancestors_is_read_whole_and_its_chain_followed() -> None:
    store = RequiredOnly()
    await stored(store.memory, record("r0"), record("r1", "r0"), record("r1b", "r0"))
    link = StoreLink(cast(ResponseStore, store), Stats(), SCOPE, QUICK)
    found = await link.hydrate("r1", None, cache())
    assert found is not None
    assert [each.id for each in found.chain()] == ["r0", "r1"]
    assert store.chains_read == 1


# --- writing a response ----------------------------------------------------------------------


async def test_a_response_is_written_with_its_ancestors_never_stored_ancestors_first() -> None:
    store, stats = RecordingStore(), Stats()
    link = StoreLink(store, stats, SCOPE, QUICK)
    warm_up = node("w")  # answered without a handler: never written by itself
    first = node("r1", warm_up)
    assert link.write(first) is not None
    await flush_writes(HANG)
    assert store.puts == ["w", "r1"]
    assert link.write(node("r2", first)) is not None
    await flush_writes(HANG)
    assert store.puts == ["w", "r1", "r2"]  # its ancestors are known stored
    assert stats.store_writes == 3
    # What was written hydrates elsewhere as it was.
    found = await StoreLink(store, Stats(), SCOPE, QUICK).hydrate("r2", None, cache())
    assert found is not None
    assert [each.id for each in found.chain()] == ["w", "r1", "r2"]
    assert list(found.context_items()) == list(node("r2", node("r1", node("w"))).context_items())


async def test_a_hydrated_parent_is_not_written_again() -> None:
    store = RecordingStore()
    await stored(store, record("r0"), record("r1", "r0"))
    link = StoreLink(store, Stats(), SCOPE, QUICK)
    parent = await link.hydrate("r1", None, cache())
    assert parent is not None
    store.puts.clear()
    link.write(node("r2", parent))
    await flush_writes(HANG)
    assert store.puts == ["r2"]


async def test_a_response_that_may_not_be_stored_is_never_written() -> None:
    store = RecordingStore()
    link = StoreLink(store, Stats(), SCOPE, QUICK)
    private = node("p", storable=False)
    assert link.write(private) is None
    assert link.write(node("after_private", private)) is None  # its conversation said no
    assert link.write(node("remote", remote=True)) is None  # the handler keeps it
    assert pending_writes() == 0
    assert store.puts == []


async def test_a_write_that_failed_is_written_again_with_the_next_response(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, stats = RecordingStore(), Stats()
    link = StoreLink(store, stats, SCOPE, QUICK)
    store.down = True
    first = node("r1")
    with caplog.at_level(logging.WARNING, logger="ws_mode._persistence"):
        failed = link.write(first)
        assert failed is not None
        assert await failed is False  # counted and logged, never raised
    assert stats.store_failures == 1
    assert "r1" in caplog.text
    store.down = False
    store.puts.clear()
    link.write(node("r2", first))
    await flush_writes(HANG)
    assert store.puts == ["r1", "r2"]  # the chain is whole again
    assert len(store) == 2


async def test_a_write_is_the_processs_and_outlives_the_task_that_started_it() -> None:
    store = RecordingStore()
    store.gate = asyncio.Event()
    link = StoreLink(store, Stats(), SCOPE, QUICK)
    started: list[asyncio.Task[bool] | None] = []
    written = asyncio.Event()

    async def connection() -> None:
        started.append(link.write(node("r1")))
        written.set()
        await asyncio.Event().wait()  # the client leaves while the write is under way

    serving = asyncio.create_task(connection())
    await asyncio.wait_for(written.wait(), HANG)
    serving.cancel()
    await asyncio.gather(serving, return_exceptions=True)
    (write,) = started
    assert write is not None
    assert not write.done()
    store.gate.set()
    assert await asyncio.wait_for(write, HANG) is True
    assert len(store) == 1


async def test_flush_writes_waits_for_the_writes_under_way_on_this_loop() -> None:
    await asyncio.wait_for(flush_writes(60.0), HANG)  # nothing under way: back at once
    store = RecordingStore()
    store.gate = asyncio.Event()
    link = StoreLink(store, Stats(), SCOPE, QUICK)
    link.write(node("r1"))
    link.write(node("s1"))
    assert pending_writes() == 2
    flushing = asyncio.create_task(flush_writes(60.0))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not flushing.done()
    store.gate.set()
    await asyncio.wait_for(flushing, HANG)
    assert pending_writes() == 0
    assert len(store) == 2


async def test_a_conversation_over_the_principals_bound_is_refused_and_older_ones_dropped() -> None:
    store, stats = MemoryStore(), Stats()
    link = StoreLink(store, stats, SCOPE, QUICK)
    link.write(node("a1"))
    await flush_writes(HANG)
    one_conversation = store.principal_bytes(SCOPE)
    store.limit_principal_bytes(one_conversation + 64)  # room for one conversation, not two
    link.write(node("b1"))  # a second conversation: the first goes to make room
    await flush_writes(HANG)
    assert (stats.store_writes, stats.store_dropped) == (2, 1)
    assert await store.get(SCOPE, "a1") is None
    large = CachedResponse(
        id="huge", response={"id": "huge"}, input_items=[asked("x" * one_conversation)],
        output_items=[], parent=None, storable=True,
    )  # fmt: skip
    link.write(large)
    await flush_writes(HANG)
    assert stats.store_refused == 1
    assert await store.get(SCOPE, "huge") is None
    assert await store.get(SCOPE, "b1") is not None  # nothing was dropped for it


# --- whose stored responses a caller sees ----------------------------------------------------


def test_a_caller_sees_its_principals_scope_or_the_shared_one() -> None:
    assert store_scope("alice", None, shared=False) == "principal:alice"
    assert store_scope(object(), None, shared=True) == "shared"  # no key needed
    assert store_scope({"tenant": "t1"}, lambda p: p["tenant"], shared=False) == "principal:t1"
    assert store_scope("7", None, shared=False) != store_scope(7, None, shared=False)
    with pytest.raises(AuthenticationFailed) as unkeyed:
        store_scope(object(), None, shared=False)
    assert unkeyed.value.status == 500  # the server's configuration is at fault
