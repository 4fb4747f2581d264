"""openai-python's WebSocket session helpers as real clients: `ResponsesWebSocketSession` and
`AsyncResponsesWebSocketSession` (one reader owning the socket, lanes routed by `stream_id`,
`lane.get_final_response()`), against ``ws-mode serve``'s app under uvicorn on loopback.

Lanes run at once and each collects its own response; a fork continues one response on two
lanes; steering into a streaming response ends it (`incomplete`, reason `steered`) and its
successor arrives on the same lane, collected by the same lane handle."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
from openai import AsyncOpenAI, OpenAI
from openai.types.responses import Response

from tests.client_tls import sdk_async_http_client, sdk_http_client
from tests.servers import serve
from ws_mode.toolkit.cli.serve import build_app

session_helpers = pytest.importorskip("openai.lib.responses_websocket")
ResponsesWebSocketLimits = session_helpers.ResponsesWebSocketLimits

MODEL = "reference"
TIMEOUT = 10.0
LIMITS = ResponsesWebSocketLimits(
    max_lanes=8,
    max_events_per_lane=4096,
    max_events=8192,
    max_bytes_per_lane=16 * 1024 * 1024,
    max_bytes=32 * 1024 * 1024,
)


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    # 100 tokens a second: an answer streams for about half a second, long enough to steer.
    with serve(build_app(tool_calls=0, tokens_per_second=100)) as url:
        yield url + "/v1"


def create(text: str, **fields: Any) -> dict[str, Any]:
    return {"type": "response.create", "model": MODEL, "input": text, "store": False, **fields}


def text(response: Response) -> str:
    return response.output_text


@contextmanager
def open_session(base: str) -> Iterator[Any]:
    """A `ResponsesWebSocketSession` on a socket of the SDK's sync client to `base`."""
    with (
        OpenAI(base_url=base, api_key="x", max_retries=0, http_client=sdk_http_client()) as client,
        client.responses.connect() as connection,
        session_helpers.ResponsesWebSocketSession(connection, limits=LIMITS) as session,
    ):
        yield session


@asynccontextmanager
async def open_async_session(base: str) -> AsyncIterator[Any]:
    """An `AsyncResponsesWebSocketSession` on a socket of the SDK's async client to `base`."""
    async with (
        AsyncOpenAI(
            base_url=base, api_key="x", max_retries=0, http_client=sdk_async_http_client()
        ) as client,
        client.responses.connect() as connection,
        session_helpers.AsyncResponsesWebSocketSession(connection, limits=LIMITS) as session,
    ):
        yield session


def test_lanes_forks_and_steering_sync(base: str) -> None:
    with open_session(base) as session:
        a, b = session.lane("a"), session.lane("b")
        # Two lanes at once and the default lane: each lane collects its own response.
        a.send(create("Tell me about lighthouses."))
        b.send(create("Tell me about harbours."))
        session.default.send(create("Tell me about ships."))
        first_a = a.get_final_response(timeout=TIMEOUT)
        first_b = b.get_final_response(timeout=TIMEOUT)
        first_default = session.default.get_final_response(timeout=TIMEOUT)
        responses = (first_a, first_b, first_default)
        assert [response.status for response in responses] == ["completed"] * 3
        assert len({response.id for response in responses}) == 3
        # A fork: the same response continued on both lanes, with the same input.
        a.send(create("Go on.", previous_response_id=first_a.id))
        b.send(create("Go on.", previous_response_id=first_a.id))
        on_a = a.get_final_response(timeout=TIMEOUT)
        on_b = b.get_final_response(timeout=TIMEOUT)
        assert on_a.previous_response_id == on_b.previous_response_id == first_a.id
        assert on_a.id != on_b.id
        assert text(on_a) == text(on_b) != text(first_a)  # the same context: the same answer
        # Steering into a streaming response on a lane.
        a.send(create("Write a long story.", previous_response_id=on_a.id))
        target = None
        while True:
            event = a.recv(timeout=TIMEOUT)
            if event.type == "response.created":
                target = event.response.id
            if event.type == "response.output_text.delta":
                break
        assert target is not None
        a.send({"type": "response.steer", "previous_response_id": target, "input": "Shorter."})
        accepted = a.recv(timeout=TIMEOUT)
        while accepted.type != "response.steer.accepted":
            accepted = a.recv(timeout=TIMEOUT)
        assert (accepted.stream_id, accepted.steer.previous_response_id) == ("a", target)
        steered = a.get_final_response(timeout=TIMEOUT)
        assert steered.id == target
        assert steered.status == "incomplete"
        assert steered.incomplete_details is not None
        assert steered.incomplete_details.reason == "steered"
        successor = _successor(a)
        assert successor.previous_response_id == target
        assert successor.status == "completed"
        assert text(successor)


def _successor(lane: Any) -> Response:
    """The successor's response: wait for its `response.created` (accepted steering alone
    does not prove one starts), then collect it."""
    while True:
        event = lane.recv(timeout=TIMEOUT)
        if event.type == "response.created":
            break
    final: Response = lane.get_final_response(timeout=TIMEOUT)
    return final


@pytest.mark.anyio
async def test_lanes_forks_and_steering_async(base: str) -> None:
    async with open_async_session(base) as session:
        a, b = session.lane("a"), session.lane("b")
        await a.send(create("Tell me about lighthouses."))
        await b.send(create("Tell me about harbours."))
        first_a = await a.get_final_response()
        first_b = await b.get_final_response()
        assert (first_a.status, first_b.status) == ("completed", "completed")
        await a.send(create("Go on.", previous_response_id=first_b.id))
        await b.send(create("Go on.", previous_response_id=first_b.id))
        on_a, on_b = await a.get_final_response(), await b.get_final_response()
        assert on_a.previous_response_id == on_b.previous_response_id == first_b.id
        assert text(on_a) == text(on_b)
        await b.send(create("Write a long story.", previous_response_id=on_b.id))
        target = None
        while True:
            event = await b.recv()
            if event.type == "response.created":
                target = event.response.id
            if event.type == "response.output_text.delta":
                break
        assert target is not None
        await b.send({"type": "response.steer", "previous_response_id": target, "input": "Stop."})
        steered = await b.get_final_response()
        assert (steered.id, steered.status) == (target, "incomplete")
        while (await b.recv()).type != "response.created":
            pass
        successor = await b.get_final_response()
        assert (successor.previous_response_id, successor.status) == (target, "completed")
