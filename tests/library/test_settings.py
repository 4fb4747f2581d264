"""The settings one middleware's connections share (`ws_mode._settings`): the keywords about
callers are checked once, when the middleware is built (`check_principals`), a shared store
is warned about then and never again, and the settings cannot change after the check."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator

from ws_mode import ConfigError, Limits, MemoryStore, WebSocketModeMiddleware
from ws_mode._settings import Settings, check_principals
from ws_mode._store import ResponseStore


def hook(scope: Any) -> str:
    return "alice"


async def app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("no request reaches the app here")


STORE = MemoryStore()

#: (authenticate, reauthenticate_seconds, store, principal_key, shared_store), what the
#: error says.
REFUSED: list[tuple[tuple[Any, ...], str]] = [
    ((hook, -1, None, None, False), "reauthenticate_seconds"),
    ((hook, True, None, None, False), "reauthenticate_seconds"),  # a bool is no number
    ((hook, "60", None, None, False), "reauthenticate_seconds"),
    ((None, 60, None, None, False), "there is none: pass authenticate="),
    ((None, 0, None, None, False), r"^reauthenticate_seconds=0 runs the authenticate hook again"),
    ((None, None, None, None, "yes"), "shared_store must be True or False"),
    ((None, None, STORE, str, True), "principal_key"),  # no hook to key
    ((hook, None, STORE, "tenant", False), "must be callable"),
    ((None, None, None, None, True), "needs store="),
    ((hook, None, STORE, None, True), "contradict"),
    ((None, None, STORE, None, False), "whose responses are whose"),
]

#: Combinations that are fine, and quiet.
ACCEPTED: list[tuple[Any, ...]] = [
    (None, None, None, None, False),
    (hook, 0, None, None, False),  # 0: before every frame that causes work
    (hook, 30.5, STORE, None, False),
    (hook, None, STORE, str, False),
]


@pytest.mark.parametrize(("keywords", "says"), REFUSED)
def test_keywords_that_cannot_work_together_are_refused(
    keywords: tuple[Any, ...], says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        check_principals(*keywords)


@pytest.mark.parametrize("keywords", ACCEPTED)
def test_keywords_that_work_together_pass_without_a_word(
    keywords: tuple[Any, ...], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="ws_mode"):
        check_principals(*keywords)
    assert caplog.records == []


def test_the_middleware_checks_its_keywords_about_callers_when_built() -> None:
    with pytest.raises(ConfigError, match="whose responses are whose"):
        WebSocketModeMiddleware(app, store=MemoryStore())


async def open_and_close(middleware: WebSocketModeMiddleware) -> None:
    scope = {"type": "websocket", "path": "/v1/responses", "headers": [], "subprotocols": []}
    socket = ApplicationCommunicator(middleware, scope)
    await socket.send_input({"type": "websocket.connect"})
    assert (await socket.receive_output(10))["type"] == "websocket.accept"
    await socket.send_input({"type": "websocket.disconnect", "code": 1000})
    await socket.wait(10)


@pytest.mark.anyio
async def test_a_shared_store_is_warned_about_once_when_built_not_per_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store: ResponseStore = MemoryStore()
    with caplog.at_level(logging.WARNING, logger="ws_mode._settings"):
        middleware = WebSocketModeMiddleware(app, store=store, shared_store=True)
        built = [record.getMessage() for record in caplog.records]
        for _ in range(2):
            await open_and_close(middleware)
    assert len(built) == 1
    assert "shared_store=True" in built[0]
    assert [r.getMessage() for r in caplog.records if r.name == "ws_mode._settings"] == built
    assert middleware.stats.connections_total == 2


def test_the_checked_settings_cannot_change() -> None:
    middleware = WebSocketModeMiddleware(app, path="/ws/", limits=Limits(max_connections=3))
    settings = middleware.settings
    assert settings.path == "/ws"  # as checked: without its trailing slash
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.path = "/elsewhere"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.limits = Limits()  # type: ignore[misc]


def test_each_middleware_counts_in_its_own_stats_and_budget() -> None:
    def settings() -> Settings:
        return Settings(
            app=app, path="/v1/responses", handler_path="/v1/responses",
            full_context="always", limits=Limits(),
        )  # fmt: skip

    first, second = settings(), settings()
    assert first.stats is not second.stats
    assert first.budget is not second.budget
    first.stats.turns += 1
    assert second.stats.turns == 0
    assert first.budget.limit == Limits().max_memory_bytes
