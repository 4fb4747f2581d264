"""The application's hooks never block the event loop: a plain function runs in a worker
thread, an async one on the loop, over a real socket. Sync hooks of different sockets run at
once (outside Django, whose ORM needs them in one thread: tests/examples/test_django_hooks.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from websockets.sync.client import connect

from tests.servers import serve
from ws_mode import Turn, WebSocketModeMiddleware
from ws_mode import _hooks as hooks
from ws_mode._hooks import call_hook, is_async


async def handler(request: Request) -> JSONResponse:
    seen["handler"] = threading.get_ident()
    body = await request.json()
    return JSONResponse(
        {
            "id": f"resp_{len(body['input'])}",
            "object": "response",
            "status": "completed",
            "output": [],
        }
    )


seen: dict[str, int] = {}


def test_sync_hooks_run_off_the_event_loop_and_async_ones_on_it() -> None:
    seen.clear()

    def authenticate(scope: Any) -> str:
        seen["authenticate"] = threading.get_ident()
        return "alice"

    class OnResponse:
        async def __call__(self, current: Turn, response: dict[str, Any]) -> None:
            seen["on_response"] = threading.get_ident()
            seen["principal_is_alice"] = int(current.principal == "alice")

    app = WebSocketModeMiddleware(
        Starlette(routes=[Route("/v1/responses", handler, methods=["POST"])]),
        authenticate=authenticate,
        on_response=OnResponse(),
    )
    with serve(app) as base_url, connect(base_url.replace("http", "ws", 1) + "/v1/responses") as ws:
        ws.send('{"type": "response.create", "model": "m", "input": "hi"}')
        while '"response.completed"' not in str(ws.recv(timeout=10)):
            pass
        ws.send('{"type": "response.create", "model": "m", "input": "again"}')  # after the hook
        while '"response.completed"' not in str(ws.recv(timeout=10)):
            pass
    loop_thread = seen["handler"]
    assert seen["authenticate"] != loop_thread
    assert seen["on_response"] == loop_thread
    assert seen["principal_is_alice"] == 1


def test_what_counts_as_async() -> None:
    async def coroutine_function() -> None: ...

    class Callable:
        async def __call__(self) -> None: ...

    assert is_async(coroutine_function)
    assert is_async(Callable())
    assert not is_async(lambda: None)
    assert not is_async(print)


async def _value() -> int:
    return 7


def test_a_sync_function_handing_back_a_coroutine_is_awaited() -> None:
    assert asyncio.run(call_hook(lambda: _value())) == 7


HOOK_SECONDS = 0.2


@pytest.fixture
def not_django(monkeypatch: pytest.MonkeyPatch) -> None:
    # Another test of this process may have set the example Django project up; this is about
    # an application without Django (its detection: test_django_is_detected_by_its_settings).
    monkeypatch.setattr(hooks, "django_configured", lambda: False)


@pytest.mark.usefixtures("not_django")
def test_sync_authenticate_hooks_of_concurrent_handshakes_run_at_once() -> None:
    threads: set[str] = set()

    def authenticate(scope: Any) -> str:
        threads.add(threading.current_thread().name)
        time.sleep(HOOK_SECONDS)  # a database, an auth service
        return "alice"

    app = WebSocketModeMiddleware(
        Starlette(routes=[Route("/v1/responses", handler, methods=["POST"])]),
        authenticate=authenticate,
    )

    def handshake(url: str) -> None:
        with connect(url, open_timeout=30):
            pass

    with serve(app) as base_url, ThreadPoolExecutor(10) as clients:
        url = base_url.replace("http", "ws", 1) + "/v1/responses"
        handshake(url)  # warm: the server's first connection, the hook pool's first thread
        started = time.perf_counter()
        handshake(url)
        single = time.perf_counter() - started
        started = time.perf_counter()
        list(clients.map(handshake, [url] * 10))
        ten = time.perf_counter() - started
    assert single >= HOOK_SECONDS
    # One at a time, ten take ten times one (2.0 s against 0.2 s before the fix).
    assert ten < 5 * single, (ten, single)
    assert all(name.startswith("ws_mode-hook") for name in threads), threads  # not the loop's


@pytest.mark.usefixtures("not_django")
def test_sync_hooks_run_at_once_through_call_hook() -> None:
    def hook(value: int) -> int:
        time.sleep(HOOK_SECONDS)
        return value

    async def timed(calls: int) -> float:
        started = time.perf_counter()
        assert await asyncio.gather(*(call_hook(hook, n) for n in range(calls))) == list(
            range(calls)
        )
        return time.perf_counter() - started

    single = asyncio.run(timed(1))
    ten = asyncio.run(timed(10))
    assert ten < 5 * single, (ten, single)


def test_django_is_detected_by_its_settings() -> None:
    code = """
        import django.conf
        from ws_mode._hooks import django_configured
        print(django_configured())  # imported, not configured: not a Django project
        django.conf.settings.configure()
        print(django_configured())
        """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.split() == ["False", "True"]
