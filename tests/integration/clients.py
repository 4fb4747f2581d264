"""Client-side helpers: every receive has a deadline, so no test can hang on a silent server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from openai import AsyncOpenAI, OpenAI
from openai.resources.responses.responses import AsyncResponsesConnection, ResponsesConnection
from websockets.sync.client import ClientConnection, connect

from tests.client_tls import sdk_async_http_client, sdk_http_client
from tests.integration.apps import Recorder

TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})
RECV_TIMEOUT = 5.0


@dataclass
class Server:
    """A running server of the integration app."""

    name: str
    base_url: str
    recorder: Recorder

    def api_base(self, prefix: str = "") -> str:
        """The `base_url` to give the openai SDK for the mount at `prefix`."""
        return f"{self.base_url}{prefix}/v1"

    def ws_url(self, prefix: str = "", path: str = "/v1/responses") -> str:
        return "ws://" + self.base_url.removeprefix("http://") + prefix + path

    def openai(self, prefix: str = "", **options: Any) -> OpenAI:
        options.setdefault("api_key", "test")
        if "http_client" not in options:
            options["http_client"] = sdk_http_client()
        return OpenAI(base_url=self.api_base(prefix), max_retries=0, **options)

    def async_openai(self, prefix: str = "", **options: Any) -> AsyncOpenAI:
        options.setdefault("api_key", "test")
        if "http_client" not in options:
            options["http_client"] = sdk_async_http_client()
        return AsyncOpenAI(base_url=self.api_base(prefix), max_retries=0, **options)

    @contextlib.contextmanager
    def connect(self, prefix: str = "", **options: Any) -> Iterator[ResponsesConnection]:
        """`client.responses.connect()` of the real SDK, sync."""
        headers = options.pop("extra_headers", {})
        with (
            self.openai(prefix, **options) as client,
            client.responses.connect(extra_headers=headers) as conn,
        ):
            yield conn

    @contextlib.contextmanager
    def raw(
        self,
        prefix: str = "",
        *,
        headers: dict[str, str] | None = None,
        path: str = "/v1/responses",
    ) -> Iterator[RawClient]:
        """A plain `websockets` client, for frames the SDK would never send."""
        with connect(
            self.ws_url(prefix, path),
            additional_headers=headers,
            open_timeout=5,
            close_timeout=2,
            max_size=None,
        ) as ws:
            yield RawClient(ws)


def new_tag() -> str:
    return uuid.uuid4().hex


def sdk_recv(conn: ResponsesConnection, timeout: float = RECV_TIMEOUT) -> Any:
    """`conn.recv()` with a deadline: the SDK's own recv() waits forever.

    It reads the frame from the SDK's websockets connection and parses it with the SDK's
    own `parse_event`, so the event is exactly what `conn.recv()` would have returned.
    """
    data = conn._connection.recv(timeout=timeout, decode=False)
    return conn.parse_event(data)


def sdk_until_terminal(
    conn: ResponsesConnection, terminals: int = 1, timeout: float = RECV_TIMEOUT
) -> list[Any]:
    """Events up to and including the `terminals`-th terminal event."""
    deadline = time.monotonic() + timeout
    events: list[Any] = []
    seen = 0
    while seen < terminals:
        event = sdk_recv(conn, max(0.01, deadline - time.monotonic()))
        events.append(event)
        if event.type in TERMINAL:
            seen += 1
    return events


async def async_recv(conn: AsyncResponsesConnection, seconds: float = RECV_TIMEOUT) -> Any:
    """`await conn.recv()` within `seconds` (cancelling the SDK's recv() is safe)."""
    async with asyncio.timeout(seconds):
        return await conn.recv()


async def async_until_terminal(
    conn: AsyncResponsesConnection, terminals: int = 1, seconds: float = RECV_TIMEOUT
) -> list[Any]:
    deadline = time.monotonic() + seconds
    events: list[Any] = []
    seen = 0
    while seen < terminals:
        event = await async_recv(conn, max(0.01, deadline - time.monotonic()))
        events.append(event)
        if event.type in TERMINAL:
            seen += 1
    return events


class RawClient:
    """A websockets connection speaking JSON frames, with deadlines on every receive."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.frames: list[str] = []

    def send(self, event: dict[str, Any]) -> None:
        self.ws.send(json.dumps(event))

    def send_text(self, text: str) -> None:
        self.ws.send(text)

    def send_bytes(self, data: bytes) -> None:
        self.ws.send(data)

    def recv(self, timeout: float = RECV_TIMEOUT) -> dict[str, Any]:
        frame = self.ws.recv(timeout=timeout)
        assert isinstance(frame, str), f"the server sent a binary frame: {frame!r}"
        self.frames.append(frame)
        event = json.loads(frame)
        assert isinstance(event, dict), frame
        return event

    def until_terminal(self, terminals: int = 1, timeout: float = RECV_TIMEOUT) -> list[dict]:
        deadline = time.monotonic() + timeout
        events: list[dict[str, Any]] = []
        seen = 0
        while seen < terminals:
            event = self.recv(max(0.01, deadline - time.monotonic()))
            events.append(event)
            if event["type"] in TERMINAL:
                seen += 1
        return events

    def expect_silence(self, seconds: float = 0.2) -> None:
        """Nothing more arrives for `seconds`."""
        with contextlib.suppress(TimeoutError):
            frame = self.ws.recv(timeout=seconds)
            raise AssertionError(f"unexpected frame: {frame!r}")


def create(tag: str, model: str = "scripted", *, meta: dict[str, str] | None = None, **fields: Any):
    """A `response.create` event for a raw client (or `conn.send`)."""
    event: dict[str, Any] = {
        "type": "response.create",
        "model": model,
        "metadata": {"tag": tag, **(meta or {})},
    }
    event.update(fields)
    return event


def call_output(item: Any, output: str = "42") -> dict[str, Any]:
    """The client's answer to a function_call item (an SDK model or a dict)."""
    call_id = item["call_id"] if isinstance(item, dict) else item.call_id
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def completed_response(events: list[Any]) -> Any:
    last = events[-1]
    kind = last["type"] if isinstance(last, dict) else last.type
    assert kind == "response.completed", f"the turn did not complete: {last}"
    return last["response"] if isinstance(last, dict) else last.response
