"""What the store tests share: a principal hook, one turn over a real socket, waiting for the
background to catch up, reading a request body, and a handler whose response objects say
`store: false`."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from typing import Any

from ws_mode import StoredResponse
from ws_mode._asgi import Receive, Scope, Send
from ws_mode.testing._client import connect

FIELDS: dict[str, Any] = {"model": "reference"}


async def read_body(receive: Receive) -> bytes:
    """A test app's request body, whole."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


def who(scope: Scope) -> str:
    """An `authenticate` hook: the bearer token is the principal, a plain `str`."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return str(value.decode().removeprefix("Bearer "))
    return "nobody"


def key(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def turn(base_url: str, token: str = "alice", **fields: Any) -> dict[str, Any]:
    """One create on a new socket; its terminal event (the socket closes after it)."""
    with connect(base_url, headers=key(token)) as socket:
        socket.send({"type": "response.create", **FIELDS, **fields})
        event: dict[str, Any] = socket.receive_turn(timeout=20)[-1]
        return event


def answers(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The client's next input: outputs for the response's function calls, or a message."""
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    outputs = [
        {"type": "function_call_output", "call_id": call["call_id"], "output": f"ok {n}"}
        for n, call in enumerate(calls)
    ]
    return outputs or [{"role": "user", "content": "Go on."}]


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll `condition` until it holds or `timeout` seconds passed; whether it held."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


async def private_handler(scope: Scope, receive: Receive, send: Send) -> None:
    """A stateless handler whose response objects say `"store": false` whatever the request
    said (an organization with zero data retention, an upstream that forces it)."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            kind = message["type"].removeprefix("lifespan.")
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return
    body = await read_body(receive)
    request = json.loads(body)
    text = {"type": "output_text", "text": "private", "annotations": []}
    item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed"}
    response = {
        "id": "resp_" + secrets.token_hex(8),
        "object": "response",
        "status": "completed",
        "model": "private",
        "store": False,
        "output": [{**item, "content": [text]}],
    }
    if request.get("stream"):
        started = {**response, "status": "in_progress", "output": []}
        events = [
            {"type": "response.created", "sequence_number": 0, "response": started},
            {"type": "response.completed", "sequence_number": 1, "response": response},
        ]
        kind, answer = (
            b"text/event-stream",
            b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events),
        )
    else:
        kind, answer = b"application/json", json.dumps(response).encode()
    headers = [(b"content-type", kind)]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


class ClosingStore:
    """An ASGI wrapper that closes a store when the server shuts down, on the server's own
    event loop (a Redis client's connections belong to the loop that opened them)."""

    def __init__(self, app: Any, store: Any) -> None:
        self.app = app
        self.store = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def closing_send(message: dict[str, Any]) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                await self.store.aclose()
            await send(message)

        await self.app(scope, receive, closing_send)


def stored_record(response_id: str, parent: StoredResponse | None = None) -> StoredResponse:
    """A small stored response: a root, or a child of `parent` in its conversation."""
    return StoredResponse(
        id=response_id,
        parent_id=parent.id if parent else None,
        chain_id=parent.chain_id if parent else response_id,
        input=b'{"role":"user","content":"' + response_id.encode() + b'"}',
        output=b'{"type":"message","role":"assistant","content":"ok"}',
        response=b'{"id":"' + response_id.encode() + b'","status":"completed"}',
    )
