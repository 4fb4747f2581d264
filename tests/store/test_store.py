"""Responses that outlive the socket: the in-process store, hydration on another worker, the
ZDR rule, scoping, and a store that fails."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.sync.client import ClientConnection, connect

from tests.client_tls import CLIENT_TLS
from tests.principals import by_bearer_token
from ws_mode import ConfigError, Limits, WebSocketModeMiddleware
from ws_mode._items import encode_items
from ws_mode._store import MemoryStore, StoredResponse, chain_of
from ws_mode.testing._loopback import ServerThread
from ws_mode.toolkit.reference import ReferenceConfig, create_app

TERMINAL = ("response.completed", "response.failed", "response.incomplete", "error")
TOOLS = [
    {
        "type": "function",
        "name": "lookup",
        "description": "Look something up.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    }
]
FIELDS: dict[str, Any] = {"model": "reference", "tools": TOOLS}


def record(id: str, parent: str | None = None, chain: str | None = None) -> StoredResponse:
    return StoredResponse(
        id=id,
        parent_id=parent,
        chain_id=chain or parent or id,
        input=b'{"role":"user","content":"' + id.encode() + b'"}',
        output=b"",
        response=b'{"id":"' + id.encode() + b'"}',
    )


# --- the in-process store ---------------------------------------------------------------------


def test_memory_store_keeps_chains_by_principal() -> None:
    async def scenario() -> None:
        store = MemoryStore()
        await store.put("alice", record("r1"))
        await store.put("alice", record("r2", "r1", "r1"))
        await store.put("alice", record("fork", "r1", "r1"))
        chain = await store.get_chain("alice", "r2")
        assert set(chain) == {"r1", "r2", "fork"}
        assert [r.id for r in chain_of(chain, "r2") or []] == ["r1", "r2"]
        assert await store.get_chain("bob", "r2") == {}  # another principal sees nothing
        assert not await store.delete("bob", "r1")
        assert await store.delete("alice", "r1")
        assert chain_of(await store.get_chain("alice", "r2"), "r2") is None  # broken chain
        assert await store.get_chain("alice", "missing") == {}

    asyncio.run(scenario())


def test_memory_store_is_bounded_by_count_bytes_and_time() -> None:
    async def scenario() -> None:
        store = MemoryStore(max_records=2)
        for name in ("a", "b", "c"):
            await store.put("p", record(name))
        assert len(store) == 2
        assert await store.get_chain("p", "a") == {}  # the oldest went first
        small = MemoryStore(max_bytes=record("a").size * 2)
        for name in ("a", "b", "c"):
            await small.put("p", record(name))
        assert small.bytes <= record("a").size * 2
        brief = MemoryStore(ttl_seconds=0.05)
        await brief.put("p", record("a"))
        await asyncio.sleep(0.1)
        assert await brief.get_chain("p", "a") == {}
        assert len(brief) == 0

    asyncio.run(scenario())


def test_a_record_survives_its_encoding() -> None:
    original = StoredResponse(
        id="r", parent_id="p", chain_id="c", input=b"{}", output=b'{"a":"\\u00e9"}',
        response=b'{"id":"r"}', tools_digest=bytes(range(16)),
    )  # fmt: skip
    assert StoredResponse.decode(original.encode()) == original
    lines = encode_items([{"role": "user", "content": "two\nlines\r\n"}])
    multiline = StoredResponse(id="m", parent_id=None, chain_id="m", input=lines,
                               output=b"", response=b"{}")  # fmt: skip
    assert StoredResponse.decode(multiline.encode()) == multiline


def test_the_store_setting_is_checked() -> None:
    with pytest.raises(ConfigError, match="store"):
        WebSocketModeMiddleware(create_app(), store=object())  # type: ignore[arg-type]


# --- two workers sharing a store ------------------------------------------------------------


class Workers:
    """Two servers of the same stateless app, each with its own middleware (its own
    connection caches), sharing one store: two workers behind a load balancer."""

    def __init__(self, store: Any, limits: Limits | None = None) -> None:
        self.store = store
        app = create_app(ReferenceConfig(tool_calls=3, answer_tokens=4))
        self.http_app = app
        self.middlewares = [
            WebSocketModeMiddleware(app, store=store, authenticate=by_bearer_token, limits=limits)
            for _ in range(2)
        ]
        self.servers = [ServerThread(middleware) for middleware in self.middlewares]
        self.urls: list[str] = []

    def __enter__(self) -> Workers:
        self.urls = [server.start() for server in self.servers]
        return self

    def __exit__(self, *exc_info: object) -> None:
        for server in self.servers:
            server.stop()

    def socket(self, worker: int, token: str = "sk-test") -> ClientConnection:
        url = self.urls[worker].replace("http", "ws", 1) + "/v1/responses"
        headers = {"Authorization": f"Bearer {token}"}
        return connect(url, additional_headers=headers, ping_interval=None, max_size=None)


def turn_over(ws: ClientConnection, **fields: Any) -> dict[str, Any]:
    ws.send(json.dumps({"type": "response.create", **FIELDS, **fields}))
    while True:
        event: dict[str, Any] = json.loads(ws.recv(timeout=10))
        if event["type"] in TERMINAL:
            return event


def answers(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool outputs answering the calls of `response`."""
    return [
        {"type": "function_call_output", "call_id": item["call_id"], "output": f"ok {n}"}
        for n, item in enumerate(response["output"])
        if item["type"] == "function_call"
    ]


@pytest.fixture(scope="module")
def workers() -> Iterator[Workers]:
    with Workers(MemoryStore()) as running:
        yield running


@settings(max_examples=15, deadline=None)
@given(route=st.lists(st.integers(0, 1), min_size=2, max_size=5), seed=st.integers(0, 1000))
def test_a_conversation_continued_on_any_worker_equals_http_with_full_history(
    workers: Workers, route: list[int], seed: int
) -> None:
    """Each turn on a new socket of a worker chosen at random, sending only the new items:
    the responses equal those of HTTP with the whole history (the reference model's answer
    depends on the whole context it receives), so each worker hydrated the same context."""
    prompt = f"Question {seed}"
    history: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    previous: str | None = None
    new_input: Any = prompt
    with httpx.Client(verify=CLIENT_TLS, base_url=workers.urls[0], timeout=10) as http:
        for worker in route:
            with workers.socket(worker) as ws:
                event = turn_over(ws, input=new_input, previous_response_id=previous)
            assert event["type"] == "response.completed", event
            via_socket = event["response"]
            answer = http.post("/v1/responses", json={**FIELDS, "input": history}).json()
            assert via_socket["output"] == answer["output"]
            assert via_socket["previous_response_id"] == previous
            new_input = answers(via_socket) or [{"role": "user", "content": "Go on."}]
            history += [*via_socket["output"], *new_input]
            previous = via_socket["id"]


def test_continuing_on_another_worker_at_once_finds_the_response(workers: Workers) -> None:
    """The store write does not delay the terminal event, and still a client that continues
    on another worker the moment it has `response.completed` is not told `not found`."""
    for attempt in range(20):
        with workers.socket(0) as a, workers.socket(1) as b:
            first = turn_over(a, input=f"Race {attempt}")["response"]
            second = turn_over(b, input=answers(first), previous_response_id=first["id"])
            assert second["type"] == "response.completed", second


def test_store_false_is_never_written_and_cannot_be_continued_elsewhere(workers: Workers) -> None:
    before = len(workers.store)
    with workers.socket(0) as a:
        private = turn_over(a, input="Secret", store=False)["response"]
        child = turn_over(a, input=answers(private), previous_response_id=private["id"])
        assert child["type"] == "response.completed"  # the connection's own cache serves it
    assert len(workers.store) == before  # nothing of the conversation was written
    with workers.socket(1) as b:
        for missing in (private["id"], child["response"]["id"]):
            event = turn_over(b, input="More", previous_response_id=missing)
            assert event["error"]["code"] == "previous_response_not_found"


def test_another_principal_cannot_continue_or_learn_of_a_response(workers: Workers) -> None:
    with workers.socket(0, token="sk-alice") as a:
        mine = turn_over(a, input="Mine")["response"]
    with workers.socket(1, token="sk-mallory") as b:
        event = turn_over(b, input="Theirs", previous_response_id=mine["id"])
    assert event["error"]["code"] == "previous_response_not_found"
    with workers.socket(1, token="sk-alice") as a:
        event = turn_over(a, input=answers(mine), previous_response_id=mine["id"])
    assert event["type"] == "response.completed"


class FailingStore(MemoryStore):
    """A store that is down: every call raises (or hangs, with `hang`)."""

    def __init__(self, *, hang: bool = False) -> None:
        super().__init__()
        self.hang = hang
        self.down = True

    async def _fail(self) -> None:
        if self.hang:
            await asyncio.sleep(3600)
        raise ConnectionError("the store is down")

    async def put(self, principal: str, record: StoredResponse) -> None:
        if self.down:
            await self._fail()
        await super().put(principal, record)

    async def get_chain(self, principal: str, response_id: str) -> dict[str, StoredResponse]:
        if self.down:
            await self._fail()
        return await super().get_chain(principal, response_id)

    async def get_ancestors(self, principal: str, response_id: str) -> list[StoredResponse]:
        if self.down:
            await self._fail()
        return await super().get_ancestors(principal, response_id)


@pytest.mark.parametrize("hang", [False, True])
def test_a_store_that_fails_gives_clear_errors_and_the_socket_goes_on(hang: bool) -> None:
    store = FailingStore(hang=hang)
    limits = Limits(store_read_seconds=0.3, store_write_seconds=0.3)
    with Workers(store, limits) as running:
        with running.socket(0) as a:
            first = turn_over(a, input="Hello")["response"]  # the write fails quietly
            again = turn_over(a, input=answers(first), previous_response_id=first["id"])
            assert again["type"] == "response.completed"  # the connection cache still works
        stats = running.middlewares[0].stats
        deadline = time.monotonic() + 5
        while not stats.store_failures and time.monotonic() < deadline:
            time.sleep(0.05)  # the write fails in the background, after its timeout
        assert stats.store_failures >= 1
        with running.socket(1) as b:
            event = turn_over(b, input="More", previous_response_id=first["id"], stream_id="x")
            assert event["error"]["code"] == "store_unavailable"
            assert event["status"] == 503
            assert event["stream_id"] == "x"
            assert turn_over(b, input="Fresh")["type"] == "response.completed"
        store.down = False  # the store is back: new responses are kept and found again
        with running.socket(0) as a:
            kept = turn_over(a, input="Again")["response"]
        with running.socket(1) as b:
            event = turn_over(b, input=answers(kept), previous_response_id=kept["id"])
            assert event["type"] == "response.completed"


def test_hydration_costs_one_lookup_however_long_the_chain(workers: Workers) -> None:
    calls: list[str] = []
    store = workers.store
    original = store.get_ancestors

    async def counted(principal: str, response_id: str) -> list[StoredResponse]:
        calls.append(response_id)
        return await original(principal, response_id)

    previous = None
    new_input: Any = "Count"
    with workers.socket(0) as a:
        for _ in range(8):
            response = turn_over(a, input=new_input, previous_response_id=previous)["response"]
            previous = response["id"]
            new_input = answers(response) or [{"role": "user", "content": "Go on."}]
    store.get_ancestors = counted
    try:
        with workers.socket(1) as b:
            event = turn_over(b, input=new_input, previous_response_id=previous)
    finally:
        del store.get_ancestors
    assert event["type"] == "response.completed"
    assert calls == [previous]  # the whole 8-response chain in one call
