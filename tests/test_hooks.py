"""The application's hooks never block the event loop: a plain function runs in a worker
thread, an async one on the loop, over a real socket."""

from __future__ import annotations

import threading
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from websockets.sync.client import connect

from ws_mode import Turn, WebSocketModeMiddleware
from ws_mode.hooks import call_hook, is_async

from .servers import serve


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
    import asyncio

    assert asyncio.run(call_hook(lambda: _value())) == 7
