"""`response.interrupt` over a real socket (uvicorn on loopback, a `websockets` client), for a
handler that knows nothing of it: the response ends at once with its open item interrupted and
`response.incomplete` (reason `interrupted`), the handler hears `http.disconnect` and is
cancelled, the interrupted response is continued on the same socket (and from the store on
another), each refusal carries its code, pending steering input comes back, and a race with
the response's own end leaves the socket working."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from websockets.sync.client import ClientConnection, connect

from tests.servers import serve
from ws_mode import ConfigError, MemoryStore, WebSocketModeMiddleware
from ws_mode._asgi import Receive, Scope, Send

RECV = 10.0
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}
USAGE = {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}


def _message(item_id: str, text: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {"type": "message", "id": item_id, "role": "assistant", "status": "completed",
            "content": [part]}  # fmt: skip


class Scripted:
    """A raw ASGI Responses handler, its answer chosen by the request's `model`:

    - `slow`: `response.created`, `response.in_progress` with usage so far, a finished message
      `msg_done`, then `msg_open` streaming a delta every 20 ms for 20 s, then completed;
    - `short`: like `slow` with 5 deltas;
    - `quick`: created, a message and completed at once, after `gap` milliseconds (metadata);
    - `fail`: created, then an error event.

    It listens for `http.disconnect` as a server that stops generating would; `heard` holds
    what it saw (`disconnect`, `cancelled`), `inputs` each request's input."""

    def __init__(self) -> None:
        self.inputs: list[Any] = []
        self.heard: list[str] = []
        self.number = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(body)
        self.inputs.append(request["input"])
        self.number += 1
        listener = asyncio.create_task(self._listen(receive))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
        try:
            await self._answer(request, send)
        except asyncio.CancelledError:
            self.heard.append("cancelled")
            raise
        finally:
            listener.cancel()

    async def _listen(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.heard.append("disconnect")

    async def _answer(self, request: dict[str, Any], send: Send) -> None:
        model = request["model"]
        response = {"id": f"resp_{model}_{self.number}", "object": "response", "model": model,
                    "status": "in_progress", "output": [], "usage": None}  # fmt: skip
        sequence = iter(range(10_000))

        async def emit(event: dict[str, Any]) -> None:
            event = {**event, "sequence_number": next(sequence)}
            data = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
            await send({"type": "http.response.body", "body": data, "more_body": True})

        await emit({"type": "response.created", "response": response})
        if model == "fail":
            await emit({"type": "error", "code": "server_error", "message": "no", "param": None})
            await send({"type": "http.response.body", "body": b""})
            return
        if model == "quick":
            await asyncio.sleep(int(request["metadata"]["gap"]) / 1000)
            item = _message("msg_quick", "hi")
            await emit({"type": "response.output_item.done", "output_index": 0, "item": item})
            done = {**response, "status": "completed", "output": [item], "usage": USAGE}
            await emit({"type": "response.completed", "response": done})
            await send({"type": "http.response.body", "body": b""})
            return
        await emit({"type": "response.in_progress", "response": {**response, "usage": USAGE}})
        finished = _message("msg_done", "first")
        await emit({"type": "response.output_item.added", "output_index": 0,
                    "item": {**finished, "status": "in_progress", "content": []}})  # fmt: skip
        await emit({"type": "response.output_item.done", "output_index": 0, "item": finished})
        await emit({"type": "response.output_item.added", "output_index": 1,
                    "item": {"type": "message", "id": "msg_open", "role": "assistant",
                             "status": "in_progress", "content": []}})  # fmt: skip
        where = {"item_id": "msg_open", "output_index": 1, "content_index": 0}
        deltas = 1000 if model == "slow" else 5
        for _ in range(deltas):
            await asyncio.sleep(0.02)
            await emit({"type": "response.output_text.delta", **where, "delta": "x"})
        second = _message("msg_open", "x" * deltas)
        await emit({"type": "response.output_item.done", "output_index": 1, "item": second})
        done = {**response, "status": "completed", "output": [finished, second], "usage": USAGE}
        await emit({"type": "response.completed", "response": done})
        await send({"type": "http.response.body", "body": b""})


@pytest.fixture
def scripted() -> Iterator[tuple[Scripted, str]]:
    handler = Scripted()
    with serve(WebSocketModeMiddleware(handler)) as base:
        yield handler, base.replace("http", "ws") + "/v1/responses"


def receive(ws: ClientConnection) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(ws.recv(RECV))
    return event


def read_until(ws: ClientConnection, kinds: set[str], seen: list[dict[str, Any]]) -> dict[str, Any]:
    while True:
        event = receive(ws)
        seen.append(event)
        if event["type"] in kinds:
            return event


def create(model: str, **fields: Any) -> str:
    return json.dumps({"type": "response.create", "model": model, "input": "hi", **fields})


def interrupt(response_id: Any, **fields: Any) -> str:
    return json.dumps({"type": "response.interrupt", "response_id": response_id,
                       "mode": "discard_partial_items", **fields})  # fmt: skip


def start(ws: ClientConnection, model: str, **fields: Any) -> tuple[str, list[dict[str, Any]]]:
    """Send a create and read until its open message streams: its id and the events read."""
    ws.send(create(model, **fields))
    seen: list[dict[str, Any]] = []
    read_until(ws, {"response.output_text.delta"}, seen)
    return str(seen[0]["response"]["id"]), seen


def still_works(ws: ClientConnection) -> list[dict[str, Any]]:
    """A warm-up completes: the events up to its end (what came before it included)."""
    ws.send(json.dumps({"type": "response.create", "input": "again", "generate": False}))
    seen: list[dict[str, Any]] = []
    while True:
        event = read_until(ws, {"response.completed"}, seen)
        if not event["response"]["output"]:  # the warm-up's
            return seen


def wait_for(condition: Any) -> None:
    # A deadline that catches a hang, not a speed.
    deadline = time.monotonic() + RECV
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


@pytest.mark.parametrize("lane", [None, "main"])
def test_an_interrupt_ends_the_response_at_once_with_its_open_item_interrupted(
    scripted: tuple[Scripted, str], lane: str | None
) -> None:
    handler, url = scripted
    fields = {"stream_id": lane} if lane else {}
    with connect(url) as ws:
        target, seen = start(ws, "slow", **fields)
        ws.send(interrupt(target))
        after: list[dict[str, Any]] = []
        read_until(ws, TERMINAL, after)
        later = still_works(ws)
    assert [event["type"] for event in after] == [
        "response.interrupt.accepted",
        "response.output_item.interrupted",
        "response.incomplete",
    ]
    accepted, interrupted, terminal = after
    assert accepted["response_id"] == target
    assert (interrupted["response_id"], interrupted["item_id"], interrupted["output_index"]) == (
        target, "msg_open", 1,
    )  # fmt: skip
    response = terminal["response"]
    assert (response["id"], response["status"]) == (target, "incomplete")
    assert response["incomplete_details"] == {"reason": "interrupted"}
    assert response["output"] == [_message("msg_done", "first")]  # the open item is dropped
    assert response["usage"] == USAGE  # the latest the handler reported
    numbers = [event["sequence_number"] for event in seen + after]
    assert numbers == sorted(set(numbers))
    for event in seen + after:
        assert event.get("stream_id") == lane
    assert not any(event["type"] == "response.completed" and event["response"]["id"] == target
                   for event in later)  # fmt: skip
    # The handler heard the disconnect, then was cancelled.
    wait_for(lambda: handler.heard == ["disconnect", "cancelled"])


def test_the_interrupted_response_is_continued_on_the_same_socket(
    scripted: tuple[Scripted, str],
) -> None:
    handler, url = scripted
    with connect(url) as ws:
        target, _ = start(ws, "slow")
        ws.send(interrupt(target))
        read_until(ws, TERMINAL, [])
        ws.send(create("quick", previous_response_id=target, input="go on", metadata={"gap": "0"}))
        seen: list[dict[str, Any]] = []
        end = read_until(ws, TERMINAL, seen)
    assert end["type"] == "response.completed"
    assert seen[0]["response"]["previous_response_id"] == target
    # Its input, the finished item, the new input: not the item that was open.
    assert handler.inputs[1] == [
        {"role": "user", "content": "hi"},
        _message("msg_done", "first"),
        {"role": "user", "content": "go on"},
    ]


def test_an_interrupted_response_is_stored_and_continued_from_another_socket() -> None:
    handler = Scripted()
    app = WebSocketModeMiddleware(handler, store=MemoryStore(), shared_store=True)
    with serve(app) as base:
        url = base.replace("http", "ws") + "/v1/responses"
        with connect(url) as ws:
            target, _ = start(ws, "slow")
            ws.send(interrupt(target))
            read_until(ws, TERMINAL, [])
        with connect(url) as ws:
            ws.send(create("quick", previous_response_id=target, input="go on",
                           metadata={"gap": "0"}))  # fmt: skip
            end = read_until(ws, TERMINAL, [])
    assert end["type"] == "response.completed", end
    assert handler.inputs[1][1] == _message("msg_done", "first")


def test_interrupts_of_responses_not_running_fail_with_their_code(
    scripted: tuple[Scripted, str],
) -> None:
    _, url = scripted
    with connect(url) as ws:
        ws.send(interrupt("resp_never"))
        unknown = receive(ws)
        ws.send(create("quick", metadata={"gap": "0"}, stream_id="side"))
        completed = read_until(ws, TERMINAL, [])["response"]["id"]
        ws.send(interrupt(completed))
        finished = receive(ws)
        ws.send(create("fail"))
        seen: list[dict[str, Any]] = []
        failed = read_until(ws, TERMINAL, seen)
        ws.send(interrupt(seen[0]["response"]["id"]))
        ended = receive(ws)
        still_works(ws)
    assert unknown == {
        "type": "response.interrupt.failed", "sequence_number": 0, "status": 400,
        "response_id": "resp_never",
        "error": {"type": "invalid_request_error", "code": "response_not_found",
                  "message": "Response with id 'resp_never' is not running on this connection.",
                  "param": "response_id"},
    }  # fmt: skip
    assert finished["type"] == "response.interrupt.failed"
    assert (finished["error"]["code"], finished["stream_id"]) == ("response_already_completed",
                                                                  "side")  # fmt: skip
    assert failed["type"] == "error"
    assert ended["error"]["code"] == "response_already_completed"  # it failed: it has ended


@pytest.mark.parametrize(
    ("frame", "code", "param"),
    [
        ({"type": "response.interrupt"}, "missing_required_parameter", "response_id"),
        ({"type": "response.interrupt", "response_id": 7}, "invalid_type", "response_id"),
    ],
)
def test_a_malformed_interrupt_gets_an_error_event(
    scripted: tuple[Scripted, str], frame: dict[str, Any], code: str, param: str
) -> None:
    _, url = scripted
    with connect(url) as ws:
        ws.send(json.dumps(frame))
        error = receive(ws)
        still_works(ws)
    assert error["type"] == "error"
    assert (error["status"], error["error"]["code"], error["error"]["param"]) == (400, code, param)


def test_an_unknown_mode_gets_an_error_and_the_response_runs_on(
    scripted: tuple[Scripted, str],
) -> None:
    handler, url = scripted
    with connect(url) as ws:
        target, _ = start(ws, "short", stream_id="main")
        ws.send(interrupt(target, mode="keep_everything"))
        seen: list[dict[str, Any]] = []
        end = read_until(ws, {"response.completed", "response.incomplete"}, seen)
    errors = [event for event in seen if event["type"] == "error"]
    assert len(errors) == 1
    assert errors[0]["error"]["type"] == "invalid_request_error"
    assert (errors[0]["error"]["code"], errors[0]["error"]["param"]) == ("invalid_value", "mode")
    assert "keep_everything" in errors[0]["error"]["message"]
    assert end["type"] == "response.completed"
    assert end["response"]["id"] == target
    assert handler.heard == []


def test_with_interrupts_off_the_refusal_says_so_and_the_response_runs_on() -> None:
    handler = Scripted()
    app = WebSocketModeMiddleware(handler, interrupts=False)
    with serve(app) as base, connect(base.replace("http", "ws") + "/v1/responses") as ws:
        target, _ = start(ws, "short", stream_id="main")
        ws.send(interrupt(target))
        seen: list[dict[str, Any]] = []
        end = read_until(ws, {"response.completed", "response.incomplete"}, seen)
    refusals = [event for event in seen if event["type"] == "response.interrupt.failed"]
    assert [event["error"]["code"] for event in refusals] == ["interrupt_not_supported"]
    assert refusals[0]["stream_id"] == "main"
    assert end["type"] == "response.completed"


def test_an_interrupt_returns_pending_steering_input_and_starts_no_successor(
    scripted: tuple[Scripted, str],
) -> None:
    handler, url = scripted
    with connect(url) as ws:
        target, _ = start(ws, "slow")
        ws.send(json.dumps({"type": "response.steer", "previous_response_id": target,
                            "input": "turn left"}))  # fmt: skip
        seen: list[dict[str, Any]] = []
        accepted = read_until(ws, {"response.steer.accepted"}, seen)
        ws.send(interrupt(target))
        read_until(ws, {"response.incomplete"}, seen)
        later = still_works(ws)
    returned = [event for event in later if event["type"].startswith("response.steer")]
    assert len(returned) == 1
    assert returned[0]["type"] == "response.steer.failed"
    assert returned[0]["error"]["code"] == "response_interrupted"
    steer = {"id": accepted["steer"]["id"], "previous_response_id": target, "input": "turn left"}
    assert returned[0]["steer"] == steer
    # Nothing but the warm-up started: the handler was called once.
    assert [event["type"] for event in later if event["type"] == "response.created"] == [
        "response.created"
    ]
    assert len(handler.inputs) == 1


def test_an_interrupt_racing_the_response_end_leaves_one_outcome_and_the_socket_working(
    scripted: tuple[Scripted, str],
) -> None:
    _, url = scripted
    outcomes = set()
    with connect(url) as ws:
        for gap in [0, 0, 1, 1, 2, 2, 3, 5]:
            ws.send(create("quick", metadata={"gap": str(gap)}))
            seen: list[dict[str, Any]] = []
            target = read_until(ws, {"response.created"}, seen)["response"]["id"]
            ws.send(interrupt(target))
            # The response's terminal event and the interrupt's answer, in either order.
            while not (
                any(event["type"] in TERMINAL for event in seen)
                and any(event["type"].startswith("response.interrupt.") for event in seen)
            ):
                seen.append(receive(ws))
            kinds = [event["type"] for event in seen]
            if "response.interrupt.accepted" in kinds:
                outcomes.add("interrupted")
                assert kinds[-2:] == ["response.interrupt.accepted", "response.incomplete"]
                assert seen[-1]["response"]["incomplete_details"] == {"reason": "interrupted"}
            else:
                outcomes.add("completed")
                assert kinds[-2:] == ["response.completed", "response.interrupt.failed"]
                assert seen[-1]["error"]["code"] == "response_already_completed"
            assert kinds.count("response.completed") + kinds.count("response.incomplete") == 1
        still_works(ws)
    assert outcomes  # which won each time is the server's timing, not the test's to fix


def test_the_switch_must_be_a_boolean() -> None:
    with pytest.raises(ConfigError, match="interrupts must be True or False"):
        WebSocketModeMiddleware(Scripted(), interrupts="yes")  # type: ignore[arg-type]


def test_the_turn_s_span_says_it_was_interrupted() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = WebSocketModeMiddleware(Scripted(), tracer_provider=provider)
    with serve(app) as base, connect(base.replace("http", "ws") + "/v1/responses") as ws:
        target, _ = start(ws, "slow")
        ws.send(interrupt(target))
        read_until(ws, TERMINAL, [])
        still_works(ws)
    wait_for(lambda: sum(s.name == "response.create" for s in exporter.get_finished_spans()) == 2)
    provider.shutdown()
    spans = [span for span in exporter.get_finished_spans() if span.name == "response.create"]
    flags = [(span.attributes or {}).get("ws_mode.interrupted") for span in spans]
    assert flags == [True, None]  # the interrupted turn, then the warm-up


@pytest.mark.parametrize("lane", [None, "main"])
def test_one_numbering_for_the_handlers_events_a_steer_and_the_interrupt(
    scripted: tuple[Scripted, str], lane: str | None
) -> None:
    """The events ws_mode adds to a response (the steer's acceptance, the interrupt's, the
    steering input returned after it) and the handler's own share one numbering: strictly
    increasing, whatever came between."""
    _, url = scripted
    fields = {"stream_id": lane} if lane is not None else {}
    with connect(url) as ws:
        target, seen = start(ws, "slow", **fields)
        ws.send(json.dumps({"type": "response.steer", "previous_response_id": target,
                            "input": "turn left"}))  # fmt: skip
        read_until(ws, {"response.steer.accepted"}, seen)
        for _ in range(3):  # the handler streams on after the acceptance
            read_until(ws, {"response.output_text.delta"}, seen)
        ws.send(interrupt(target))
        read_until(ws, {"response.incomplete"}, seen)
        read_until(ws, {"response.steer.failed"}, seen)  # its input, returned
    numbers = [event["sequence_number"] for event in seen]
    kinds = [event["type"] for event in seen]
    assert {"response.steer.accepted", "response.interrupt.accepted"} <= set(kinds)
    assert all(a < b for a, b in itertools.pairwise(numbers)), list(
        zip(kinds, numbers, strict=True)
    )
    assert numbers[0] == 0
