"""A stateful-HTTP server for many large `POST`s at once, run under uvicorn in a child process
(`tests/store/test_stateful_burst.py`): `WebSocketModeMiddleware` with a memory store in front
of a handler that reads its request without parsing it (its own cost stays out of the
measure), and a probe of the event loop.

The probe ticks on the server's loop and records the most CPU time the loop's thread spent
between two ticks (the thread's own CPU time, not the wall clock: on a busy machine the loop
also waits its turn for a core, which is no stall of ours). `GET /probe` answers
`{"longest": seconds, "ticks": n}` and starts a new measure; it passes the middleware untouched
(not a stateful route). `GET /probe?in_place=1` makes the middleware parse every body on the
event loop from then on (what the test compares with), `?in_place=0` large ones in helpers again.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from ws_mode import MemoryStore, WebSocketModeMiddleware, tune_gc
from ws_mode import _frames as frames
from ws_mode import _stateful_http as stateful_http
from ws_mode._asgi import Receive, Scope, Send


class Probe:
    """The longest stretch of the loop thread's CPU time between two ticks, since the last
    read."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.ticks = 0

    async def run(self) -> None:
        last = time.thread_time()
        while True:
            await asyncio.sleep(0.001)
            now = time.thread_time()
            self.longest = max(self.longest, now - last)
            self.ticks += 1
            last = now

    def read(self) -> dict[str, Any]:
        seen = {"longest": self.longest, "ticks": self.ticks}
        self.longest, self.ticks = 0.0, 0
        return seen


PROBE = Probe()


async def handler(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await receive()
        ticker = asyncio.create_task(PROBE.run())
        await send({"type": "lifespan.startup.complete"})
        await receive()
        ticker.cancel()
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["path"] == "/probe":
        query = scope.get("query_string", b"")
        if query in (b"in_place=1", b"in_place=0"):
            in_place = query == b"in_place=1"
            stateful_http.OFF_LOOP_BYTES = 1 << 62 if in_place else frames.OFF_LOOP_BYTES
        answer = json.dumps(PROBE.read()).encode()
    else:
        size = 0
        while True:  # read whole, never joined: the handler's own cost stays small
            message = await receive()
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        response = {
            "id": f"resp_{uuid.uuid4().hex}",
            "object": "response",
            "status": "completed",
            "output": [{"type": "message", "role": "assistant", "content": []}],
            "metadata": {"request_bytes": str(size)},
        }
        answer = json.dumps(response).encode()
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


async def tenant(scope: Scope) -> str:
    return "tenant-a"


app = WebSocketModeMiddleware(handler, store=MemoryStore(), stateful_http=True, authenticate=tenant)
# As a deployment does once its app is built (docs/deployment.md): the collector's full
# collections no longer walk the modules (about 12 ms of the loop's thread here, at any time).
tune_gc()
