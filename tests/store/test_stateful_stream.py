"""Stateful HTTP passes the handler's event stream through as it came: comments (heartbeats),
`id:` and `retry:` lines, line ends and chunking stay; events are recognised by their data's
`type` (the tap the socket path uses), so data-only streams are stored too; only the response
objects change, to echo `previous_response_id`."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.store_kit import read_body
from ws_mode import WebSocketModeMiddleware
from ws_mode._asgi import Receive, Scope, Send
from ws_mode._protocol import RESPONSE_EVENTS
from ws_mode._sse import SSEDecoder
from ws_mode._store import MemoryStore
from ws_mode.testing._loopback import ServerThread

PRINCIPAL = "tenant-a"


@dataclass
class Framing:
    """How the handler writes its stream."""

    eol: bytes = b"\n"
    event_lines: bool = True  # an `event:` line before the data (False: data-only SSE)
    heartbeats: bool = False  # comment lines between events and inside them
    ids: bool = False  # `id:` lines, and a `retry:` line
    multiline: bool = False  # each event's JSON spread over several `data:` lines
    space: bool = True  # `data: ` (or `data:`)
    length: bool = False  # a content-length header
    cuts: list[int] = field(default_factory=list)  # where the body is cut into chunks


class Handler:
    """A stateless handler: answers with one message saying how many input items it got,
    streamed in `framing`; keeps what each response was made from and the bytes it sent."""

    def __init__(self) -> None:
        self.framing = Framing()
        self.hold: threading.Event | None = None
        self.sent: dict[str, bytes] = {}
        self.inputs: dict[str, list[Any]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = await read_body(receive)
        request = json.loads(body)
        assert "previous_response_id" not in request or request["previous_response_id"] is None
        items = request["input"]
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items
        response_id = f"resp_{uuid.uuid4().hex}"
        self.inputs[response_id] = items
        payload = encode(events(response_id, len(items)), self.framing)
        self.sent[response_id] = payload
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    *([(b"content-length", b"%d" % len(payload))] if self.framing.length else []),
                ],
            }
        )
        if self.hold is not None:  # a heartbeat, then nothing until the test says so
            await send({"type": "http.response.body", "body": b": ping\n", "more_body": True})
            await asyncio.to_thread(self.hold.wait, 10)
        start = 0
        for cut in [*sorted(set(self.framing.cuts)), len(payload)]:
            if start < cut <= len(payload):
                await send(
                    {"type": "http.response.body", "body": payload[start:cut], "more_body": True}
                )
                start = cut
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def events(response_id: str, count: int) -> list[dict[str, Any]]:
    started = {
        "id": response_id,
        "object": "response",
        "status": "in_progress",
        "model": "scripted",
        "output": [],
        "previous_response_id": None,
    }
    item = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": f"{count} items", "annotations": []}],
    }
    done = {**started, "status": "completed", "output": [item]}
    return [
        {"type": "response.created", "sequence_number": 0, "response": started},
        {"type": "response.in_progress", "sequence_number": 1, "response": started},
        {
            "type": "response.output_item.added",
            "sequence_number": 2,
            "output_index": 0,
            "item": item,
        },
        {"type": "response.output_text.delta", "sequence_number": 3, "delta": f"{count} items"},
        {
            "type": "response.output_item.done",
            "sequence_number": 4,
            "output_index": 0,
            "item": item,
        },
        {"type": "response.completed", "sequence_number": 5, "response": done},
    ]


def encode(stream: list[dict[str, Any]], framing: Framing) -> bytes:
    eol = framing.eol
    out = b""
    for number, event in enumerate(stream):
        if framing.heartbeats:
            out += b": ping" + eol + eol + b":" + eol
        lines = []
        if framing.ids:
            lines.append(b"id: %d" % number)
        if framing.event_lines:
            lines.append(b"event: " + event["type"].encode())
        if framing.heartbeats:
            lines.append(b": inside an event")
        data = json.dumps(event, indent=1 if framing.multiline else None).encode()
        prefix = b"data: " if framing.space else b"data:"
        lines += [prefix + line for line in data.split(b"\n")]
        if framing.ids and number == 0:
            lines.append(b"retry: 3000")
        out += eol.join(lines) + eol + eol
    return out


@dataclass
class Running:
    url: str
    handler: Handler
    plain: str  # the handler alone, without the middleware
    #: One client for each: a new one loads the CA bundle (~45 ms of CPU) for every POST.
    http: httpx.Client
    plain_http: httpx.Client


async def principal(scope: Scope) -> str:
    return PRINCIPAL


@pytest.fixture(scope="module")
def running() -> Iterator[Running]:
    handler = Handler()
    app = WebSocketModeMiddleware(
        handler, store=MemoryStore(), stateful_http=True, authenticate=principal
    )
    with (
        ServerThread(app) as url,
        ServerThread(handler) as plain,
        httpx.Client(base_url=url, timeout=10) as http,
        httpx.Client(base_url=plain, timeout=10) as plain_http,
    ):
        yield Running(url, handler, plain, http, plain_http)


def post(
    client: httpx.Client, **body: Any
) -> tuple[bytes, list[tuple[str | None, dict[str, Any]]]]:
    """The raw body of a streamed POST, and its events decoded."""
    payload = {"model": "scripted", "stream": True, **body}
    with client.stream("POST", "/v1/responses", json=payload) as answer:
        assert answer.status_code == 200, answer.read()
        raw = b"".join(answer.iter_raw())
    return raw, decode(raw)


def decode(raw: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    return [(kind, json.loads(data)) for kind, data in SSEDecoder().feed(raw)]


def echoed(stream: list[tuple[str | None, dict[str, Any]]], parent: str | None) -> list[Any]:
    """The events as the client must get them: the response objects echo `parent`."""
    for _, event in stream:
        if event["type"] in RESPONSE_EVENTS:
            event["response"]["previous_response_id"] = parent
    return stream


def other_lines(raw: bytes) -> list[bytes]:
    """Every line but the data lines (comments, `id:`, `retry:`, `event:`), in order."""
    return [line for line in raw.splitlines() if not line.startswith(b"data")]


def response_id(stream: list[tuple[str | None, dict[str, Any]]]) -> str:
    _, last = stream[-1]
    assert last["type"] == "response.completed"
    return str(last["response"]["id"])


def test_heartbeats_ids_and_retry_pass_unchanged(running: Running) -> None:
    running.handler.framing = Framing(eol=b"\r\n", heartbeats=True, ids=True)
    raw, stream = post(running.http, input="Hi")
    sent = running.handler.sent[response_id(stream)]
    assert raw == sent  # nothing to echo: not one byte changed
    parent = response_id(stream)
    raw, stream = post(running.http, input="More", previous_response_id=parent)
    sent = running.handler.sent[response_id(stream)]
    assert other_lines(raw) == other_lines(sent)
    assert other_lines(raw).count(b": ping") == 6
    assert stream == echoed(decode(sent), parent)


def test_a_multi_line_data_event_arrives_as_valid_json(running: Running) -> None:
    running.handler.framing = Framing(multiline=True)
    _, first = post(running.http, input="Hi")
    _, stream = post(running.http, input="More", previous_response_id=response_id(first))
    assert stream[0][1]["response"]["previous_response_id"] == response_id(first)
    assert stream[-1][1]["response"]["previous_response_id"] == response_id(first)
    assert stream == echoed(decode(running.handler.sent[response_id(stream)]), response_id(first))


def test_a_data_only_stream_is_stored_and_continued(running: Running) -> None:
    running.handler.framing = Framing(event_lines=False)
    _, first = post(running.http, input="Hi")
    first_id = response_id(first)
    got = running.http.get(f"/v1/responses/{first_id}")
    assert got.status_code == 200
    assert got.json() == first[-1][1]["response"]
    _, second = post(running.http, input="More", previous_response_id=first_id)
    # The handler got the whole conversation: the first input, its answer, the new input.
    assert len(running.handler.inputs[response_id(second)]) == 3
    assert second[-1][1]["response"]["previous_response_id"] == first_id


framings = st.builds(
    Framing,
    eol=st.sampled_from([b"\n", b"\r\n", b"\r"]),
    event_lines=st.booleans(),
    heartbeats=st.booleans(),
    ids=st.booleans(),
    multiline=st.booleans(),
    space=st.booleans(),
    length=st.booleans(),
    cuts=st.lists(st.integers(min_value=1, max_value=3000), max_size=12),
)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(framing=framings)
def test_any_framing_reaches_the_client_as_the_handler_sent_it(
    running: Running, framing: Framing
) -> None:
    """Whatever the framing, the client gets the events the handler sent (the response
    objects echoing `previous_response_id`), every other line as it was, and the stored
    response is the terminal one the client got."""
    running.handler.framing = framing
    raw, first = post(running.http, input="Hi")
    assert raw == running.handler.sent[response_id(first)]
    parent = response_id(first)
    raw, second = post(running.http, input="More", previous_response_id=parent)
    sent = running.handler.sent[response_id(second)]
    assert second == echoed(decode(sent), parent)
    assert other_lines(raw) == other_lines(sent)
    stored = running.http.get(f"/v1/responses/{response_id(second)}")
    assert stored.json() == second[-1][1]["response"]
    plain, direct = post(running.plain_http, input="Hi")  # what "sent" holds is what it sends
    assert plain == running.handler.sent[response_id(direct)]


def test_a_heartbeat_reaches_the_client_at_once(running: Running) -> None:
    """A comment is passed on as it arrives, not held with the event after it: it keeps an
    idle connection alive."""
    running.handler.framing = Framing()
    running.handler.hold = hold = threading.Event()
    payload = {"model": "scripted", "stream": True, "input": "Hi"}
    try:
        with (
            httpx.Client(base_url=running.url, timeout=5) as client,
            client.stream("POST", "/v1/responses", json=payload) as answer,
        ):
            chunks = answer.iter_raw()
            assert next(chunks) == b": ping\n"  # while the handler still holds the rest
            hold.set()
            rest = b"".join(chunks)
    finally:
        hold.set()
        running.handler.hold = None
    assert decode(rest)[-1][1]["type"] == "response.completed"
