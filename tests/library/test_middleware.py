"""The middleware's own duties outside a socket: lifespan, and saying what the server lacks."""

from __future__ import annotations

import asyncio
import logging
import sys
import types
from typing import Any

import pytest

from ws_mode import Limits, WebSocketModeMiddleware


async def inner(scope: Any, receive: Any, send: Any) -> None:
    message = await receive()
    assert message["type"] == "lifespan.startup"
    await send({"type": "lifespan.startup.complete"})


def start(middleware: WebSocketModeMiddleware) -> None:
    async def receive() -> dict[str, Any]:
        return {"type": "lifespan.startup"}

    async def send(message: dict[str, Any]) -> None:
        assert message["type"] == "lifespan.startup.complete"

    asyncio.run(middleware({"type": "lifespan"}, receive, send))


def test_under_a_server_without_pings_startup_says_how_dead_peers_are_found(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "granian", types.ModuleType("granian"))
    with caplog.at_level(logging.WARNING, logger="ws_mode._middleware"):
        start(WebSocketModeMiddleware(inner, limits=Limits(max_idle_seconds=600)))
    assert "granian sends no WebSocket pings" in caplog.text
    assert "600 s" in caplog.text


def test_under_a_server_that_pings_startup_is_quiet(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delitem(sys.modules, "granian", raising=False)
    with caplog.at_level(logging.WARNING, logger="ws_mode._middleware"):
        start(WebSocketModeMiddleware(inner))
    assert caplog.text == ""
