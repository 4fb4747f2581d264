"""The openai SDK's reconnect at the connection lifetime limit, with a store: after the SDK
reconnects, the next turn continues from its previous_response_id with only the new items
(sync and async clients), and gets what plain HTTP with the whole history gets. Without a
store the same turn gets previous_response_not_found."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI
from openai.types.websocket_reconnection import ReconnectingEvent, ReconnectingOverrides

from tests.client_tls import CLIENT_TLS
from tests.principals import by_bearer_token
from tests.servers import serve
from ws_mode import Limits, WebSocketModeMiddleware
from ws_mode._store import MemoryStore
from ws_mode.toolkit.reference import ReferenceConfig, create_app

LIFETIME = 1.5
TIMEOUT = 20.0
MODEL = "reference"
PROMPT: list[dict[str, Any]] = [{"role": "user", "content": "List the files, then read one."}]
TERMINAL = ("response.completed", "response.failed", "response.incomplete", "error")


@dataclass
class Server:
    base_url: str
    middleware: WebSocketModeMiddleware
    stored: bool


@pytest.fixture(scope="module", params=["store", "no store"])
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    middleware = WebSocketModeMiddleware(
        create_app(ReferenceConfig(tool_calls=2, answer_tokens=5)),
        limits=Limits(max_connection_seconds=LIFETIME),
        store=MemoryStore() if request.param == "store" else None,
        authenticate=by_bearer_token,  # the SDK's api_key: each key keeps its own responses
    )
    with serve(middleware, "uvicorn") as base_url:
        yield Server(base_url, middleware, stored=request.param == "store")


class Reconnects:
    """The SDK's `on_reconnecting` hook: records each attempt and signals the first."""

    def __init__(self) -> None:
        self.events: list[ReconnectingEvent] = []
        self.started = threading.Event()

    def __call__(self, event: ReconnectingEvent) -> ReconnectingOverrides | None:
        self.events.append(event)
        self.started.set()
        return None


def as_json(response: Any) -> dict[str, Any]:
    """An SDK response object as the JSON it was parsed from."""
    dumped: dict[str, Any] = response.model_dump(mode="json", exclude_unset=True)
    return dumped


def answers(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The client's tool outputs for the model's function calls in `output`."""
    calls = [item for item in output if item["type"] == "function_call"]
    assert calls, output
    return [
        {"type": "function_call_output", "call_id": call["call_id"], "output": f"file {n}.py"}
        for n, call in enumerate(calls)
    ]


def over_http(base_url: str, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The output plain HTTP gives for the whole `history`."""
    answer = httpx.post(
        base_url + "/v1/responses",
        json={"model": MODEL, "input": history},
        timeout=TIMEOUT,
        verify=CLIENT_TLS,
    )
    assert answer.status_code == 200, answer.text
    output: list[dict[str, Any]] = answer.json()["output"]
    return output


def create(items: list[dict[str, Any]], previous: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"type": "response.create", "model": MODEL, "input": items}
    if previous is not None:
        message["previous_response_id"] = previous
    return message


class Conversation:
    """What the scenario checks, turn by turn, whichever client runs it."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.history: list[dict[str, Any]] = list(PROMPT)
        self.previous: str | None = None
        self.hydrations = server.middleware.stats.snapshot()["store_hydrations"]

    def first(self, event: Any) -> list[dict[str, Any]]:
        """Check the first turn's answer; the next turn's new items."""
        assert event.type == "response.completed", event
        return self.advance(as_json(event.response))

    def limit(self, event: Any) -> None:
        """The lifetime limit: an error event, then a close with 1001."""
        assert event.type == "error"
        assert event.error.code == "websocket_connection_limit_reached"

    def continued(self, event: Any, new_items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A turn that sent only `new_items`: its context is the whole history, as over HTTP."""
        self.history += new_items
        assert event.type == "response.completed", event
        response = as_json(event.response)
        assert response["previous_response_id"] == self.previous
        assert response["output"] == over_http(self.server.base_url, self.history)
        return self.advance(response)

    def advance(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        self.history += response["output"]
        self.previous = response["id"]
        if response["output"][0]["type"] == "message":
            return []
        return answers(response["output"])

    def finished(self, reconnects: Reconnects) -> None:
        assert reconnects.events, "the SDK did not reconnect"
        assert reconnects.events[0].close_code == 1001
        assert self.history[-1]["type"] == "message"
        assert "answered after 2 tool" in self.history[-1]["content"][0]["text"]
        # Exactly one hydration from the store: the first turn after the reconnect; the turn
        # after it found its parent in the new connection's cache.
        hydrations = self.server.middleware.stats.snapshot()["store_hydrations"]
        assert hydrations == self.hydrations + 1

    def not_found(self, event: Any) -> None:
        assert event.type == "error"
        assert event.error.code == "previous_response_not_found"


# --- the sync client ---------------------------------------------------------------------------


def read_events(connection: Any, into: queue.Queue[Any]) -> None:
    """The client's reader loop: the SDK reconnects inside its event iterator."""
    try:
        for event in connection:
            into.put(event)
    finally:
        into.put(None)


def next_terminal(events: queue.Queue[Any]) -> Any:
    while True:
        event = events.get(timeout=TIMEOUT)
        assert event is not None, "the connection ended"
        if event.type in TERMINAL:
            return event


def test_the_sync_sdk_continues_after_its_reconnect_without_resending(server: Server) -> None:
    client = OpenAI(base_url=server.base_url + "/v1", api_key="sk-sync")
    reconnects = Reconnects()
    chat = Conversation(server)
    with client.responses.connect(on_reconnecting=reconnects, initial_delay=0.05) as connection:
        events: queue.Queue[Any] = queue.Queue()
        reader = threading.Thread(target=read_events, args=(connection, events), daemon=True)
        reader.start()
        connection.send(create(PROMPT))
        new_items = chat.first(next_terminal(events))
        chat.limit(next_terminal(events))
        # Sent once the SDK is reconnecting: it queues the message and sends it on the new
        # socket (or sends it there at once when it already reconnected).
        assert reconnects.started.wait(TIMEOUT)
        connection.send(create(new_items, chat.previous))
        if not server.stored:
            chat.not_found(next_terminal(events))
            return
        new_items = chat.continued(next_terminal(events), new_items)
        connection.send(create(new_items, chat.previous))  # the new socket's own cache now
        assert chat.continued(next_terminal(events), new_items) == []
    chat.finished(reconnects)


# --- the async client --------------------------------------------------------------------------


async def read_events_async(connection: Any, into: asyncio.Queue[Any]) -> None:
    try:
        async for event in connection:
            await into.put(event)
    finally:
        await into.put(None)


async def next_terminal_async(events: asyncio.Queue[Any]) -> Any:
    async with asyncio.timeout(TIMEOUT):
        while True:
            event = await events.get()
            assert event is not None, "the connection ended"
            if event.type in TERMINAL:
                return event


async def async_scenario(server: Server) -> None:
    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="sk-async")
    reconnects = Reconnects()
    chat = Conversation(server)
    async with client.responses.connect(
        on_reconnecting=reconnects, initial_delay=0.05
    ) as connection:
        events: asyncio.Queue[Any] = asyncio.Queue()
        reader = asyncio.create_task(read_events_async(connection, events))
        try:
            await connection.send(create(PROMPT))
            new_items = chat.first(await next_terminal_async(events))
            chat.limit(await next_terminal_async(events))
            assert await asyncio.to_thread(reconnects.started.wait, TIMEOUT)
            await connection.send(create(new_items, chat.previous))
            if not server.stored:
                chat.not_found(await next_terminal_async(events))
                return
            new_items = chat.continued(await next_terminal_async(events), new_items)
            await connection.send(create(new_items, chat.previous))
            assert chat.continued(await next_terminal_async(events), new_items) == []
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
    chat.finished(reconnects)


def test_the_async_sdk_continues_after_its_reconnect_without_resending(server: Server) -> None:
    asyncio.run(async_scenario(server))
