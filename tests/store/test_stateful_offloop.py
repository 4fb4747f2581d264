"""A large stateful `POST` is parsed off the event loop, as a large frame is: the worker's
other work (its sockets, here a timer task on the same loop) keeps being served meanwhile."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.store_kit import read_body
from ws_mode import WebSocketModeMiddleware
from ws_mode import _stateful_http as stateful_http
from ws_mode._asgi import Receive, Scope, Send
from ws_mode._frames import HelperDied
from ws_mode._store import MemoryStore
from ws_mode.testing._loopback import ServerThread


class Handler:
    """A handler that reads its request without parsing it (its own cost stays out of the
    measure), and a timer on the server's loop recording the longest gap between its ticks."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.received: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await receive()
            ticker = asyncio.create_task(self._tick())
            await send({"type": "lifespan.startup.complete"})
            await receive()
            ticker.cancel()
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = await read_body(receive)
        self.received.append(body)
        response = {
            "id": f"resp_{uuid.uuid4().hex}",
            "object": "response",
            "status": "completed",
            "output": [{"type": "message", "role": "assistant", "content": []}],
        }
        answer = json.dumps(response).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    async def _tick(self) -> None:
        # The loop thread's CPU time between ticks: what the loop spent on other work, which a
        # busy machine's scheduling does not inflate as it does the wall clock.
        last = time.thread_time()
        while True:
            await asyncio.sleep(0.001)
            now = time.thread_time()
            self.longest = max(self.longest, now - last)
            last = now


async def tenant(scope: Scope) -> str:
    return "tenant-a"


@pytest.fixture(scope="module")
def running() -> Iterator[tuple[str, Handler]]:
    handler = Handler()
    app = WebSocketModeMiddleware(
        handler, store=MemoryStore(), stateful_http=True, authenticate=tenant
    )
    with ServerThread(app, lifespan="on") as url:
        yield url, handler


def post(client: httpx.Client, body: dict[str, Any] | bytes) -> dict[str, Any]:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    headers = {"content-type": "application/json"}
    answer = client.post("/v1/responses", content=content, headers=headers)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def test_a_large_post_does_not_stall_the_loop(running: tuple[str, Handler]) -> None:
    """The longest the server's loop is held (in its thread's CPU time) while a 12 MiB
    continuation is handled is a small part of what parsing that body in place costs; the
    handler gets the whole conversation, spliced."""
    url, handler = running
    items = [{"role": "user", "content": "x"} for _ in range(400_000)]
    with httpx.Client(base_url=url, timeout=60) as client:
        parent = post(client, {"model": "m", "input": "Start"})
        big = orjson.dumps({"model": "m", "input": items, "previous_response_id": parent["id"]})
        started = time.thread_time()
        orjson.loads(big)
        in_place = time.thread_time() - started
        post(client, {"model": "m", "input": items[:60_000]})  # helpers start (not measured)
        time.sleep(0.05)
        handler.longest = 0.0
        answer = post(client, big)
        time.sleep(0.05)  # the timer's tick after the last stall is in
        longest = handler.longest
    assert answer["previous_response_id"] == parent["id"]
    request = orjson.loads(handler.received[-1])
    assert "previous_response_id" not in request
    assert len(request["input"]) == 1 + 1 + len(items)  # the parent's input and output first
    assert longest < in_place / 3, f"held {longest * 1000:.0f} ms; in place {in_place * 1000:.0f}"


def test_a_body_whose_helpers_died_is_answered_with_a_server_error(
    running: tuple[str, Handler], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never parsed on the loop instead, never passed on half-read. (The deaths are stood in
    for; tests/library/test_frames.py kills real helpers.)"""
    url, handler = running

    async def died(*_: object) -> object:
        raise HelperDied

    monkeypatch.setattr(stateful_http, "in_helper", died)
    served = len(handler.received)
    big = orjson.dumps({"model": "m", "input": [{"role": "user", "content": "x"}] * 60_000})
    with httpx.Client(base_url=url, timeout=30) as client:
        answer = client.post("/v1/responses", content=big)
    assert answer.status_code == 500
    assert answer.json()["error"]["type"] == "server_error"
    assert len(handler.received) == served  # the handler never saw it
