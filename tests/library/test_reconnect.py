"""The openai SDK's reconnect when the server ends a connection at its lifetime limit, and the
documented recovery: the full context with previous_response_id null."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI
from openai.types.websocket_reconnection import ReconnectingEvent, ReconnectingOverrides

from tests.servers import SERVERS, serve
from ws_mode import Limits, WebSocketModeMiddleware
from ws_mode.toolkit.reference import ReferenceConfig, create_app

LIFETIME = 1.5


@pytest.fixture(scope="module", params=SERVERS)
def base_url(request: pytest.FixtureRequest) -> Iterator[str]:
    app = WebSocketModeMiddleware(
        create_app(ReferenceConfig(tool_calls=1, answer_tokens=5)),
        limits=Limits(max_connection_seconds=LIFETIME),
    )
    with serve(app, request.param) as url:
        yield url


def read_events(connection: Any, into: queue.Queue[Any]) -> None:
    """The client's reader loop: the SDK reconnects inside its event iterator."""
    for event in connection:
        into.put(event)
    into.put(None)


def next_terminal(events: queue.Queue[Any]) -> Any:
    while True:
        event = events.get(timeout=20)
        assert event is not None, "the connection ended"
        if event.type in ("response.completed", "error", "response.failed"):
            return event


def test_the_sdk_reconnects_and_recovers_with_the_full_context(base_url: str) -> None:
    reconnects: list[ReconnectingEvent] = []

    def on_reconnecting(event: ReconnectingEvent) -> ReconnectingOverrides | None:
        reconnects.append(event)
        return None

    client = OpenAI(base_url=base_url + "/v1", api_key="test")
    prompt = [{"role": "user", "content": "list the files"}]
    with client.responses.connect(
        on_reconnecting=on_reconnecting, initial_delay=0.05
    ) as connection:
        events: queue.Queue[Any] = queue.Queue()
        reader = threading.Thread(target=read_events, args=(connection, events), daemon=True)
        reader.start()
        connection.send({"type": "response.create", "model": "m", "input": prompt})
        first = next_terminal(events)
        assert first.type == "response.completed"
        call = first.response.output[0]
        tool_output = [{"type": "function_call_output", "call_id": call.call_id, "output": "a.py"}]

        # The lifetime limit: an error event, then a close with 1001, which the SDK treats as
        # recoverable and reconnects.
        limit = next_terminal(events)
        assert limit.type == "error"
        assert limit.error.code == "websocket_connection_limit_reached"
        time.sleep(0.5)

        # The new socket knows nothing of the old one's responses...
        connection.send(
            {
                "type": "response.create",
                "model": "m",
                "input": tool_output,
                "previous_response_id": first.response.id,
            }
        )
        missing = next_terminal(events)
        assert missing.type == "error"
        assert missing.error.code == "previous_response_not_found"
        assert reconnects
        assert reconnects[0].close_code == 1001

        # ...so the client resends the full context with previous_response_id null.
        full = [*prompt, call.model_dump(exclude_none=True), *tool_output]
        connection.send({"type": "response.create", "model": "m", "input": full})
        recovered = next_terminal(events)
    assert recovered.type == "response.completed"
    assert recovered.response.output[0].type == "message"
    assert "answered after 1 tool" in recovered.response.output[0].content[0].text
