"""What stateful HTTP holds back of the handler's answer is bounded by
`Limits.max_buffered_answer_bytes`: a JSON answer is held whole (to echo
`previous_response_id`), an SSE event until its blank line. Past the bound the answer passes on
as the handler sends it, from what was held, and its response is not stored; before, a handler
sending an event that never ends, or an endless JSON answer, was held whole, without bound, and
the client got nothing of it."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.store_kit import key, read_body, who
from ws_mode import Limits, WebSocketModeMiddleware
from ws_mode._asgi import Receive, Scope, Send
from ws_mode._store import MemoryStore
from ws_mode.testing._loopback import ServerThread

LIMIT = 4096
CHUNK = 1024
#: Chunks the handler sends before it waits: past LIMIT.
CHUNKS = 8


class Endless:
    """Answers with a stream whose only event never ends (`sse`), or a JSON answer (`json`):
    CHUNKS chunks, then nothing until `release` is set, then the end."""

    def __init__(self) -> None:
        self.release = threading.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        request = json.loads(await read_body(receive))
        kind = b"text/event-stream" if request["model"] == "sse" else b"application/json"
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]}
        )
        first = b"data: " if request["model"] == "sse" else b'{"id": "resp_1", "pad": "'
        await send({"type": "http.response.body", "body": first, "more_body": True})
        for _ in range(CHUNKS):
            await send({"type": "http.response.body", "body": b"x" * CHUNK, "more_body": True})
        await asyncio.to_thread(self.release.wait, 20)  # set by the test's thread
        last = b"\n\n" if request["model"] == "sse" else b'"}'
        await send({"type": "http.response.body", "body": last})


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, Endless, MemoryStore]]:
    handler, store = Endless(), MemoryStore()
    app = WebSocketModeMiddleware(
        handler,
        store=store,
        stateful_http=True,
        authenticate=who,
        limits=Limits(max_buffered_answer_bytes=LIMIT),
    )
    with ServerThread(app) as url:
        yield url, handler, store


@pytest.mark.parametrize("model", ["sse", "json"])
def test_past_the_bound_the_answer_passes_on_as_it_comes_and_is_not_stored(
    served: tuple[str, Endless, MemoryStore], model: str, caplog: pytest.LogCaptureFixture
) -> None:
    url, handler, store = served
    handler.release.clear()
    received = b""
    with (
        caplog.at_level(logging.WARNING, logger="ws_mode"),
        httpx.Client(base_url=url, headers=key("alice"), timeout=20) as client,
        client.stream("POST", "/v1/responses", json={"model": model, "input": "Hi"}) as answer,
    ):
        chunks = answer.iter_raw()
        try:
            # What the handler sent so far arrives while it still holds the rest.
            while len(received) < CHUNKS * CHUNK:
                received += next(chunks)
        finally:
            handler.release.set()
        received += b"".join(chunks)
    assert answer.status_code == 200
    assert received.count(b"x") == CHUNKS * CHUNK
    assert received.endswith(b"\n\n" if model == "sse" else b'"}')
    assert "max_buffered_answer_bytes" in caplog.text
    assert len(store) == 0  # nothing of it was echoed nor stored
