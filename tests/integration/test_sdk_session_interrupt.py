"""`response.interrupt` sent on openai-python's `ResponsesWebSocketSession` (sync and async):
the lane receives the acceptance and the open message interrupted, `lane.get_final_response()`
gives the interrupted response (`incomplete`, reason `interrupted`), and the same lane then
continues it to a completed response. Against ``ws-mode serve``'s app under uvicorn."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.test_sdk_session import create, open_async_session, open_session
from tests.servers import serve
from ws_mode.toolkit.cli.serve import build_app

TIMEOUT = 10.0
#: What the lane receives once the interrupt is sent, in order.
INTERRUPTED = ["response.interrupt.accepted", "response.output_item.interrupted",
               "response.incomplete"]  # fmt: skip


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    # 100 tokens a second: an answer streams for about half a second; the interrupt follows its
    # first delta within milliseconds.
    with serve(build_app(tool_calls=0, tokens_per_second=100)) as url:
        yield url + "/v1"


def interrupt(response_id: str) -> dict[str, Any]:
    return {"type": "response.interrupt", "response_id": response_id,
            "mode": "discard_partial_items"}  # fmt: skip


def test_an_interrupt_on_a_session_lane_sync(base: str) -> None:
    with open_session(base) as session:
        lane = session.lane("a")
        lane.send(create("Tell me about lighthouses."))
        target = ""
        while (event := lane.recv(timeout=TIMEOUT)).type != "response.output_text.delta":
            if event.type == "response.created":
                target = event.response.id
        lane.send(interrupt(target))
        kinds = []
        while not kinds or kinds[-1] != "response.incomplete":
            kinds.append(lane.recv(timeout=TIMEOUT).type)
        interrupted = lane.get_final_response(timeout=TIMEOUT)
        lane.send(create("Go on.", previous_response_id=target))
        continued = lane.get_final_response(timeout=TIMEOUT)
    assert [kind for kind in kinds if kind != "response.output_text.delta"] == INTERRUPTED
    assert (interrupted.id, interrupted.status) == (target, "incomplete")
    assert interrupted.incomplete_details is not None
    assert interrupted.incomplete_details.reason == "interrupted"
    assert (continued.status, continued.previous_response_id) == ("completed", target)


@pytest.mark.anyio
async def test_an_interrupt_on_a_session_lane_async(base: str) -> None:
    async with open_async_session(base) as session:
        lane = session.lane("a")
        await lane.send(create("Tell me about lighthouses."))
        target = ""
        while (
            event := await asyncio.wait_for(lane.recv(), TIMEOUT)
        ).type != "response.output_text.delta":
            if event.type == "response.created":
                target = event.response.id
        await lane.send(interrupt(target))
        kinds = []
        while not kinds or kinds[-1] != "response.incomplete":
            kinds.append((await asyncio.wait_for(lane.recv(), TIMEOUT)).type)
        interrupted = await asyncio.wait_for(lane.get_final_response(), TIMEOUT)
        await lane.send(create("Go on.", previous_response_id=target))
        continued = await asyncio.wait_for(lane.get_final_response(), TIMEOUT)
    assert [kind for kind in kinds if kind != "response.output_text.delta"] == INTERRUPTED
    assert (interrupted.id, interrupted.status) == (target, "incomplete")
    assert (continued.status, continued.previous_response_id) == ("completed", target)
