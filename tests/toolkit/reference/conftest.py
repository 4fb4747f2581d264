"""Fixtures of the reference server's tests: a test client, and a recorder of its pauses."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

import anyio
import pytest
from starlette.testclient import TestClient

from ws_mode.toolkit.reference import ReferenceConfig, create_app


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(create_app(ReferenceConfig(tool_calls=2, answer_tokens=12))) as test_client:
        yield test_client


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record every anyio.sleep the server makes (and still sleep)."""
    recorded: list[float] = []
    real: Callable[[float], Awaitable[None]] = anyio.sleep

    async def recording(delay: float) -> None:
        recorded.append(delay)
        await real(delay)

    monkeypatch.setattr(anyio, "sleep", recording)
    return recorded
