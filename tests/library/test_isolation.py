"""Isolation: nothing of one socket is reachable from another, and limits hold across lanes
and reconnects.

The app runs under real uvicorn (a background thread of this process, so the tests can count
what the handler runs at once and look at the middlewares). Several middlewares sit in front
of the same app, one per socket path, each with its own limits; the reference server answers
the conversations (it is deterministic: the same context always gives the same output), a
probe handler sleeps or streams on request and records how many of its calls overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from openai.types.responses.responses_server_event import ResponseWsError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.types import ASGIApp
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.servers import serve
from ws_mode import Limits, WebSocketModeMiddleware
from ws_mode._connection import Connection
from ws_mode.toolkit.reference import ReferenceConfig, create_app, script

CONFIG = ReferenceConfig(tool_calls=3, answer_tokens=8)
TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look something up.",
    "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}},
    "strict": False,
}
TERMINAL = frozenset(
    {
        "response.completed",
        "response.incomplete",
        "response.failed",
        "error",
        "response.steer.failed",
    }
)
RECV_TIMEOUT = 10.0

#: Socket path prefix -> (handler, limits). "ref" is the reference server, "probe" the probe.
MOUNTS: dict[str, tuple[str, Limits]] = {
    "": ("ref", Limits()),
    "/tiny": ("ref", Limits(max_cached_responses=3)),
    "/conc": ("probe", Limits(max_in_flight=3)),
    "/queue": ("probe", Limits(max_in_flight=1, max_queued=2)),
    "/streams": ("probe", Limits(max_streams=3)),
    "/conns": ("probe", Limits(max_connections=3)),
    "/timeout": ("probe", Limits(max_turn_seconds=0.3)),
    "/smallcache": ("ref", Limits(max_cached_bytes=16 * 1024)),
}


class Probe:
    """A handler that sleeps (`model: "sleep"`, `metadata.seconds`) or streams
    (`model: "stream"`, `metadata.deltas`), and counts, per `metadata.tag`, how many of its
    calls run at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.calls: dict[str, int] = {}

    def enter(self, tag: str) -> None:
        with self.lock:
            self.calls[tag] = self.calls.get(tag, 0) + 1
            self.running[tag] = self.running.get(tag, 0) + 1
            self.peak[tag] = max(self.peak.get(tag, 0), self.running[tag])

    def leave(self, tag: str) -> None:
        with self.lock:
            self.running[tag] -= 1

    async def respond(self, request: Request) -> Response:
        body = await request.json()
        meta = body.get("metadata") or {}
        tag = str(meta.get("tag", ""))
        if body.get("model") == "stream":
            return StreamingResponse(
                self.stream(tag, int(meta.get("deltas", "50"))), media_type="text/event-stream"
            )
        self.enter(tag)
        try:
            await asyncio.sleep(float(meta.get("seconds", "0")))
        finally:
            self.leave(tag)
        return JSONResponse(response_object("completed", [message("ok")]))

    async def stream(self, tag: str, deltas: int) -> AsyncIterator[str]:
        self.enter(tag)
        try:
            pending = response_object("in_progress", [])
            yield sse({"type": "response.created", "response": pending})
            for _ in range(deltas):
                await asyncio.sleep(0.02)
                yield sse({"type": "response.output_text.delta", "delta": "x"})
            done = response_object("completed", [message("x" * deltas)])
            done["id"] = pending["id"]
            yield sse({"type": "response.completed", "response": done})
        finally:
            self.leave(tag)


def response_object(status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": f"resp_{time.monotonic_ns()}",
        "object": "response",
        "status": status,
        "output": output,
    }


def message(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


@dataclass
class Live:
    base_url: str
    probe: Probe
    middlewares: dict[str, WebSocketModeMiddleware]

    def url(self, prefix: str = "") -> str:
        return self.base_url.replace("http", "ws", 1) + prefix + "/v1/responses"

    @contextlib.contextmanager
    def socket(self, prefix: str = "") -> Iterator[Client]:
        ws = connect(self.url(prefix), open_timeout=10, close_timeout=2, max_size=None)
        with ws:
            yield Client(ws)

    def connections(self, prefix: str) -> list[Connection]:
        return list(self.middlewares[prefix]._open)


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    probe = Probe()
    inner = Starlette(
        routes=[
            Route("/probe", probe.respond, methods=["POST"]),
            Mount("", create_app(CONFIG)),
        ]
    )
    app: ASGIApp = inner
    middlewares: dict[str, WebSocketModeMiddleware] = {}
    for prefix, (handler, limits) in MOUNTS.items():
        app = middlewares[prefix] = WebSocketModeMiddleware(
            app,
            path=prefix + "/v1/responses",
            handler_path="/v1/responses" if handler == "ref" else "/probe",
            limits=limits,
        )
    with serve(app) as base_url:
        yield Live(base_url, probe, middlewares)


class Client:
    """A plain websockets connection speaking JSON frames, every receive with a deadline."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    def send(self, **event: Any) -> None:
        self.ws.send(json.dumps(event))

    def vanish(self) -> None:
        """Leave without a close frame."""
        with contextlib.suppress(OSError):
            self.ws.socket.shutdown(socket.SHUT_RDWR)
        self.ws.socket.close()

    def create(self, **fields: Any) -> None:
        self.send(type="response.create", **fields)

    def recv(self) -> dict[str, Any]:
        frame = self.ws.recv(timeout=RECV_TIMEOUT)
        assert isinstance(frame, str)
        event: dict[str, Any] = json.loads(frame)
        return event

    def answers(self, count: int = 1) -> list[dict[str, Any]]:
        """The next `count` terminal events (errors, steer failures included)."""
        found: list[dict[str, Any]] = []
        while len(found) < count:
            event = self.recv()
            if event["type"] in TERMINAL:
                found.append(event)
        return found

    def answer(self) -> dict[str, Any]:
        return self.answers(1)[0]

    def completed(self, **fields: Any) -> dict[str, Any]:
        self.create(**fields)
        event = self.answer()
        assert event["type"] == "response.completed", event
        response: dict[str, Any] = event["response"]
        return response


def expect_error(
    event: dict[str, Any], status: int, code: str, param: str | None, stream_id: str | None
) -> None:
    error = ResponseWsError.model_validate(event)
    assert (error.status, error.error.code, error.error.param) == (status, code, param), event
    assert error.stream_id == stream_id, event


def expect_steer_failed(event: dict[str, Any], code: str, stream_id: str | None) -> None:
    assert event["type"] == "response.steer.failed", event
    assert event["error"]["code"] == code, event
    assert event.get("stream_id") == stream_id, event


def call_output(response: dict[str, Any], output: str = "42") -> dict[str, Any]:
    call = response["output"][0]
    assert call["type"] == "function_call", response
    return {"type": "function_call_output", "call_id": call["call_id"], "output": output}


# ----------------------------------------------------------------------------- ids and state


@pytest.mark.parametrize("home", [None, "main"])
def test_ids_never_resolve_on_another_connection(live: Live, home: str | None) -> None:
    lane = {"stream_id": home} if home else {}
    with live.socket() as a, live.socket() as b:
        generated = a.completed(input="Hi", tools=[TOOL], **lane)
        warmed = a.completed(input="Hi", tools=[TOOL], generate=False, **lane)
        for known in (generated, warmed):
            # As a continuation on any lane of B, a fork, or a steer: unknown there.
            for stream_id in (None, "main", "fork"):
                on = {"stream_id": stream_id} if stream_id else {}
                b.create(previous_response_id=known["id"], input="More", tools=[TOOL], **on)
                expect_error(
                    b.answer(),
                    400,
                    "previous_response_not_found",
                    "previous_response_id",
                    stream_id,
                )
            b.send(type="response.steer", previous_response_id=known["id"], input="Go on")
            expect_steer_failed(b.answer(), "response_not_found", None)
        # On A both still resolve, and a steer finds them (on their lane), finished.
        a.send(type="response.steer", previous_response_id=generated["id"], input="Go on")
        expect_steer_failed(a.answer(), "response_already_completed", home)
        follow = a.completed(
            previous_response_id=generated["id"], input=[call_output(generated)], tools=[TOOL]
        )
        assert follow["previous_response_id"] == generated["id"]
        warm_follow = a.completed(previous_response_id=warmed["id"], input="Go", tools=[TOOL])
        assert warm_follow["previous_response_id"] == warmed["id"]
        # B is unharmed by the refusals.
        b.completed(input="Hi", tools=[TOOL])


def test_an_active_response_is_not_reachable_from_another_connection(live: Live) -> None:
    tag = "active"
    with live.socket("/conc") as a, live.socket("/conc") as b:
        a.create(model="stream", stream_id="s", metadata={"tag": tag, "deltas": "40"})
        created = a.recv()
        assert created["type"] == "response.created", created
        active = created["response"]["id"]
        b.send(type="response.steer", previous_response_id=active, input="Go on")
        expect_steer_failed(b.answer(), "response_not_found", None)
        b.create(model="sleep", previous_response_id=active, input="More", metadata={"tag": tag})
        expect_error(b.answer(), 400, "previous_response_not_found", "previous_response_id", None)
        # On its own connection the active response is found and steered: it ends at an
        # output boundary (or had just finished), and a successor continues it with the input.
        a.send(type="response.steer", previous_response_id=active, input="Go on")
        accepted = a.recv()
        while accepted["type"] not in ("response.steer.accepted", *TERMINAL):
            accepted = a.recv()
        assert accepted["type"] == "response.steer.accepted", accepted
        assert accepted["steer"]["previous_response_id"] == active
        assert accepted["stream_id"] == "s"
        ended = a.answer()
        assert ended["response"]["id"] == active
        if ended["type"] == "response.incomplete":
            assert ended["response"]["incomplete_details"] == {"reason": "steered"}
        else:
            assert ended["type"] == "response.completed", ended
        successor = a.answer()
        assert successor["type"] == "response.completed", successor
        assert successor["response"]["previous_response_id"] == active
        assert successor["stream_id"] == "s"


def run_chain(client: Client, instructions: str) -> list[dict[str, Any]]:
    """One tool loop of the reference model to its final answer."""
    responses = [client.completed(input="Plan a trip.", tools=[TOOL], instructions=instructions)]
    while responses[-1]["output"][0]["type"] == "function_call":
        responses.append(
            client.completed(
                previous_response_id=responses[-1]["id"],
                input=[call_output(responses[-1], f"result {len(responses)}")],
                tools=[TOOL],
                instructions=instructions,
            )
        )
    return responses


def test_identical_traffic_gets_independent_caches(live: Live) -> None:
    with live.socket() as a, live.socket() as b:
        on_a = run_chain(a, "Be brief.")
        on_b = run_chain(b, "Be brief.")
        # The same context gives the same answers (the reference model is deterministic) ...
        assert [r["output"] for r in on_a] == [r["output"] for r in on_b]
        assert len(on_a) == CONFIG.tool_calls + 1
        # ... under different ids, each known to its own connection's cache only.
        ids_a, ids_b = {r["id"] for r in on_a}, {r["id"] for r in on_b}
        assert not ids_a & ids_b
        caches = [
            frozenset(connection.cache._entries)
            for connection in live.connections("")
            if set(connection.cache._entries) & (ids_a | ids_b)
        ]
        assert sorted(caches, key=sorted) == sorted([ids_a, ids_b], key=sorted)
        # Continuing the other connection's ids fails, on each side.
        for client, foreign in ((a, on_b), (b, on_a)):
            for response in foreign:
                client.create(previous_response_id=response["id"], input="More", tools=[TOOL])
                expect_error(
                    client.answer(),
                    400,
                    "previous_response_not_found",
                    "previous_response_id",
                    None,
                )
    # A connection that closed took its cache along; another one never had it.
    with live.socket() as c:
        c.create(previous_response_id=on_a[0]["id"], input="More", tools=[TOOL])
        expect_error(c.answer(), 400, "previous_response_not_found", "previous_response_id", None)


def test_an_id_evicted_on_one_connection_is_not_found_on_another(live: Live) -> None:
    # /tiny keeps three responses per connection.
    with live.socket("/tiny") as a, live.socket("/tiny") as b:
        kept_on_b = b.completed(input="B first", tools=[TOOL])
        on_a = [a.completed(input=f"A {index}", tools=[TOOL]) for index in range(4)]
        # A's oldest is evicted on A ...
        a.create(previous_response_id=on_a[0]["id"], input=[call_output(on_a[0])], tools=[TOOL])
        expect_error(a.answer(), 400, "previous_response_not_found", "previous_response_id", None)
        # ... and does not turn up on B, whose own cache A's evictions did not touch.
        b.create(previous_response_id=on_a[0]["id"], input=[call_output(on_a[0])], tools=[TOOL])
        expect_error(b.answer(), 400, "previous_response_not_found", "previous_response_id", None)
        follow = b.completed(
            previous_response_id=kept_on_b["id"], input=[call_output(kept_on_b)], tools=[TOOL]
        )
        expected = script(
            [{"role": "user", "content": "B first"}, *kept_on_b["output"], call_output(kept_on_b)],
            None,
            [TOOL],
            CONFIG,
        )
        assert follow["output"] == expected
        # A's newest still resolves on A only.
        a.completed(previous_response_id=on_a[3]["id"], input=[call_output(on_a[3])], tools=[TOOL])


# ----------------------------------------------------------------------------- limits


def wait_until(predicate: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_max_connections_counts_open_sockets_and_frees_every_slot(live: Live) -> None:
    middleware = live.middlewares["/conns"]  # max_connections=3
    assert wait_until(lambda: middleware.connections == 0)
    tag = {"model": "sleep", "metadata": {"tag": "conns"}, "input": "x"}
    # Connecting and leaving over and over (politely or not) leaks no slot.
    for round_ in range(10):
        with contextlib.ExitStack() as stack:
            clients = [stack.enter_context(live.socket("/conns")) for _ in range(3)]
            with pytest.raises(InvalidStatus) as refused, live.socket("/conns"):
                pass
            assert refused.value.response.status_code == 426
            body = json.loads(refused.value.response.body)
            assert body["error"]["code"] == "websocket_connection_limit_reached"
            for client in clients:
                client.completed(**tag)
            if round_ % 2:
                for client in clients:
                    client.vanish()
        assert wait_until(lambda: middleware.connections == 0), middleware.connections
    # A refused upgrade never took a slot either.
    with contextlib.ExitStack() as stack:
        for _ in range(3):
            stack.enter_context(live.socket("/conns")).completed(**tag)
        assert middleware.connections == 3


def test_max_streams_counts_distinct_stream_ids_over_the_connection_life(live: Live) -> None:
    tag = {"model": "sleep", "metadata": {"tag": "streams"}, "input": "x"}
    with live.socket("/streams") as client:  # max_streams=3
        for lane in ("s1", "s2", "s3"):
            client.completed(stream_id=lane, **tag)
        # Every lane is idle now; they still count.
        client.create(stream_id="s4", **tag)
        expect_error(client.answer(), 400, "websocket_stream_limit_reached", "stream_id", "s4")
        # The lanes it has keep working, and so does the default lane (never counted).
        client.completed(stream_id="s1", **tag)
        client.completed(**tag)
        client.create(stream_id="s5", **tag)
        expect_error(client.answer(), 400, "websocket_stream_limit_reached", "stream_id", "s5")


def test_max_in_flight_bounds_concurrency_across_lanes(live: Live) -> None:
    tag = "in-flight"
    with live.socket("/conc") as client:  # max_in_flight=3
        for lane in range(8):
            on = {"stream_id": f"l{lane}"} if lane else {}
            client.create(model="sleep", input="x", metadata={"tag": tag, "seconds": "0.2"}, **on)
        events = client.answers(8)
    assert {event["type"] for event in events} == {"response.completed"}
    assert live.probe.calls[tag] == 8
    assert live.probe.peak[tag] == 3  # reached, and never passed


def test_max_in_flight_is_per_connection(live: Live) -> None:
    tag = "in-flight-two"
    with live.socket("/conc") as a, live.socket("/conc") as b:
        for client in (a, b):
            for lane in range(5):
                client.create(
                    model="sleep",
                    input="x",
                    stream_id=f"l{lane}",
                    metadata={"tag": tag, "seconds": "0.3"},
                )
        events = a.answers(5) + b.answers(5)
    assert {event["type"] for event in events} == {"response.completed"}
    assert live.probe.peak[tag] == 6


def test_a_lane_never_runs_two_requests_at_once(live: Live) -> None:
    tag = "fifo"
    with live.socket("/conc") as client:
        for _ in range(4):
            client.create(
                model="sleep", input="x", stream_id="one", metadata={"tag": tag, "seconds": "0.1"}
            )
        assert {event["type"] for event in client.answers(4)} == {"response.completed"}
    assert live.probe.peak[tag] == 1


def flood(
    live: Live, client: Client, tag: str, first: str, lanes: list[str | None]
) -> list[dict[str, Any]]:
    """A slow request on lane `first`, then, once it runs, one create per lane in `lanes`,
    50 ms apart (each arrives while the first still runs); every answer."""
    client.create(
        model="sleep", input="x", stream_id=first, metadata={"tag": tag, "seconds": "1.0"}
    )
    assert wait_until(lambda: live.probe.running.get(tag) == 1)
    for lane in lanes:
        on = {"stream_id": lane} if lane else {}
        client.create(model="sleep", input="x", metadata={"tag": tag, "seconds": "0.01"}, **on)
        time.sleep(0.05)
    return client.answers(1 + len(lanes))


def test_max_queued_bounds_the_requests_waiting_on_one_lane(live: Live) -> None:
    with live.socket("/queue") as client:  # max_in_flight=1, max_queued=2
        events = flood(live, client, "queued-one-lane", "w", ["w"] * 5)
    refused = [event for event in events if event["type"] == "error"]
    # One runs, at most two wait: of the five behind it, three are refused.
    assert len(refused) == 3, events
    for event in refused:
        expect_error(event, 429, "too_many_queued_requests", None, "w")
    assert live.probe.calls["queued-one-lane"] == 3


def test_max_queued_bounds_the_requests_waiting_across_lanes(live: Live) -> None:
    with live.socket("/queue") as client:  # max_in_flight=1, max_queued=2
        events = flood(live, client, "queued-lanes", "first", ["a", "b", "c", "d", None])
    refused = [event for event in events if event["type"] == "error"]
    # One runs (on "first"), at most two wait: of the five, three are refused.
    assert len(refused) == 3, events
    assert {event["error"]["code"] for event in refused} == {"too_many_queued_requests"}
    assert live.probe.calls["queued-lanes"] == 3


# ----------------------------------------------------------------------------- as documented
# What docs/limits.md says a client sees, where no other test shows it.


def test_a_timed_out_continuation_evicts_its_parent_on_its_lane(live: Live) -> None:
    fast = {"model": "sleep", "input": "x", "metadata": {"tag": "timeout"}}
    slow = {"model": "sleep", "input": "x", "metadata": {"tag": "timeout", "seconds": "5"}}
    with live.socket("/timeout") as client:  # max_turn_seconds=0.3
        for lane in (None, "t"):
            on = {"stream_id": lane} if lane else {}
            parent = client.completed(**fast, **on)
            client.create(previous_response_id=parent["id"], **slow, **on)
            expect_error(client.answer(), 504, "turn_timeout", None, lane)
            client.create(previous_response_id=parent["id"], **fast, **on)
            expect_error(
                client.answer(), 400, "previous_response_not_found", "previous_response_id", lane
            )
        # A fork from another lane that times out keeps its parent.
        parent = client.completed(**fast, stream_id="home")
        client.create(previous_response_id=parent["id"], stream_id="fork", **slow)
        expect_error(client.answer(), 504, "turn_timeout", None, "fork")
        client.completed(previous_response_id=parent["id"], stream_id="home", **fast)


def test_a_response_larger_than_max_cached_bytes_is_answered_but_not_kept(live: Live) -> None:
    with live.socket("/smallcache") as client:  # max_cached_bytes=16 KiB
        big = client.completed(input="x" * 20_000, tools=[TOOL])
        small = client.completed(input="Hi", tools=[TOOL])
        client.create(previous_response_id=big["id"], input=[call_output(big)], tools=[TOOL])
        expect_error(
            client.answer(), 400, "previous_response_not_found", "previous_response_id", None
        )
        client.completed(previous_response_id=small["id"], input=[call_output(small)], tools=[TOOL])


@pytest.mark.parametrize(("ws_max_size", "chars"), [(64 * 1024, 100_000), (1 << 20, 3 << 20)])
def test_a_frame_over_the_servers_own_limit_closes_the_socket_with_1009(
    ws_max_size: int, chars: int
) -> None:
    """The ASGI server's message limit (uvicorn's `ws_max_size`, 16 MiB by default) applies
    before ws_mode sees a frame: past it the socket is closed with 1009, no error event. The
    client compresses the frame: the limit holds below one inflating step of ws_mode's protocol
    and past several."""
    handler = Starlette(routes=[Route("/v1/responses", Response, methods=["POST"])])  # never called
    app = WebSocketModeMiddleware(handler, limits=Limits(max_message_bytes=1024 * 1024))
    with serve(app, ws_max_size=ws_max_size) as base_url:
        url = base_url.replace("http", "ws", 1) + "/v1/responses"
        with connect(url, open_timeout=10, close_timeout=2, max_size=None) as ws:
            ws.send(json.dumps({"type": "response.create", "input": "x" * chars}))
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=RECV_TIMEOUT)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1009
