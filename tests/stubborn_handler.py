"""A Responses handler that ignores cancellation, as real handlers do by accident (an
`except BaseException:` around the model call): for the tests of `Limits.abandon_handler_seconds`.

Served in a child process (`python -m tests.stubborn_handler --fd N --log PATH`, through
`ws_mode.testing._loopback.server_process`), it runs under plain uvicorn with its lifespan on,
its stderr and ws_mode's warnings written to `PATH`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import threading
from typing import Any

from asgiref.sync import sync_to_async

from ws_mode import Limits, WebSocketModeMiddleware
from ws_mode._asgi import Receive, Scope, Send
from ws_mode.testing._loopback import add_child_arguments, serve_inherited


class Stubborn:
    """A raw ASGI handler, its answer chosen by the request's `model`:

    - `stubborn`: `response.created`, then it waits for its model for ever, swallowing every
      cancellation (and trying to send after each), until the test sets `free`;
    - `threaded`: `response.created`, then a blocking call in a thread through asgiref's
      `sync_to_async` (as Django runs a synchronous view), until the test sets `unblock`;
    - `quick`: created and completed at once.

    `cancels` counts the cancellations it swallowed, `running` the calls still in it, `blocked`
    the threads still blocked."""

    def __init__(self) -> None:
        self.calls = 0
        self.cancels = 0
        self.running = 0
        self.free = False
        self.unblock = threading.Event()
        self.blocked = 0

    def _block(self) -> None:
        self.blocked += 1
        try:
            self.unblock.wait(60.0)
        finally:
            self.blocked -= 1

    def release(self) -> None:
        """Let every call still running end."""
        self.free = True
        self.unblock.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"]
                await send({"type": kind + ".complete"})
                if kind == "lifespan.shutdown":
                    return
        if scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        model = json.loads(body)["model"]
        self.calls += 1
        response = {"id": f"resp_{model}_{self.calls}", "object": "response", "model": model,
                    "status": "in_progress", "output": [], "usage": None}  # fmt: skip

        async def emit(event: dict[str, Any]) -> None:
            data = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
            await send({"type": "http.response.body", "body": data, "more_body": True})

        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
        await emit({"type": "response.created", "response": response})
        if model == "stubborn":
            self.running += 1
            try:
                while not self.free:
                    try:
                        await asyncio.sleep(0.02)  # the model call
                    except BaseException:  # what the tests are about
                        self.cancels += 1
                        with contextlib.suppress(BaseException):
                            await emit({"type": "response.in_progress", "response": response})
            finally:
                self.running -= 1
        elif model == "threaded":
            self.running += 1
            try:
                await sync_to_async(self._block)()
            finally:
                self.running -= 1
        done = {**response, "status": "completed"}
        await emit({"type": "response.completed", "response": done})
        await send({"type": "http.response.body", "body": b""})


def main() -> None:
    parser = argparse.ArgumentParser()
    add_child_arguments(parser)
    parser.add_argument("--log", required=True)
    parser.add_argument("--grace", type=float, default=0.5)
    parser.add_argument("--abandon", type=float, default=0.5)
    arguments = parser.parse_args()
    log = os.open(arguments.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 2)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    limits = Limits(
        shutdown_grace_seconds=arguments.grace, abandon_handler_seconds=arguments.abandon
    )
    app = WebSocketModeMiddleware(Stubborn(), limits=limits)
    serve_inherited(app, arguments, lifespan="on")


if __name__ == "__main__":
    main()
