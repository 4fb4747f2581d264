"""The store asked at startup: `RedisStore.check()` names what is wrong with a real Redis (not
there, a wrong database, password or scheme, TLS against plain Redis) and warns when it keeps
nothing on disk; the middleware's lifespan startup fails with that problem, or, with
`start_degraded=True`, starts and says so loudly."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from tests.redis_server import RedisServer
from tests.servers import serve
from tests.store_kit import who
from ws_mode import MemoryStore, WebSocketModeMiddleware
from ws_mode._asgi import Message, Receive, Scope, Send
from ws_mode._store import StoredResponse
from ws_mode.redis_store import RedisStore, RedisStoreError
from ws_mode.testing._loopback import ServerStartError

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


@pytest.fixture(scope="module")
def locked() -> Iterator[RedisServer]:
    with RedisServer(options=("--requirepass", "right-password")) as running:
        yield running


@pytest.fixture(scope="module")
def stopped() -> RedisServer:
    """A port where a Redis was, and nothing answers now."""
    gone = RedisServer().start()
    gone.stop()
    return gone


async def problem_of(url: str, lookup_seconds: float = 2.0) -> BaseException:
    store = RedisStore(url, timeout=lookup_seconds)
    try:
        with pytest.raises((RedisStoreError, TimeoutError)) as failed:
            await store.check()
        return failed.value
    finally:
        await store.aclose()


async def test_a_redis_that_is_not_there_is_named(stopped: RedisServer) -> None:
    problem = await problem_of(stopped.url)
    assert isinstance(problem, RedisStoreError)
    assert str(problem).startswith(f"redis://127.0.0.1:{stopped.port}/0 cannot be reached")


async def test_a_database_that_does_not_exist_is_named(server: RedisServer) -> None:
    problem = await problem_of(server.url.replace("/0", "/1"))  # it has one database
    assert "has no such database" in str(problem)


async def test_a_wrong_password_is_named_and_never_shown(locked: RedisServer) -> None:
    for url in (locked.url, locked.url.replace("redis://", "redis://:wrong-password@")):
        problem = await problem_of(url)
        assert "refused the credentials" in str(problem)
        assert "password@" not in str(problem)
        assert "wrong-password" not in str(problem)
    right = RedisStore(locked.url.replace("redis://", "redis://:right-password@"))
    try:
        await right.check()
    finally:
        await right.aclose()


async def test_tls_against_a_redis_without_tls_is_named(server: RedisServer) -> None:
    problem = await problem_of(server.url.replace("redis://", "rediss://"), lookup_seconds=0.5)
    # A plain Redis waits for the end of a command that never comes: no answer, no error.
    assert isinstance(problem, TimeoutError)
    assert "over TLS" in str(problem)


async def test_one_redis_named_as_a_cluster_is_named(server: RedisServer) -> None:
    url = f"redis+cluster://127.0.0.1:{server.port}"
    problem = await problem_of(url)
    assert "is not a Redis Cluster (cluster mode is off)" in str(problem)


async def test_a_redis_that_keeps_nothing_on_disk_is_warned_about(server: RedisServer) -> None:
    store = RedisStore(server.url)
    try:
        (warning,) = await store.check()
        assert "keeps nothing on disk" in warning
        assert "every stored response is lost" in warning
    finally:
        await store.aclose()


async def test_a_redis_with_an_append_only_file_passes_without_a_warning() -> None:
    with RedisServer(options=("--appendonly", "yes")) as durable:
        store = RedisStore(durable.url)
        try:
            assert await store.check() == []
        finally:
            await store.aclose()


async def test_the_memory_store_always_works() -> None:
    assert await MemoryStore().check() == []


# --- the middleware's lifespan ----------------------------------------------------------------


class Lifespan:
    """An app whose lifespan records what it heard, and a server's side of the protocol."""

    def __init__(self) -> None:
        self.heard: list[str] = []
        self.sent: list[Message] = []

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "lifespan"
        while True:
            message = await receive()
            self.heard.append(message["type"])
            kind = message["type"].removeprefix("lifespan.")
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return

    async def run(self, middleware: WebSocketModeMiddleware) -> None:
        """Start and stop `middleware` as a server would."""
        messages = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]

        async def receive() -> Message:
            return messages.pop(0)

        async def send(message: Message) -> None:
            self.sent.append(message)

        await middleware({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)


def middleware(lifespan: Lifespan, store: Any, **options: Any) -> WebSocketModeMiddleware:
    return WebSocketModeMiddleware(lifespan.app, store=store, authenticate=who, **options)


async def test_a_store_that_does_not_work_fails_the_startup_and_the_app_never_starts(
    stopped: RedisServer,
) -> None:
    lifespan = Lifespan()
    store = RedisStore(stopped.url)
    await lifespan.run(middleware(lifespan, store))
    (failed,) = lifespan.sent
    assert failed["type"] == "lifespan.startup.failed"
    message = failed["message"]
    assert message.startswith("WebSocket mode's store does not work: RedisStoreError: ")
    assert f"redis://127.0.0.1:{stopped.port}/0 cannot be reached" in message
    assert "start_degraded=True" in message
    assert lifespan.heard == []  # the app's own startup never ran


async def test_start_degraded_starts_with_a_loud_warning(
    stopped: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    lifespan = Lifespan()
    store = RedisStore(stopped.url)
    with caplog.at_level(logging.WARNING, logger="ws_mode"):
        await lifespan.run(middleware(lifespan, store, start_degraded=True))
    assert lifespan.heard == ["lifespan.startup", "lifespan.shutdown"]
    assert [m["type"] for m in lifespan.sent] == [
        "lifespan.startup.complete",
        "lifespan.shutdown.complete",
    ]
    (said,) = [r.getMessage() for r in caplog.records if "STARTING DEGRADED" in r.getMessage()]
    assert f"127.0.0.1:{stopped.port}" in said
    assert "store_unavailable" in said


async def test_a_working_store_starts_and_its_warnings_are_logged(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    lifespan = Lifespan()
    store = RedisStore(server.url)
    try:
        with caplog.at_level(logging.WARNING, logger="ws_mode"):
            await lifespan.run(middleware(lifespan, store))
    finally:
        await store.aclose()
    assert lifespan.heard == ["lifespan.startup", "lifespan.shutdown"]
    assert lifespan.sent[0]["type"] == "lifespan.startup.complete"
    assert any("keeps nothing on disk" in r.getMessage() for r in caplog.records)


async def test_a_store_of_its_own_without_check_is_not_asked() -> None:
    class Minimal:
        async def put(self, principal: str, record: StoredResponse) -> None:
            raise AssertionError("not called")

        async def get_chain(self, principal: str, response_id: str) -> dict[str, Any]:
            return {}

        async def delete(self, principal: str, response_id: str) -> bool:
            return False

    lifespan = Lifespan()
    await lifespan.run(middleware(lifespan, Minimal()))
    assert lifespan.heard == ["lifespan.startup", "lifespan.shutdown"]


def test_uvicorn_does_not_start_on_a_store_that_does_not_work(stopped: RedisServer) -> None:
    lifespan = Lifespan()
    app = middleware(lifespan, RedisStore(stopped.url))
    with pytest.raises(ServerStartError), serve(app):
        pass
    assert lifespan.heard == []


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("localhost:6379", "'localhost:6379'"),
        ("user:secret-word@localhost:6379/0?password=other", "'***@localhost:6379/0'"),
        ("redis:/localhost", "'redis:/localhost'"),
    ],
)
def test_text_that_is_no_url_is_shown_with_its_password_masked(url: str, shown: str) -> None:
    with pytest.raises(ValueError, match="a Redis store URL starts with redis://") as refused:
        RedisStore(url)
    assert str(refused.value).endswith(f"; got {shown}")
    assert "secret" not in str(refused.value)
    assert "other" not in str(refused.value)
