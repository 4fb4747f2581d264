"""Through `ws_mode.proxy`: every request the proxy sends upstream carries the conversation key
(`x-session-id`, the client's replaced) and Codex's `x-codex-routing-hint` from the handshake,
and an upstream's `response.metadata` event reaches the socket client unchanged.

A real upstream on loopback (uvicorn) records each request's headers and streams its answer
with a `response.metadata` event among the others; the proxy, wrapped by the middleware as
`ws-mode proxy` wraps it, runs on another loopback server; the client is the kit's socket
client (websockets)."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.types import Receive, Scope, Send

from tests.servers import serve
from tests.store_kit import read_body
from ws_mode import WebSocketModeMiddleware
from ws_mode.proxy import create_proxy
from ws_mode.testing._client import connect

METADATA = {
    "type": "response.metadata",
    "sequence_number": 1,
    "metadata": {"router": "replica-2", "nested": {"list": [1, 2, 3]}},
    "extra_field": None,
}
SEEN: list[dict[str, str]] = []


async def upstream(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    await read_body(receive)
    SEEN.append({name.decode(): value.decode() for name, value in scope["headers"]})
    response_id = "resp_" + secrets.token_hex(8)
    item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed"}
    text = {"type": "output_text", "text": "ok", "annotations": []}
    done: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "status": "completed",
        "model": "up",
        "output": [{**item, "content": [text]}],
    }
    events = [
        {"type": "response.created", "sequence_number": 0, "response": {**done, "output": []}},
        METADATA,
        {"type": "response.completed", "sequence_number": 2, "response": done},
    ]
    body = b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def proxy_url() -> Iterator[str]:
    with serve(upstream) as upstream_url:
        proxy = create_proxy(upstream_url + "/v1", api_key="sk-proxy")
        with serve(WebSocketModeMiddleware(proxy), lifespan="on") as url:
            yield url


def test_each_upstream_request_carries_the_key_and_the_routing_hint(proxy_url: str) -> None:
    SEEN.clear()
    headers = {"x-codex-routing-hint": "hint-7", "x-session-id": "chosen-by-the-client"}
    with connect(proxy_url, headers=headers) as ws:
        parent = None
        received: list[list[dict[str, Any]]] = []
        for _ in range(3):
            create: dict[str, Any] = {"type": "response.create", "model": "up", "input": "hi"}
            if parent is not None:
                create["previous_response_id"] = parent
            ws.send(create)
            events = ws.receive_turn(timeout=20)
            assert events[-1]["type"] == "response.completed", events[-1]
            parent = events[-1]["response"]["id"]
            received.append(events)
        ws.send({"type": "response.create", "model": "up", "input": "another chain"})
        assert ws.receive_turn(timeout=20)[-1]["type"] == "response.completed"
    keys = [seen["x-session-id"] for seen in SEEN]
    assert len(keys) == 4
    assert re.fullmatch(r"[0-9a-f]{32}", keys[0])
    assert keys[0] == keys[1] == keys[2] != keys[3]
    assert all(seen["x-codex-routing-hint"] == "hint-7" for seen in SEEN)
    # The upstream's own event passes through as it sent it, on every turn.
    for events in received:
        assert [event for event in events if event["type"] == "response.metadata"] == [METADATA]
