"""The conversation key: one per chain of responses, handed to the handler in `x-session-id`
and on the Turn, the same through a reconnect, another worker (a shared Redis), stateful HTTP
and a record stored before keys; scoped to the principal, never the client's to choose.

Real uvicorn servers, the kit's `websockets` client, httpx, a real Redis."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.redis_server import RedisServer
from tests.servers import serve
from tests.store_kit import ClosingStore, read_body, who
from ws_mode import ConfigError, StoredResponse, WebSocketModeMiddleware, turn
from ws_mode._asgi import Receive, Scope, Send
from ws_mode._store import MemoryStore, ResponseStore
from ws_mode.redis_store import RedisStore
from ws_mode.testing._client import connect

SECRET = "a fleet's shared secret, 32 chars"
HEX_KEY = re.compile(r"[0-9a-f]{32}\Z")


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    """A handler answering with what it was handed: the key headers, the Turn's key, and the
    body's `prompt_cache_key` and `cache_salt` (as the output text, JSON)."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            kind = message["type"].removeprefix("lifespan.")
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return
    body = json.loads(await read_body(receive))
    current = turn(scope)
    seen = {
        "headers": {
            name.decode(): value.decode()
            for name, value in scope["headers"]
            if name in (b"x-session-id", b"x-smg-routing-key")
        },
        "header_count": sum(1 for name, _ in scope["headers"] if name == b"x-session-id"),
        "turn": current.conversation_key if current is not None else None,
        "prompt_cache_key": body.get("prompt_cache_key"),
        "cache_salt": body.get("cache_salt"),
    }
    text = {"type": "output_text", "text": json.dumps(seen), "annotations": []}
    item = {"type": "message", "id": "msg_" + secrets.token_hex(4), "role": "assistant"}
    response = {
        "id": "resp_" + secrets.token_hex(8),
        "object": "response",
        "status": "completed",
        "model": "echo",
        "output": [{**item, "status": "completed", "content": [text]}],
    }
    answer = json.dumps(response).encode()
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


def seen(response: dict[str, Any]) -> dict[str, Any]:
    """What the handler was handed, from a response object `echo` made; over plain HTTP (no
    Turn) its `turn` is the header's key."""
    found: dict[str, Any] = json.loads(response["output"][0]["content"][0]["text"])
    if found["turn"] is None:
        found["turn"] = found["headers"].get("x-session-id")
    return found


def over_socket(
    base: str, token: str = "alice", headers: dict[str, str] | None = None, **fields: Any
) -> dict[str, Any]:
    """One create on a new socket; the response object it ended with."""
    with connect(base, headers={"Authorization": f"Bearer {token}", **(headers or {})}) as ws:
        ws.send({"type": "response.create", "model": "echo", "input": "hi", **fields})
        event: dict[str, Any] = ws.receive_turn(timeout=20)[-1]
    assert event["type"] == "response.completed", event
    response: dict[str, Any] = event["response"]
    return response


def over_http(base: str, token: str = "alice", **fields: Any) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}", "x-session-id": "chosen-by-the-client"}
    body = {"model": "echo", "input": "hi", **fields}
    answer = httpx.post(base + "/v1/responses", json=body, headers=headers, timeout=20)
    assert answer.status_code == 200, answer.text
    response: dict[str, Any] = answer.json()
    return response


def app(store: ResponseStore | None = None, **options: Any) -> Any:
    middleware = WebSocketModeMiddleware(
        echo,
        authenticate=who,
        store=store,
        stateful_http=store is not None,
        **options,
    )
    return ClosingStore(middleware, store) if store is not None else middleware


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


def test_every_turn_of_a_chain_carries_its_key_never_the_clients() -> None:
    with serve(app()) as base, connect(base, headers={"x-session-id": "forged"}) as ws:
        ws.send({"type": "response.create", "model": "echo", "input": "hi"})
        first = ws.receive_turn(timeout=20)[-1]["response"]
        handed = seen(first)
        key = handed["turn"]
        assert HEX_KEY.match(key)
        # The client's header is replaced, once, by the key.
        assert handed["headers"] == {"x-session-id": key}
        assert handed["header_count"] == 1
        parent = first["id"]
        for lane in (None, "other-lane"):
            create = {"type": "response.create", "model": "echo", "input": "more"}
            create["previous_response_id"] = parent
            if lane is not None:
                create["stream_id"] = lane
            ws.send(create)
            response = ws.receive_turn(timeout=20)[-1]["response"]
            assert seen(response)["turn"] == key
            assert seen(response)["headers"] == {"x-session-id": key}
            parent = response["id"]
        ws.send({"type": "response.create", "model": "echo", "input": "a new chain"})
        other = seen(ws.receive_turn(timeout=20)[-1]["response"])["turn"]
    assert HEX_KEY.match(other)
    assert other != key
    # The key names neither the response nor the principal.
    assert first["id"] not in key
    assert "alice" not in key


def test_a_chain_keeps_its_key_through_a_reconnect_another_worker_and_http(
    redis: RedisServer,
) -> None:
    """Two workers share a Redis and the secret; the chain starts on one, goes on over another
    socket on the other, then over stateful HTTP on the first: one key throughout."""
    worker_a = app(RedisStore(redis.url, prefix="ck1:"), conversation_key_secret=SECRET)
    worker_b = app(RedisStore(redis.url, prefix="ck1:"), conversation_key_secret=SECRET)
    with serve(worker_a) as base_a, serve(worker_b) as base_b:
        first = over_socket(base_a)
        key = seen(first)["turn"]
        second = over_socket(base_b, previous_response_id=first["id"], input="on b")
        assert seen(second)["turn"] == key
        third = over_http(base_a, previous_response_id=second["id"], input="over http")
        assert seen(third)["turn"] == key
        assert seen(third)["headers"] == {"x-session-id": key}  # the client's replaced
        # A chain begun over HTTP has its key too, and a socket continues it.
        begun = over_http(base_b)
        http_key = seen(begun)["turn"]
        assert HEX_KEY.match(http_key)
        assert http_key != key
        assert seen(over_socket(base_a, previous_response_id=begun["id"]))["turn"] == http_key


def test_a_record_stored_without_a_key_gets_one_every_worker_derives_alike(
    redis: RedisServer,
) -> None:
    """A conversation a version before keys stored: every worker sharing the secret derives
    the same key from its first response, and the responses written now carry it."""
    import asyncio

    root = StoredResponse(
        id="resp_old_root",
        parent_id=None,
        chain_id="resp_old_root",
        input=b'{"role":"user","content":"hi"}',
        output=b'{"type":"message","role":"assistant","content":[]}',
        response=json.dumps({"id": "resp_old_root", "object": "response", "output": []}).encode(),
    )
    assert b"conversation_key" not in root.encode()  # the format before keys

    async def store_old() -> None:
        store = RedisStore(redis.url, prefix="ck2:")
        await store.put("principal:alice", root)
        await store.aclose()

    asyncio.run(store_old())
    worker_a = app(RedisStore(redis.url, prefix="ck2:"), conversation_key_secret=SECRET)
    worker_b = app(RedisStore(redis.url, prefix="ck2:"), conversation_key_secret=SECRET)
    with serve(worker_a) as base_a, serve(worker_b) as base_b:
        on_a = over_socket(base_a, previous_response_id="resp_old_root")
        on_b = over_socket(base_b, previous_response_id="resp_old_root")
        over = over_http(base_b, previous_response_id="resp_old_root")
        key = seen(on_a)["turn"]
        assert HEX_KEY.match(key)
        assert seen(on_b)["turn"] == key == seen(over)["turn"]
        # What was written now carries it: continued on the other worker, the same.
        assert seen(over_socket(base_b, previous_response_id=on_a["id"]))["turn"] == key
        # Another principal's view of the same ids is not theirs: not found.
        with connect(base_a, headers={"Authorization": "Bearer mallory"}) as ws:
            ws.send({"type": "response.create", "previous_response_id": "resp_old_root"})
            assert ws.receive_turn(timeout=20)[-1]["type"] == "error"


def test_a_prompt_cache_key_seeds_the_key_within_its_principal_only() -> None:
    with serve(app(conversation_key_secret=SECRET)) as base:
        alice = seen(over_socket(base, prompt_cache_key="project-1"))["turn"]
        again = seen(over_socket(base, prompt_cache_key="project-1"))["turn"]
        bob = seen(over_socket(base, token="bob", prompt_cache_key="project-1"))["turn"]
        # Bob sending Alice's key as his prompt_cache_key does not make hers either.
        forged = seen(over_socket(base, token="bob", prompt_cache_key=alice))["turn"]
        plain_1 = seen(over_socket(base))["turn"]
        plain_2 = seen(over_socket(base))["turn"]
    assert alice == again
    assert len({alice, bob, forged, plain_1, plain_2}) == 5


@pytest.mark.parametrize(
    "hostile",
    [
        "x" * 200_000,
        "line\r\nx-session-id: forged\r\n\0",
        12345,
        {"not": "a string"},
        "",
    ],
)
def test_a_hostile_prompt_cache_key_never_reaches_a_header(hostile: object) -> None:
    with serve(app(conversation_key_secret=SECRET)) as base:
        handed = seen(over_socket(base, prompt_cache_key=hostile))
    assert HEX_KEY.match(handed["turn"])
    assert handed["headers"] == {"x-session-id": handed["turn"]}
    assert handed["header_count"] == 1
    assert handed["prompt_cache_key"] == hostile  # passed on as the client sent it, in the body


def test_the_headers_and_the_body_fields_are_configurable() -> None:
    both = app(
        conversation_key_headers=("X-Session-Id", "x-smg-routing-key"),
        fill_prompt_cache_key=True,
        cache_salt=True,
        conversation_key_secret=SECRET,
    )
    with serve(both) as base:
        handed = seen(over_socket(base))
        own = seen(over_socket(base, prompt_cache_key="mine"))
        salt_bob = seen(over_socket(base, token="bob"))["cache_salt"]
        with connect(base) as ws:
            ws.send({"type": "response.create", "model": "echo", "input": "x"})
            continued = ws.receive_turn(timeout=20)[-1]["response"]
            ws.send({"type": "response.create", "previous_response_id": continued["id"]})
            handed_next = seen(ws.receive_turn(timeout=20)[-1]["response"])
    key = handed["turn"]
    assert handed["headers"] == {"x-session-id": key, "x-smg-routing-key": key}
    assert handed["prompt_cache_key"] == key  # filled: the client sent none
    assert own["prompt_cache_key"] == "mine"  # the client's own is kept
    assert HEX_KEY.match(handed["cache_salt"])
    assert handed["cache_salt"] == own["cache_salt"]
    assert salt_bob != handed["cache_salt"]
    assert handed_next["prompt_cache_key"] == handed_next["turn"] == seen(continued)["turn"]
    with serve(app(conversation_key_headers=None)) as base:
        off = seen(over_socket(base, headers={"x-session-id": "the client's"}))
    # Off, the name is nobody's: the client's header passes as any header does.
    assert off["headers"] == {"x-session-id": "the client's"}
    assert off["turn"] != "the client's"
    assert HEX_KEY.match(off["turn"])
    assert off["prompt_cache_key"] is None
    assert off["cache_salt"] is None


@pytest.mark.parametrize(
    "options",
    [
        {"conversation_key_headers": "x-session-id"},
        {"conversation_key_headers": ("bad header",)},
        {"conversation_key_headers": ("authorization",)},
        {"conversation_key_headers": ("sec-websocket-key",)},
        {"conversation_key_secret": "short"},
        {"conversation_key_secret": 42},
        {"cache_salt": "yes"},
        {"fill_prompt_cache_key": 1},
    ],
)
def test_bad_conversation_key_options_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        WebSocketModeMiddleware(echo, **options)


def test_a_miss_forwarded_to_the_handler_still_gets_a_key() -> None:
    """A `previous_response_id` nobody here knows, forwarded (`on_cache_miss="forward"`): a
    fresh key, inherited by what continues it on the connection."""
    with serve(app(on_cache_miss="forward")) as base, connect(base) as ws:
        ws.send({"type": "response.create", "model": "echo", "previous_response_id": "resp_x"})
        response = ws.receive_turn(timeout=20)[-1]["response"]
        key = seen(response)["turn"]
        ws.send(
            {"type": "response.create", "model": "echo", "previous_response_id": response["id"]}
        )
        assert seen(ws.receive_turn(timeout=20)[-1]["response"])["turn"] == key
    assert HEX_KEY.match(key)


def test_a_memory_store_keeps_the_key_with_the_record() -> None:
    store = MemoryStore()
    with serve(app(store)) as base:
        first = over_socket(base)
        key = seen(first)["turn"]
        assert seen(over_socket(base, previous_response_id=first["id"]))["turn"] == key
    records = list(store._records.values())
    assert records
    assert all(record.conversation_key == key for record, _ in records)


def test_stateful_http_fills_the_body_fields_and_keeps_the_input() -> None:
    """Over stateful HTTP too: `prompt_cache_key` filled with the chain's key when the client
    sent none, `cache_salt` the principal's; the input reaches the handler whole."""
    store = MemoryStore()
    options = {"fill_prompt_cache_key": True, "cache_salt": True}
    seen_inputs: list[Any] = []

    async def recording(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            body = await read_body(receive)
            seen_inputs.append(json.loads(body).get("input"))

            async def replay() -> dict[str, Any]:
                return {"type": "http.request", "body": body, "more_body": False}

            await echo(scope, replay, send)
            return
        await echo(scope, receive, send)

    middleware = WebSocketModeMiddleware(
        recording, authenticate=who, store=store, stateful_http=True, **options
    )
    with serve(middleware) as base:
        first = over_http(base, input="hello there")
        second = over_http(base, previous_response_id=first["id"], input="and more")
        own = over_http(base, prompt_cache_key="mine")
    key = seen(first)["turn"]
    assert seen(first)["prompt_cache_key"] == key
    assert seen(second)["prompt_cache_key"] == seen(second)["turn"] == key
    assert seen(own)["prompt_cache_key"] == "mine"
    assert seen(first)["cache_salt"] == seen(second)["cache_salt"] == seen(own)["cache_salt"]
    # A string input reaches the handler as its one user message, as a continuation's does.
    assert seen_inputs[0] == [{"role": "user", "content": "hello there"}]
    assert [item.get("content") for item in seen_inputs[1]][-1] == "and more"
    assert len(seen_inputs[1]) == 3  # the first input, its answer, the new input
