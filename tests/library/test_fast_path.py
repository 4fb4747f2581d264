"""The fast path's options through a real server: rendered tokens, tool artifacts, and work
after a response that never delays the next turn."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from websockets.sync.client import ClientConnection, connect

from tests.servers import serve
from ws_mode import Turn, WebSocketModeMiddleware, turn

TOOLS = [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}]
OTHER_TOOLS = [{"type": "function", "name": "grep", "parameters": {"type": "object"}}]


def render(items: list[dict[str, Any]]) -> list[int]:
    """A renderer that is a plain function of each item: its JSON's bytes."""
    return [byte for item in items for byte in orjson.dumps(item, option=orjson.OPT_SORT_KEYS)]


class Harness:
    def __init__(self) -> None:
        self.rendered: list[list[dict[str, Any]]] = []
        self.turns: list[dict[str, Any]] = []
        self.hooked: list[str] = []
        self.release_hook = asyncio.Event()
        self.block_first_hook = False

    def renderer(self, items: list[dict[str, Any]]) -> list[int]:
        self.rendered.append(items)
        return render(items)

    async def on_response(self, current: Turn, response: dict[str, Any]) -> None:
        # Blocks until the next turn's handler runs: if this delayed the next turn, the test
        # would deadlock and time out.
        if self.block_first_hook and not self.hooked:
            await self.release_hook.wait()
        self.hooked.append(response["id"])

    async def handler(self, request: Request) -> JSONResponse:
        body = await request.json()
        current = turn(request)
        assert current is not None
        if self.turns:  # from the second turn on: the first response's hook may now finish
            self.release_hook.set()
        tokens = current.tokens()
        self.turns.append(
            {
                "tokens_match": tokens == render(current.history()),
                "prefix": len(current.prefix_tokens or ()),
                "new": current.new_tokens,
                "tools_changed": current.tools_changed,
                "cache_aware": current.cache_aware,
                "tool_artifacts": dict(current.tool_artifacts),
            }
        )
        current.tool_artifacts.setdefault("rendered", body.get("tools"))
        number = len(self.turns)
        item = {
            "type": "message",
            "id": f"msg_{number}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": f"answer {number}", "annotations": []}],
        }
        return JSONResponse(
            {"id": f"resp_{number}", "object": "response", "status": "completed", "output": [item]}
        )


@pytest.fixture
def harness() -> Iterator[tuple[Harness, str]]:
    harness = Harness()
    app = Starlette(routes=[Route("/v1/responses", harness.handler, methods=["POST"])])
    wrapped = WebSocketModeMiddleware(
        app, full_context="on_miss", renderer=harness.renderer, on_response=harness.on_response
    )
    with serve(wrapped) as base_url:
        yield harness, base_url.replace("http", "ws", 1) + "/v1/responses"


def create(socket: ClientConnection, **fields: Any) -> dict[str, Any]:
    socket.send(json.dumps({"type": "response.create", "model": "m", **fields}))
    while True:
        event = json.loads(socket.recv(timeout=10))
        if event["type"] in ("response.completed", "error"):
            return event


def test_each_item_is_rendered_once_and_the_prefix_is_handed_over(
    harness: tuple[Harness, str],
) -> None:
    recorder, url = harness
    with connect(url) as socket:
        first = create(socket, input="hello", tools=TOOLS)["response"]["id"]
        tool_output = [{"type": "function_call_output", "call_id": "c1", "output": "x" * 50}]
        second = create(socket, input=tool_output, tools=TOOLS, previous_response_id=first)
        third = create(
            socket, input="more", tools=TOOLS, previous_response_id=second["response"]["id"]
        )
        assert third["type"] == "response.completed"
    # The handler's tokens equal rendering the whole context, on every turn.
    assert all(entry["tokens_match"] for entry in recorder.turns)
    assert recorder.turns[0]["prefix"] == 0
    assert 0 < recorder.turns[1]["prefix"] < recorder.turns[2]["prefix"]
    # Every item was rendered exactly once: each turn's new input, then each output.
    rendered_items = [orjson.dumps(item) for items in recorder.rendered for item in items]
    assert len(rendered_items) == len(set(rendered_items)) == 3 + 3


@pytest.mark.parametrize(("full_context", "cache_aware"), [("on_miss", True), ("always", False)])
def test_the_turn_tells_whether_artifacts_will_be_read(
    full_context: str, cache_aware: bool
) -> None:
    # A handler serving both ways saves artifacts only for a middleware that reads them back.
    harness = Harness()
    app = Starlette(routes=[Route("/v1/responses", harness.handler, methods=["POST"])])
    wrapped = WebSocketModeMiddleware(app, full_context=full_context)  # type: ignore[arg-type]
    with (
        serve(wrapped) as base_url,
        connect(base_url.replace("http", "ws", 1) + "/v1/responses") as socket,
    ):
        first = create(socket, input="a")["response"]["id"]
        assert create(socket, input="b", previous_response_id=first)["type"] == "response.completed"
    assert [entry["cache_aware"] for entry in harness.turns] == [cache_aware, cache_aware]


def test_tool_artifacts_come_back_while_the_tools_stay_the_same(
    harness: tuple[Harness, str],
) -> None:
    recorder, url = harness
    with connect(url) as socket:
        first = create(socket, input="a", tools=TOOLS)["response"]["id"]
        second = create(socket, input="b", tools=TOOLS, previous_response_id=first)
        third = create(
            socket, input="c", tools=OTHER_TOOLS, previous_response_id=second["response"]["id"]
        )
        assert third["type"] == "response.completed"
    assert [entry["tools_changed"] for entry in recorder.turns] == [True, False, True]
    assert recorder.turns[0]["tool_artifacts"] == {}
    assert recorder.turns[1]["tool_artifacts"] == {"rendered": TOOLS}
    assert recorder.turns[2]["tool_artifacts"] == {}


def test_work_after_a_response_does_not_delay_the_next_turn(
    harness: tuple[Harness, str],
) -> None:
    recorder, url = harness
    recorder.block_first_hook = True
    with connect(url) as socket:
        first = create(socket, input="a")["response"]["id"]
        # The hook of the first response is still waiting; the next turn runs regardless.
        second = create(socket, input="b", previous_response_id=first)
        assert second["type"] == "response.completed"
        create(socket, input="c", previous_response_id=second["response"]["id"])
    assert sorted(recorder.hooked[:2]) == ["resp_1", "resp_2"]


def test_a_warm_up_renders_its_input_before_the_first_generated_turn(
    harness: tuple[Harness, str],
) -> None:
    recorder, url = harness
    with connect(url) as socket:
        warm = create(socket, input="system context", tools=TOOLS, generate=False)
        assert warm["response"]["output"] == []
        rendered_before = len(recorder.rendered)
        assert rendered_before == 1  # the warm-up's input, rendered at warm-up time
        create(socket, input="go", tools=TOOLS, previous_response_id=warm["response"]["id"])
    assert recorder.turns[0]["prefix"] == len(
        render([{"role": "user", "content": "system context"}])
    )
    assert recorder.turns[0]["tokens_match"]
    assert recorder.turns[0]["tools_changed"] is False
