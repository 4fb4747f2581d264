"""Steering over a real socket with the openai SDK (sync and async): a handler that knows
nothing of it is cut at an output boundary and continued by a successor; a response waiting
for tool output keeps the input queued for the client's continuation; a handler may take the
input itself; every refusal carries its code."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from openai import AsyncOpenAI, OpenAI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from websockets.sync.client import connect

from tests.servers import serve
from ws_mode import Limits, WebSocketModeMiddleware, turn
from ws_mode._client_events import CreateEvent, SteerEvent
from ws_mode._items import Items
from ws_mode._steering import (
    MAX_WAITING_RESPONSES,
    STEER_MESSAGES,
    Outcome,
    Steer,
    SteerInbox,
    Steering,
    accepted_event,
    not_committed,
    pending_event,
    required_input,
)

STEP = 0.002  # seconds between two deltas


def _sse(events: list[dict[str, Any]]) -> list[str]:
    return [
        f"event: {event['type']}\ndata: {json.dumps({**event, 'sequence_number': number})}\n\n"
        for number, event in enumerate(events)
    ]


def _message(item_id: str, text: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {"type": "message", "id": item_id, "role": "assistant", "status": "completed",
            "content": [part]}  # fmt: skip


class Model:
    """Scripted handlers; `inputs` records the context each request carried. A response waits
    after its first events until the test sets `go` (once it has steered), so a slow client
    cannot miss the response while it streams."""

    def __init__(self) -> None:
        self.inputs: list[list[dict[str, Any]]] = []
        self.go = threading.Event()

    async def _wait_go(self) -> None:
        for _ in range(1000):
            if self.go.is_set():
                return
            await asyncio.sleep(0.01)

    async def handle(self, request: Request) -> Response:
        body = await request.json()
        self.inputs.append(body["input"])
        number = len(self.inputs)
        response = {"id": f"resp_{number}", "object": "response", "status": "in_progress",
                    "model": body["model"], "output": []}  # fmt: skip
        model = body["model"]
        if number > 1 and model == "successor-refused":  # the successor fails before it starts
            return JSONResponse({"error": {"message": "no", "type": "server_error"}}, 500)
        if model == "fails":  # any request that fails before its response.created
            return JSONResponse({"error": {"message": "no", "type": "server_error"}}, 500)
        if number > 1 and model == "successor-breaks":  # ... or after its response.created
            return StreamingResponse(self._breaks(response), media_type="text/event-stream")
        stream = {"two": self._two, "tool": self._tool, "claim": self._claim}.get(model, self._two)
        return StreamingResponse(stream(response, request), media_type="text/event-stream")

    async def _breaks(self, response: dict[str, Any]) -> AsyncIterator[str]:
        yield _sse([{"type": "response.created", "response": response}])[0]
        error = {"type": "error", "code": "server_error", "message": "broke", "param": None}
        yield _sse([error])[0]

    async def _deltas(
        self, index: int, item: dict[str, Any], words: list[str]
    ) -> AsyncIterator[list[dict[str, Any]]]:
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        yield [{"type": "response.output_item.added", "output_index": index,
                "item": {**item, "status": "in_progress", "content": []}}]  # fmt: skip
        await self._wait_go()
        for word in words:
            await asyncio.sleep(STEP)
            yield [{"type": "response.output_text.delta", **where, "delta": word}]
        yield [{"type": "response.output_item.done", "output_index": index, "item": item}]

    async def _two(self, response: dict[str, Any], request: Request) -> AsyncIterator[str]:
        # Two message items: a steer cuts the response after the first.
        n = len(self.inputs)
        first, second = _message(f"msg_{n}a", "a " * 8), _message(f"msg_{n}b", "b " * 8)
        events = [{"type": "response.created", "response": response}]
        for chunk in _sse(events):
            yield chunk
        sent = 1
        for index, item in enumerate((first, second)):
            async for batch in self._deltas(index, item, ["a "] * 8 if index == 0 else ["b "] * 8):
                for chunk in _sse(batch):
                    yield chunk.replace('"sequence_number": 0', f'"sequence_number": {sent}')
                    sent += 1
        done = {**response, "status": "completed", "output": [first, second]}
        yield _sse([{"type": "response.completed", "response": done}])[0]

    async def _tool(self, response: dict[str, Any], request: Request) -> AsyncIterator[str]:
        n = len(self.inputs)
        call = {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}",
                "name": "read_file", "arguments": "{}", "status": "completed"}  # fmt: skip
        yield _sse([{"type": "response.created", "response": response}])[0]
        await self._wait_go()  # the call is being written
        yield _sse([{"type": "response.output_item.done", "output_index": 0, "item": call}])[0]
        await asyncio.sleep(STEP * 4)
        done = {**response, "status": "completed", "output": [call]}
        yield _sse([{"type": "response.completed", "response": done}])[0]

    async def _claim(self, response: dict[str, Any], request: Request) -> AsyncIterator[str]:
        # A handler that takes steering input itself, mid-generation.
        current = turn(request)
        assert current is not None
        assert current.claim_steering()
        yield _sse([{"type": "response.created", "response": response}])[0]
        text = ""
        for _ in range(1000):
            await asyncio.sleep(STEP)
            for item in current.take_steering():
                text += f"[heard: {item['content']}]"
            if text and self.go.is_set():
                break
        item = _message("msg_claim", text)
        yield _sse([{"type": "response.output_item.done", "output_index": 0, "item": item}])[0]
        done = {**response, "status": "completed", "output": [item]}
        yield _sse([{"type": "response.completed", "response": done}])[0]


@pytest.fixture
def served() -> Iterator[tuple[Model, str]]:
    model = Model()
    app = WebSocketModeMiddleware(
        Starlette(routes=[Route("/v1/responses", model.handle, methods=["POST"])])
    )
    with serve(app) as base_url:
        yield model, base_url + "/v1"


TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}


def test_a_steered_response_ends_at_a_boundary_and_a_successor_continues_it(
    served: tuple[Model, str],
) -> None:
    model, base_url = served
    client = OpenAI(base_url=base_url, api_key="-")
    seen: list[Any] = []
    with client.responses.connect() as connection:
        connection.response.create(model="two", input="hi")
        for event in connection:
            seen.append(event)
            if event.type == "response.created" and len(seen) == 1:
                connection.response.steer(input="turn left", previous_response_id=event.response.id)
            if event.type == "response.steer.accepted":
                model.go.set()
            if event.type in TERMINAL and len([e for e in seen if e.type in TERMINAL]) == 2:
                break
    kinds = [event.type for event in seen]
    accepted = next(event for event in seen if event.type == "response.steer.accepted")
    assert accepted.steer.previous_response_id == "resp_1"
    assert re.fullmatch(r"steer_[0-9a-f]{32}", accepted.steer.id)  # as long as OpenAI's
    steered = next(event for event in seen if event.type == "response.incomplete")
    assert steered.response.incomplete_details.reason == "steered"
    # Cut after the first item: the second never went out, and the output holds the first.
    assert [item.id for item in steered.response.output] == ["msg_1a"]
    assert not any(getattr(e, "item_id", None) == "msg_1b" for e in seen)
    # The successor: created by itself, continuing the steered response with the input.
    created = [event for event in seen if event.type == "response.created"]
    assert [event.response.id for event in created] == ["resp_1", "resp_2"]
    assert created[1].response.previous_response_id == "resp_1"
    assert kinds[-1] == "response.completed"
    assert model.inputs[1] == [
        {"role": "user", "content": "hi"},
        _message("msg_1a", "a " * 8),
        {"role": "user", "content": "turn left"},
    ]


@pytest.mark.anyio
async def test_the_async_sdk_steers_the_same_way(served: tuple[Model, str]) -> None:
    model, base_url = served
    client = AsyncOpenAI(base_url=base_url, api_key="-")
    kinds: list[str] = []
    async with client.responses.connect() as connection:
        await connection.response.create(model="two", input="hi")
        async for event in connection:
            kinds.append(event.type)
            if event.type == "response.created" and len(kinds) == 1:
                await connection.response.steer(input="stop", previous_response_id="resp_1")
            if event.type == "response.steer.accepted":
                model.go.set()
            if kinds.count("response.completed") + kinds.count("response.incomplete") == 2:
                break
    assert "response.steer.accepted" in kinds
    assert kinds.index("response.incomplete") < kinds.index("response.completed")
    assert model.inputs[1][-1] == {"role": "user", "content": "stop"}


def test_input_waits_behind_a_tool_call_and_joins_the_clients_continuation(
    served: tuple[Model, str],
) -> None:
    model, base_url = served
    client = OpenAI(base_url=base_url, api_key="-")
    with client.responses.connect() as connection:
        connection.response.create(model="tool", input="hi")
        seen = []
        for event in connection:
            seen.append(event)
            if event.type == "response.created":
                connection.response.steer(input="use b", previous_response_id=event.response.id)
            if event.type == "response.steer.accepted":
                model.go.set()
            if event.type == "response.steer.pending":
                break
        kinds = [event.type for event in seen]
        # Never cut after a call the client must answer: completed, then pending.
        assert "response.incomplete" not in kinds
        assert kinds.index("response.completed") < kinds.index("response.steer.pending")
        pending = seen[-1]
        assert pending.reason == "waiting_for_required_input"
        assert [stub.model_dump() for stub in pending.required_input] == [
            {"call_id": "call_1", "name": "read_file", "type": "function_call_output"}
        ]
        output = {"type": "function_call_output", "call_id": "call_1", "output": "A"}
        connection.response.create(model="two", previous_response_id="resp_1", input=[output])
        for event in connection:
            if event.type in TERMINAL:
                assert event.type == "response.completed"
                break
    # The queued input comes first in the continuation, then the client's own.
    assert model.inputs[1][-2:] == [
        {"role": "user", "content": "use b"},
        output,
    ]


@pytest.mark.parametrize("continuation", ["fails", "two"])
def test_input_waiting_behind_a_call_is_applied_or_returned_exactly_once(
    served: tuple[Model, str], continuation: str
) -> None:
    # The client's continuation commits the input waiting behind its parent with its
    # response.created; one that fails before (a 500 here) returns it in
    # response.steer.failed, once, instead of dropping it.
    model, base_url = served
    url = base_url.replace("http", "ws", 1) + "/responses"
    events: list[dict[str, Any]] = []
    with connect(url) as socket:

        def until(kind: str) -> dict[str, Any]:
            while True:
                events.append(json.loads(socket.recv(timeout=10)))
                if events[-1]["type"] == kind:
                    return events[-1]

        socket.send(json.dumps({"type": "response.create", "model": "tool", "input": "hi"}))
        until("response.created")
        socket.send(json.dumps({"type": "response.steer", "previous_response_id": "resp_1",
                                "input": "use b"}))  # fmt: skip
        accepted = until("response.steer.accepted")
        model.go.set()
        until("response.steer.pending")
        output = {"type": "function_call_output", "call_id": "call_1", "output": "A"}
        socket.send(json.dumps({"type": "response.create", "model": continuation,
                                "previous_response_id": "resp_1", "input": [output]}))  # fmt: skip
        until("error" if continuation == "fails" else "response.completed")
        # One more turn: anything the continuation still brought arrives before its answer.
        socket.send(json.dumps({"type": "response.create", "model": "two", "input": "again"}))
        until("response.completed")
    returned = [e for e in events if e["type"] == "response.steer.failed"]
    steered = {"role": "user", "content": "use b"}
    # The continuation carried the input (first, then the client's own); nothing after it did.
    assert model.inputs[1][-2:] == [steered, output]
    assert all("use b" not in json.dumps(context) for context in model.inputs[2:])
    if continuation == "fails":
        assert len(returned) == 1
        steer = {"id": accepted["steer"]["id"], "previous_response_id": "resp_1", "input": "use b"}
        assert returned[0]["steer"] == steer
        assert returned[0]["error"]["code"] == "successor_creation_failed"
    else:
        assert returned == []  # committed by the continuation's response.created


def test_input_waiting_behind_an_evicted_call_is_returned_on_the_cache_miss() -> None:
    # The continuation never reaches a handler (its parent was evicted meanwhile): the input
    # it was to commit comes back with the previous_response_not_found.
    model = Model()
    model.go.set()
    app = WebSocketModeMiddleware(
        Starlette(routes=[Route("/v1/responses", model.handle, methods=["POST"])]),
        limits=Limits(max_cached_responses=1),
    )
    events: list[dict[str, Any]] = []
    with (
        serve(app) as base_url,
        connect(base_url.replace("http", "ws", 1) + "/v1/responses") as socket,
    ):

        def until(kind: str) -> dict[str, Any]:
            while True:
                events.append(json.loads(socket.recv(timeout=10)))
                if events[-1]["type"] == kind:
                    return events[-1]

        socket.send(json.dumps({"type": "response.create", "model": "tool", "input": "hi"}))
        until("response.created")
        socket.send(json.dumps({"type": "response.steer", "previous_response_id": "resp_1",
                                "input": "use b"}))  # fmt: skip
        until("response.steer.pending")
        socket.send(json.dumps({"type": "response.create", "model": "two", "input": "other"}))
        until("response.completed")  # resp_2, cached in resp_1's place
        output = {"type": "function_call_output", "call_id": "call_1", "output": "A"}
        socket.send(json.dumps({"type": "response.create", "model": "two",
                                "previous_response_id": "resp_1", "input": [output]}))  # fmt: skip
        assert until("error")["error"]["code"] == "previous_response_not_found"
        socket.send(json.dumps({"type": "response.create", "model": "two", "input": "again"}))
        until("response.completed")
    returned = [e for e in events if e["type"] == "response.steer.failed"]
    assert [(e["steer"]["input"], e["error"]["code"]) for e in returned] == [
        ("use b", "successor_creation_failed")
    ]
    assert all("use b" not in json.dumps(context) for context in model.inputs)


def test_a_handler_may_take_the_input_itself(served: tuple[Model, str]) -> None:
    model, base_url = served
    client = OpenAI(base_url=base_url, api_key="-")
    with client.responses.connect() as connection:
        connection.response.create(model="claim", input="hi")
        for event in connection:
            if event.type == "response.created":
                connection.response.steer(input="faster", previous_response_id=event.response.id)
            if event.type == "response.steer.accepted":
                model.go.set()
            if event.type in TERMINAL:
                break
    assert event.type == "response.completed"
    assert event.response.output_text == "[heard: faster]"
    assert len(model.inputs) == 1  # no successor: the handler applied it


@pytest.mark.parametrize(
    ("model", "returned"), [("successor-refused", True), ("successor-breaks", False)]
)
def test_a_successor_failing_returns_the_input_only_before_it_started(
    served: tuple[Model, str], model: str, returned: bool
) -> None:
    # Its `response.created` is the commit point: before it the input comes back in
    # response.steer.failed (successor_creation_failed); after it the failure is the response's.
    test_model, base_url = served
    client = OpenAI(base_url=base_url, api_key="-")
    seen: list[Any] = []
    with client.responses.connect() as connection:
        connection.response.create(model=model, input="hi")
        for event in connection:
            seen.append(event)
            if event.type == "response.created" and len(seen) == 1:
                connection.response.steer(input="left", previous_response_id=event.response.id)
            if event.type == "response.steer.accepted":
                test_model.go.set()
            if event.type == ("response.steer.failed" if returned else "error"):
                break
        # One more turn: anything the failure still brought arrives before its answer.
        connection.response.create(model="two", input="again")
        for event in connection:
            seen.append(event)
            if event.type == "response.completed":
                break
    accepted = next(event for event in seen if event.type == "response.steer.accepted")
    failed = [event for event in seen if event.type == "response.steer.failed"]
    if returned:
        assert len(failed) == 1
        assert failed[0].error.code == "successor_creation_failed"
        assert failed[0].steer.id == accepted.steer.id
        assert failed[0].steer.input == "left"
    else:
        assert failed == []
        assert "error" in [event.type for event in seen]
        assert any(e.type == "response.created" and e.response.id == "resp_2" for e in seen)


def test_refusals_carry_their_codes(served: tuple[Model, str]) -> None:
    model, base_url = served
    client = OpenAI(base_url=base_url, api_key="-")
    with client.responses.connect() as connection:

        def refusal() -> Any:
            for event in connection:
                if event.type == "response.steer.failed":
                    return event
            raise AssertionError("no refusal")

        connection.response.steer(input="x", previous_response_id="resp_nope")
        assert refusal().error.code == "response_not_found"
        connection.response.create(model="two", input="hi")
        for event in connection:
            if event.type == "response.created":
                break
        bad = [{"type": "message", "role": "assistant", "content": "no"}]
        connection.response.steer(input=bad, previous_response_id="resp_1")  # type: ignore[arg-type]
        failed = refusal()
        assert failed.error.code == "invalid_input"
        assert failed.steer.input == bad
        # The event takes type, previous_response_id and input only: any other field is
        # refused by name, and the input comes back.
        for extra in ({"stream_id": "lane"}, {"model": "two"}, {"foo": 1}):
            connection.send(
                {"type": "response.steer", "previous_response_id": "resp_1", "input": "x", **extra}
            )  # type: ignore[arg-type]
            failed = refusal()
            assert failed.error.code == "invalid_input"
            assert repr(next(iter(extra))) in failed.error.message
            assert failed.steer.input == "x"
        for _ in range(Limits().max_pending_steers + 1):
            connection.response.steer(input="more", previous_response_id="resp_1")
        assert refusal().error.code == "too_many_pending_steers"
        model.go.set()
        for event in connection:
            if event.type == "response.completed":
                break
        connection.response.steer(input="late", previous_response_id="resp_1")
        assert refusal().error.code == "response_already_completed"


def test_steering_can_be_switched_off() -> None:
    model = Model()
    app = WebSocketModeMiddleware(
        Starlette(routes=[Route("/v1/responses", model.handle, methods=["POST"])]),
        steering=False,
    )
    with serve(app) as base_url:
        client = OpenAI(base_url=base_url + "/v1", api_key="-")
        with client.responses.connect() as connection:
            connection.response.create(model="two", input="hi")
            kinds = []
            for event in connection:
                kinds.append(event.type)
                if event.type == "response.created":
                    connection.response.steer(input="x", previous_response_id="resp_1")
                if event.type == "response.steer.failed":
                    assert event.error.code == "steering_not_supported"
                    model.go.set()
                if event.type in TERMINAL:
                    break
    assert "response.steer.failed" in kinds
    assert kinds[-1] == "response.completed"
    assert len(model.inputs) == 1


def test_a_response_compacting_automatically_cannot_be_steered(served: tuple[Model, str]) -> None:
    model, base_url = served
    url = base_url.replace("http", "ws", 1) + "/responses"
    with connect(url) as socket:
        create = {"type": "response.create", "model": "two", "input": "hi"}
        socket.send(json.dumps({**create, "context_management": [{"type": "compaction"}]}))
        refused = None
        while True:
            event = json.loads(socket.recv(timeout=10))
            if event["type"] == "response.created":
                socket.send(json.dumps({"type": "response.steer", "previous_response_id":
                                        event["response"]["id"], "input": "x"}))  # fmt: skip
            if event["type"] == "response.steer.failed":
                refused = event
                model.go.set()
            if event["type"] in TERMINAL:
                break
    assert refused is not None
    assert refused["error"]["code"] == "steering_not_supported"
    assert "compaction" in refused["error"]["message"]
    assert event["type"] == "response.completed"
    assert len(model.inputs) == 1


def test_input_waiting_behind_responses_is_bounded() -> None:
    steering = Steering(enabled=True)
    create = CreateEvent(fields={"model": "m"}, items=Items([]), input_text=None,
                         input_sent=True, previous_response_id=None, stream_id=None,
                         generate=True, tools=None)  # fmt: skip
    call = [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]

    async def waiting(number: int) -> None:
        inbox = SteerInbox()
        inbox.put(Steer(id=f"steer_{number}", target=f"resp_{number}", input="x", items=[]))
        outcome = Outcome(inbox, f"resp_{number}", call)

        async def send(event: dict[str, Any]) -> None:
            assert event["type"] == "response.steer.pending"

        assert await steering.follow(create, outcome, send) is None

    async def main() -> None:
        for number in range(MAX_WAITING_RESPONSES + 5):
            await waiting(number)

    asyncio.run(main())
    assert len(steering.pending) == MAX_WAITING_RESPONSES
    assert "resp_0" not in steering.pending  # the oldest went first
    assert f"resp_{MAX_WAITING_RESPONSES + 4}" in steering.pending


def test_steering_input_is_bounded_in_bytes_too() -> None:
    steering = Steering(enabled=True, limits=Limits(max_steer_bytes=1_000_000))
    inbox = SteerInbox()
    half = "x" * 490_000
    for _ in range(2):
        accepted = steering.accept(
            SteerEvent("resp_1", half), inbox, None, streaming=True, known=False
        )
        assert isinstance(accepted, Steer)
    refused = steering.accept(
        SteerEvent("resp_1", "y" * 64_000), inbox, None, streaming=True, known=False
    )
    assert isinstance(refused, dict)
    assert refused["error"]["code"] == "too_many_pending_steers"
    assert len(inbox.steers) == 2


_CALLS = [
    {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
    {"type": "custom_tool_call", "call_id": "c2", "name": "patch", "input": ""},
    {"type": "computer_call", "call_id": "c3", "action": {}},
    {"type": "shell_call", "call_id": "c4", "action": {}},
    {"type": "apply_patch_call", "call_id": "c5", "operation": {}},
    {"type": "tool_search_call", "call_id": "c6", "execution": "client", "arguments": {}},
    {"type": "tool_search_call", "call_id": "c7", "execution": "server", "arguments": {}},
    {"type": "mcp_approval_request", "id": "mcpr_1", "name": "x", "arguments": "{}"},
]


@pytest.mark.parametrize("lane", [None, "a"])
def test_every_steer_event_is_the_sdks_server_event(lane: str | None) -> None:
    """`response.steer.accepted`, `.pending` (a stub for each call the client answers) and
    `.failed` (each code) validate as the SDK's server-event union types them."""
    server_events = pytest.importorskip("openai.types.responses.responses_server_event")
    from pydantic import TypeAdapter

    union: TypeAdapter[Any] = TypeAdapter(server_events.ResponsesServerEvent)
    steer = Steer(id="steer_" + "0" * 32, target="resp_1", input="Go on.", items=[])
    stubs = required_input(_CALLS)
    # A server-run tool search is no client call: seven stubs for eight calls.
    assert [stub["type"] for stub in stubs] == [
        "function_call_output",
        "custom_tool_call_output",
        "computer_call_output",
        "shell_call_output",
        "apply_patch_call_output",
        "tool_search_output",
        "mcp_approval_response",
    ]
    events = [accepted_event(steer, lane, 3), pending_event(steer, stubs, lane)]
    events += [not_committed(steer, code, lane) for code in STEER_MESSAGES]
    for event in events:
        parsed = union.validate_python(event)
        assert parsed.type == event["type"]
        assert getattr(parsed, "stream_id", None) == lane
