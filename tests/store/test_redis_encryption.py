"""RedisStore's records encrypted at rest, on a real redis-server on loopback: no byte of a
conversation readable in Redis (every key scanned, every value read as redis-cli would), while
conversations continue across two workers sharing the store; keys rotated mid-traffic; a
record copied under another id or principal, or tampered with, read as not stored with one
warning; keys given wrong refused at construction; the URL form under `ws-mode serve --store`
(and its --workers, each rebuilding the store from the URL)."""

from __future__ import annotations

import base64
import contextlib
import logging
import re
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from tests.redis_server import RedisServer
from tests.servers import serve, ws_mode_serve
from tests.store_kit import ClosingStore, answers, stored_record, turn, wait_for, who
from ws_mode import ConfigError, WebSocketModeMiddleware
from ws_mode._encryption import key_id
from ws_mode._install import install_hint
from ws_mode.redis_store import RedisStore
from ws_mode.toolkit.cli import main
from ws_mode.toolkit.reference import ReferenceConfig, create_app

KEY_A = secrets.token_bytes(32)
KEY_B = secrets.token_bytes(32)
LOGGER = "ws_mode.redis_store"
UNREADABLE = "cannot be read and is taken as not stored"


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


def everything_in(server: RedisServer, prefix: str) -> bytes:
    """Every byte Redis holds under `prefix`, read as `redis-cli` would: each key's name, its
    DUMP, and its value by type (GET, HGETALL, LRANGE, SMEMBERS, ZRANGE WITHSCORES)."""
    client: Any = redis.Redis.from_url(server.url)
    seen: list[bytes] = []
    try:
        for name in client.scan_iter(match=f"{prefix}:*", count=1000):
            seen.append(name)
            dumped = client.dump(name)
            seen.append(dumped if isinstance(dumped, bytes) else b"")
            kind = client.type(name)
            if kind == b"string":
                seen.append(client.get(name) or b"")
            elif kind == b"hash":
                for field, value in client.hgetall(name).items():
                    seen += [field, value]
            elif kind == b"list":
                seen += client.lrange(name, 0, -1)
            elif kind == b"set":
                seen += list(client.smembers(name))
            elif kind == b"zset":
                seen += [member for member, _ in client.zrange(name, 0, -1, withscores=True)]
    finally:
        client.close()
    return b"\n".join(seen)


def readable(marker: str, held: bytes) -> bool:
    """Whether `marker` is in `held`, as it is or JSON-escaped (inside a stored string)."""
    return marker.encode() in held or orjson.dumps(marker)[1:-1] in held


def written(client: Any, pattern: str) -> bytes:
    """The one key matching `pattern`, once the write that makes it landed (writes finish after
    the terminal event)."""
    assert wait_for(lambda: len(client.keys(pattern)) == 1), pattern
    (key,) = client.keys(pattern)
    assert isinstance(key, bytes)
    return key


def spoken(response: dict[str, Any]) -> list[str]:
    """What a response says: its message texts and its calls' arguments."""
    said: list[str] = []
    for item in response["output"]:
        if item["type"] == "message":
            said += [part["text"] for part in item["content"] if part.get("text")]
        elif item["type"] == "function_call":
            said.append(item["arguments"])
    return [text for text in said if len(text) >= 8]


def worker(store: RedisStore) -> WebSocketModeMiddleware:
    return WebSocketModeMiddleware(
        create_app(ReferenceConfig(tool_calls=2, answer_tokens=6)), store=store, authenticate=who
    )


@contextlib.contextmanager
def workers(*stores: RedisStore) -> Iterator[list[str]]:
    """A uvicorn server per store, each its own middleware: the workers of one deployment."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(serve(ClosingStore(worker(s), s))) for s in stores]


def converse(origins: list[str], turns: int, tag: str) -> tuple[list[str], dict[str, Any]]:
    """A conversation of `turns` turns, each on a new socket of the next origin (so each
    continuation is hydrated from the store): what it said, its markers first; its last
    response."""
    markers = [f"PROMPT-{tag}-{secrets.token_hex(6)}", f"RULES-{tag}-{secrets.token_hex(6)}"]
    fields: dict[str, Any] = {"input": f"Plan it: {markers[0]}", "instructions": markers[1]}
    response: dict[str, Any] = {}
    for step in range(turns):
        event = turn(origins[step % len(origins)], **fields)
        assert event["type"] == "response.completed", event
        response = event["response"]
        markers += spoken(response)
        tool = f"TOOL-{tag}-{step}-{secrets.token_hex(6)}"
        markers += [tool] if step < turns - 1 else []  # the last one is never sent
        following = answers(response)
        for item in following:
            if item.get("type") == "function_call_output":
                item["output"] = tool
            else:
                item["content"] = f"Go on: {tool}"
        fields = {"input": following, "previous_response_id": response["id"]}
    return markers, response


@pytest.mark.parametrize("encrypted", [True, False], ids=["encrypted", "plain"])
def test_no_byte_of_a_conversation_is_readable_in_redis_and_workers_continue_it(
    server: RedisServer, encrypted: bool
) -> None:
    """Two workers, each its own store on one Redis, continue one conversation turn by turn;
    then every key of the store is read: with keys, no marker of the conversation (prompt,
    instructions, tool outputs, every answer) is in any of it; without (the control: the
    scan does find a plain store's), all of them are."""
    prefix = f"enc-{encrypted}-{secrets.token_hex(3)}"
    keys = {"encryption_keys": [KEY_A]} if encrypted else {}
    stores = [RedisStore(server.url, prefix=prefix, **keys) for _ in range(2)]  # type: ignore[arg-type]
    with workers(*stores) as origins:
        markers, last = converse(origins, 4, "w")
        # Both workers still continue it: hydrated, decrypted, on a new socket each.
        for origin in origins:
            event = turn(origin, input=answers(last), previous_response_id=last["id"])
            assert event["type"] == "response.completed", event
    held = everything_in(server, prefix)
    assert held.count(b"\n") > 10  # the conversation is there, as records, indexes, accounts
    visible = [marker for marker in markers if readable(marker, held)]
    if encrypted:
        assert visible == []
        assert key_id(KEY_A).encode() in held  # each record names its key
        assert KEY_A not in held
        assert base64.b64encode(KEY_A) not in held
    else:
        assert visible == markers


def test_keys_rotate_mid_traffic(server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """A conversation begun under key A continues on a worker configured [B, A] (its new
    records under B, the old ones still read), and, once A is dropped ([B] alone), continuing
    it is a clean previous_response_not_found with one WARNING naming why, while a new
    conversation under [B] works."""
    prefix = f"rot-{secrets.token_hex(3)}"
    old, both, new = (
        RedisStore(server.url, prefix=prefix, encryption_keys=keys)
        for keys in ([KEY_A], [KEY_B, KEY_A], [base64.b64encode(KEY_B).decode()])
    )
    with workers(old, both, new) as (under_a, under_b_a, under_b):
        first = turn(under_a, "alice", input="Begin under A.")["response"]
        second = turn(under_b_a, "alice", input=answers(first), previous_response_id=first["id"])
        assert second["type"] == "response.completed", second
        third = turn(
            under_a,
            "alice",
            input=answers(second["response"]),
            previous_response_id=second["response"]["id"],
        )
        # A worker still on [A] cannot read B's record: a miss, never a crash.
        assert third["error"]["code"] == "previous_response_not_found", third
        client: Any = redis.Redis.from_url(server.url)
        chain_key = written(client, f"{prefix}:*:c:{first['id']}")
        assert wait_for(lambda: client.hlen(chain_key) == 2)
        chain = client.hgetall(chain_key)
        client.close()
        heads = {rid.decode(): value.split(b"\n", 1)[0] for rid, value in chain.items()}
        assert key_id(KEY_A).encode() in heads[first["id"]]
        assert key_id(KEY_B).encode() in heads[second["response"]["id"]]
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            event = turn(
                under_b,
                "alice",
                input=answers(second["response"]),
                previous_response_id=second["response"]["id"],
            )
        assert event["error"]["code"] == "previous_response_not_found", event
        lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        assert len(lines) == 1, lines
        assert UNREADABLE in lines[0]
        assert "not among the store's keys" in lines[0]
        assert key_id(KEY_A) in lines[0]
        fresh = turn(under_b, "alice", input="Begin under B.")["response"]
        event = turn(under_b_a, "alice", input=answers(fresh), previous_response_id=fresh["id"])
        assert event["type"] == "response.completed", event


@pytest.mark.parametrize("encrypted", [True, False], ids=["encrypted", "plain"])
def test_a_conversation_copied_into_another_principals_keys_does_not_continue(
    server: RedisServer, caplog: pytest.LogCaptureFixture, encrypted: bool
) -> None:
    """Someone with write access to Redis copies alice's conversation (its index and its
    chain's hash) into bob's keys: bob continuing it gets previous_response_not_found and the
    log one WARNING, since each record is bound to its principal; a plain store (the control)
    would hand alice's conversation to bob."""
    prefix = f"steal-{encrypted}-{secrets.token_hex(3)}"
    keys = {"encryption_keys": [KEY_A]} if encrypted else {}
    store = RedisStore(server.url, prefix=prefix, **keys)  # type: ignore[arg-type]
    with workers(store) as (origin,):
        mine = turn(origin, "alice", input="Alice's secret plan.")["response"]
        theirs = turn(origin, "bob", input="Bob's own.")["response"]
        client: Any = redis.Redis.from_url(server.url)
        try:
            index = written(client, f"{prefix}:*:r:{mine['id']}")
            bobs = written(client, f"{prefix}:*:r:{theirs['id']}")
            alice_scope = index.decode().rsplit(":r:", 1)[0]
            bob_scope = bobs.decode().rsplit(":r:", 1)[0]
            chain = client.hgetall(f"{alice_scope}:c:{mine['id']}")
            client.set(f"{bob_scope}:r:{mine['id']}", mine["id"])
            client.hset(f"{bob_scope}:c:{mine['id']}", mapping=chain)
        finally:
            client.close()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            event = turn(origin, "bob", input=answers(mine), previous_response_id=mine["id"])
        lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    if encrypted:
        assert event["error"]["code"] == "previous_response_not_found", event
        assert len(lines) == 1, lines
        assert "failed authentication" in lines[0]
    else:
        assert event["type"] == "response.completed", event
        assert lines == []


@pytest.mark.anyio
async def test_a_record_copied_or_tampered_with_is_a_clean_miss_with_one_warning(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A record copied under another id, or into another principal's keys, an edited head
    and a flipped byte of ciphertext all fail authentication: not stored, one WARNING each;
    a plain store meets an encrypted record, an encrypting one a plain record, as misses too
    (unless it reads plaintext during a migration)."""
    prefix = f"copy-{secrets.token_hex(3)}"
    store = RedisStore(server.url, prefix=prefix, encryption_keys=[KEY_A])
    plain = RedisStore(server.url, prefix=prefix)
    migrating = RedisStore(server.url, prefix=prefix, encryption_keys=[KEY_A], read_plaintext=True)
    client: Any = redis.Redis.from_url(server.url)
    try:
        root = stored_record("r1")
        child = stored_record("r2", root)
        await store.put("alice", root)
        await store.put("alice", child)
        assert await store.get_ancestors("alice", "r2") == [root, child]
        assert await store.get_chain("alice", "r1") == {"r1": root, "r2": child}
        chain_key = store.chain_key("alice", "r1")
        sealed = client.hget(chain_key, "r1")
        assert sealed is not None
        assert b"r1" in sealed.split(b"\n", 1)[0]

        def copy(principal: str, response_id: str, value: bytes) -> None:
            client.set(store.index_key(principal, response_id), b"r1")
            client.hset(store.chain_key(principal, "r1"), response_id, value)

        def misses(
            found: object, why: str, expected: object = None, *, again: bool = False
        ) -> None:
            """`found` is a miss, told in one line: a WARNING, or DEBUG for a record the store
            warned about already."""
            lines = [r for r in caplog.records if r.name == LOGGER]
            caplog.clear()
            assert found == expected
            assert len(lines) == 1, [line.getMessage() for line in lines]
            assert lines[0].levelno == (logging.DEBUG if again else logging.WARNING)
            assert UNREADABLE in lines[0].getMessage()
            assert why in lines[0].getMessage()

        caplog.set_level(logging.DEBUG, logger=LOGGER)
        caplog.clear()
        copy("alice", "r3", sealed)  # under another id
        misses(await store.get("alice", "r3"), "failed authentication")
        misses(await store.get_ancestors("alice", "r3"), "failed authentication", [], again=True)
        copy("bob", "r1", sealed)  # under another principal, same id
        misses(await store.get("bob", "r1"), "failed authentication")
        misses(await store.get_chain("bob", "r1"), "failed authentication", {}, again=True)
        head, _, body = sealed.partition(b"\n")
        copy("alice", "r4", head.replace(b'"id":"r1"', b'"id":"r4"') + b"\n" + body)
        misses(await store.get("alice", "r4"), "failed authentication")
        flipped = sealed[:-1] + bytes([sealed[-1] ^ 1])
        client.hset(chain_key, "r1", flipped)
        misses(await store.get_ancestors("alice", "r2"), "failed authentication", [])
        client.hset(chain_key, "r1", sealed)
        assert await store.get_ancestors("alice", "r2") == [root, child]
        # A store without keys meets an encrypted record; an encrypting one a plain record.
        misses(await plain.get("alice", "r1"), "the store has no encryption keys")
        await plain.put("carol", stored_record("p1"))
        misses(await store.get("carol", "p1"), "a plaintext record")
        assert await migrating.get("carol", "p1") == stored_record("p1")
        assert await migrating.get_ancestors("alice", "r2") == [root, child]
        assert caplog.records == []
    finally:
        client.close()
        for opened in (store, plain, migrating):
            await opened.aclose()


def test_keys_given_wrong_are_one_clear_error_at_construction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Malformed, wrongly sized, missing or doubled keys are a ConfigError when the store is
    made (nothing is connected), naming the key's position or the variable, never a key."""
    url = "redis://127.0.0.1:1/0"
    secret = base64.b64encode(KEY_A).decode()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"encryption_keys": [KEY_A[:16]]}, "is 16 bytes long: AES-256 keys are 32"),
        ({"encryption_keys": [secret[:-8]]}, "encryption key 1 is"),
        ({"encryption_keys": [KEY_A, "not*base64!"]}, "encryption key 2 is not base64"),
        ({"encryption_keys": []}, "encryption_keys is empty"),
        ({"encryption_keys": [KEY_A, secret]}, "lists one key twice"),
        ({"encryption_keys": secret}, "a list of keys"),
        ({"read_plaintext": True}, "read_plaintext is for a store that encrypts"),
    ]
    for given, message in cases:
        with pytest.raises(ConfigError, match=message) as raised:
            RedisStore(url, **given)
        assert secret not in str(raised.value)
    monkeypatch.delenv("WS_MODE_TEST_KEYS", raising=False)
    with pytest.raises(ConfigError, match=r"WS_MODE_TEST_KEYS .* is unset"):
        RedisStore(f"{url}?encryption_keys_env=WS_MODE_TEST_KEYS")
    monkeypatch.setenv("WS_MODE_TEST_KEYS", f"{secret},{secret[:20]}")
    with pytest.raises(ConfigError, match=r"key 2 is .*in the environment variable") as raised:
        RedisStore(f"{url}?encryption_keys_env=WS_MODE_TEST_KEYS")
    assert secret not in str(raised.value)
    with pytest.raises(ValueError, match="names an environment variable") as refused:
        RedisStore(f"{url}?encryption_keys_env={secret}")
    assert secret not in str(refused.value)
    with pytest.raises(ConfigError, match="give one of them"):
        RedisStore(f"{url}?encryption_keys_env=WS_MODE_TEST_KEYS", encryption_keys=[KEY_A])
    monkeypatch.setenv("WS_MODE_TEST_KEYS", f"{base64.b64encode(KEY_B).decode()}, {secret}")
    store = RedisStore(f"{url}?encryption_keys_env=WS_MODE_TEST_KEYS&read_plaintext=true")
    assert store.encryption_key_ids == (key_id(KEY_B), key_id(KEY_A))
    assert store.read_plaintext
    client: Any = store.client
    taken = set(client.connection_pool.connection_kwargs)  # what redis-py was given
    assert not {"encryption_keys_env", "read_plaintext"} & taken


def test_ws_mode_serve_takes_the_keys_from_the_variable_its_store_url_names(
    server: RedisServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`ws-mode serve --workers 2 --store redis://...?encryption_keys_env=NAME`: each worker
    rebuilds the store from the URL and reads the keys from the variable it inherits; a
    conversation continues on new sockets and nothing of it is readable in Redis. The
    variable unset is the command's one clear error."""
    monkeypatch.setenv("WS_MODE_STORE_KEYS", base64.b64encode(KEY_B).decode())
    prefix = "ws_mode"
    before = everything_in(server, prefix)
    url = f"{server.url}?encryption_keys_env=WS_MODE_STORE_KEYS"
    flags = ("--tool-calls", "1", "--workers", "2", "--store", url)
    with ws_mode_serve(*flags, cwd=tmp_path) as served:
        markers, _ = converse([served.origin], 3, "serve")
    held = everything_in(server, prefix)
    assert held != before
    assert key_id(KEY_B).encode() in held
    assert [marker for marker in markers if readable(marker, held)] == []
    monkeypatch.delenv("WS_MODE_STORE_KEYS")
    for command in ("serve", "proxy"):
        assert main([command, "--store", url, "--port", "0"]) == 2
        said = capsys.readouterr().err
        assert "argument --store: the environment variable WS_MODE_STORE_KEYS" in said, said
        assert "is unset" in said


def test_without_cryptography_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """cryptography is imported on first use, only by a store given keys: without it, making
    one is an ImportError with the install hint of the encryption extra; a store without keys
    never imports it."""
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.ciphers.aead", None)
    with pytest.raises(ImportError, match=re.escape(install_hint("encryption"))):
        RedisStore("redis://127.0.0.1:1/0", encryption_keys=[KEY_A])
    assert RedisStore("redis://127.0.0.1:1/0").encryption_key_ids == ()
