"""Recipe (c), `examples/cache_aware_proxy.py`: WebSocket mode in front of an upstream that stores
responses (here the reference server behind a middleware with a store and `stateful_http`).
Over the socket the upstream gets only each turn's new items and `previous_response_id`, and
the answers are those of plain HTTP with the whole history."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from examples.cache_aware_proxy import create_app
from tests.servers import serve
from ws_mode import WebSocketModeMiddleware
from ws_mode._store import MemoryStore
from ws_mode.testing._client import connect
from ws_mode.toolkit.reference import ReferenceConfig
from ws_mode.toolkit.reference import create_app as create_reference
from ws_mode.toolkit.rollout import run_http, run_socket

OPTIONS: dict[str, Any] = {"turns": 5, "tool_output_bytes": 512, "timeout": 10.0}


@dataclass
class Recorder:
    """An ASGI layer in front of the upstream keeping every `POST` body it receives."""

    app: ASGIApp
    bodies: list[dict[str, Any]] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []

        async def recording() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    self.bodies.append(orjson.loads(b"".join(chunks)))
            return message

        await self.app(scope, recording, send)


@dataclass
class Rig:
    upstream: str
    proxy: str
    recorder: Recorder


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    reference = create_reference(ReferenceConfig(tool_calls=4, answer_tokens=8))
    # A single-tenant upstream: every caller (the proxy) shares its stored responses.
    storing = WebSocketModeMiddleware(
        reference, store=MemoryStore(), stateful_http=True, shared_store=True
    )
    recorder = Recorder(storing)
    with (
        serve(recorder, lifetime=60) as upstream,
        serve(create_app(upstream + "/v1"), lifetime=60) as proxy,
    ):
        yield Rig(upstream, proxy, recorder)


def test_the_upstream_gets_only_new_items(rig: Rig) -> None:
    direct = run_http(rig.upstream, **OPTIONS)  # the whole history, straight to the upstream
    rig.recorder.bodies.clear()
    socket = run_socket(rig.proxy, **OPTIONS)
    sent = list(rig.recorder.bodies)

    assert socket.answer == direct.answer  # the reference model digests its whole context
    assert socket.tool_calls == direct.tool_calls == 4
    assert len(sent) == 5
    assert "previous_response_id" not in sent[0]
    assert [len(body["input"]) for body in sent] == [1, 1, 1, 1, 1]
    assert [body.get("previous_response_id") for body in sent[1:]] == socket.response_ids[:-1]


def test_an_id_the_socket_never_saw_is_resolved_upstream(rig: Rig) -> None:
    """`on_cache_miss="forward"`: a response made over plain HTTP continues on the socket."""
    made = httpx.post(
        rig.proxy + "/v1/responses",
        json={"model": "m", "input": "Start here.", "metadata": {"reference_tool_calls": "0"}},
        timeout=10,
    )
    assert made.status_code == 200, made.text
    parent = made.json()["id"]
    with connect(rig.proxy, open_timeout=10) as socket:
        socket.send(
            {
                "type": "response.create",
                "model": "m",
                "input": "Go on.",
                "previous_response_id": parent,
                "metadata": {"reference_tool_calls": "0"},
            }
        )
        events = socket.receive_turn(timeout=10)
    assert events[-1]["type"] == "response.completed", events[-1]
    assert rig.recorder.bodies[-1]["previous_response_id"] == parent
    # The same as asking the upstream with the whole history.
    history = [{"role": "user", "content": "Start here."}, *made.json()["output"]]
    history.append({"role": "user", "content": "Go on."})
    whole = httpx.post(
        rig.upstream + "/v1/responses",
        json={"model": "m", "input": history, "metadata": {"reference_tool_calls": "0"}},
        timeout=10,
    )
    answer = events[-1]["response"]["output"][0]["content"][0]["text"]
    assert answer == whole.json()["output"][0]["content"][0]["text"]
