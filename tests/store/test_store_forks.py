"""Forks do not weigh on hydration: continuing a response reads its ancestors only, never
the conversation's other forks, from a real Redis and from the in-process store; `GET` reads
one record."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import redis

from tests.redis_server import RedisServer
from tests.servers import serve
from tests.store_kit import ClosingStore, answers, key, turn, wait_for, who
from ws_mode import WebSocketModeMiddleware
from ws_mode._store import MemoryStore, ResponseStore, StoredResponse
from ws_mode.redis_store import RedisStore
from ws_mode.toolkit.reference import ReferenceConfig, create_app

FORKS = 50
FORK_BYTES = 256 * 1024
#: What `store_scope` makes of the principal "alice" (the hook returns a str).
ALICE = "principal:alice"


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


def fork(parent: StoredResponse, number: int) -> StoredResponse:
    """A large fork of `parent`: another branch of its conversation."""
    text = b"x" * FORK_BYTES
    return StoredResponse(
        id=f"resp_fork{number}",
        parent_id=parent.id,
        chain_id=parent.chain_id,
        input=b'{"role":"user","content":"' + text + b'"}',
        output=b"",
        response=b'{"id":"resp_fork' + str(number).encode() + b'"}',
    )


def sent_by(client: redis.Redis) -> int:
    """The bytes Redis has sent to its clients so far."""
    info = client.info("stats")
    return int(info["total_net_output_bytes"])


def test_hydrating_a_root_reads_the_root_only_however_many_forks_it_has(
    server: RedisServer,
) -> None:
    raw = redis.Redis.from_url(server.url)
    raw.flushall()
    store = RedisStore(server.url)
    middleware = WebSocketModeMiddleware(
        create_app(ReferenceConfig(tool_calls=1, answer_tokens=3)), store=store, authenticate=who
    )
    try:
        with serve(ClosingStore(middleware, store)) as base_url:
            root = turn(base_url, input="One message.")["response"]
            assert wait_for_key(raw, store.index_key(ALICE, root["id"]))

            async def write_forks() -> None:
                writer = RedisStore(server.url)
                kept = raw.hget(store.chain_key(ALICE, root["id"]), root["id"])
                assert isinstance(kept, bytes)
                parent = StoredResponse.decode(kept)
                for number in range(FORKS):
                    await writer.put(ALICE, fork(parent, number))
                await writer.aclose()

            asyncio.run(write_forks())
            record_bytes = len(raw.hget(store.chain_key(ALICE, root["id"]), root["id"]) or b"")
            before = sent_by(raw)
            event = turn(base_url, input=answers(root), previous_response_id=root["id"])
            read = sent_by(raw) - before
    finally:
        raw.close()
    assert event["type"] == "response.completed", event
    assert middleware.stats.store_hydrations == 1
    # The root and the replies to this turn's own write and the INFO call; never the forks
    # (50 x 256 KiB were read whole before).
    assert read < record_bytes + 16 * 1024, (read, record_bytes)


def wait_for_key(client: redis.Redis, name: str) -> bool:
    return wait_for(lambda: bool(client.exists(name)))


@pytest.fixture(params=["memory", "redis"])
async def any_store(
    request: pytest.FixtureRequest, server: RedisServer
) -> AsyncIterator[ResponseStore]:
    opened: ResponseStore = MemoryStore() if request.param == "memory" else RedisStore(server.url)
    if isinstance(opened, RedisStore):
        await opened.client.flushall()
    yield opened
    await opened.aclose()


@pytest.mark.anyio
async def test_ancestors_follow_parent_links_and_skip_forks(any_store: ResponseStore) -> None:
    def record(id: str, parent: StoredResponse | None = None) -> StoredResponse:
        return StoredResponse(
            id=id,
            parent_id=parent.id if parent else None,
            chain_id=parent.chain_id if parent else id,
            input=b'{"role":"user","content":"' + id.encode() + b'"}',
            output=b'{"role":"assistant","content":"line\\nbreak"}',
            response=b'{"id":"' + id.encode() + b'"}',
        )

    a = record("a")
    b = record("b", a)
    c = record("c", b)
    forks = [record(f"f{n}", b) for n in range(5)] + [record("g", a)]
    for each in (a, b, c, *forks):
        await any_store.put(ALICE, each)
    assert await any_store.get_ancestors(ALICE, "a") == [a]
    assert await any_store.get_ancestors(ALICE, "c") == [a, b, c]
    assert await any_store.get_ancestors(ALICE, "f3") == [a, b, forks[3]]
    assert await any_store.get_ancestors(ALICE, "g") == [a, forks[-1]]
    assert await any_store.get_ancestors("principal:bob", "c") == []
    assert await any_store.get_ancestors(ALICE, "nothing") == []
    assert await any_store.get(ALICE, "b") == b
    assert await any_store.get("principal:bob", "b") is None
    assert await any_store.delete(ALICE, "b")
    assert await any_store.get(ALICE, "b") is None
    assert await any_store.get_ancestors(ALICE, "c") == []  # a link is missing
    assert await any_store.get_ancestors(ALICE, "g") == [a, forks[-1]]


def test_stateful_get_reads_one_record(server: RedisServer) -> None:
    raw = redis.Redis.from_url(server.url)
    raw.flushall()
    store = RedisStore(server.url)
    middleware = WebSocketModeMiddleware(
        create_app(ReferenceConfig(tool_calls=1, answer_tokens=3)),
        store=store,
        authenticate=who,
        stateful_http=True,
    )
    try:
        with serve(ClosingStore(middleware, store)) as base_url:
            root = turn(base_url, input="One message.")["response"]
            assert wait_for_key(raw, store.index_key(ALICE, root["id"]))

            async def write_forks() -> None:
                writer = RedisStore(server.url)
                kept = raw.hget(store.chain_key(ALICE, root["id"]), root["id"])
                assert isinstance(kept, bytes)
                parent = StoredResponse.decode(kept)
                for number in range(10):
                    await writer.put(ALICE, fork(parent, number))
                await writer.aclose()

            asyncio.run(write_forks())
            before = sent_by(raw)
            with httpx.Client(base_url=base_url, headers=key("alice"), timeout=10) as http:
                answer = http.get(f"/v1/responses/{root['id']}")
            read = sent_by(raw) - before
    finally:
        raw.close()
    assert answer.status_code == 200
    assert answer.json()["id"] == root["id"]
    assert read < 64 * 1024, read  # not the 10 forks of 256 KiB
