"""Vanishing clients: what a client that leaves abruptly leaves behind on the server (nothing).

The app runs under real uvicorn in a background thread of this process, so the test can look at
the server's own state: a `/debug/state` endpoint of the wrapped app runs on the server's loop
and reports, after a garbage collection, its task count, the tasks running ws_mode's code, the
live ws_mode objects (connections, cached responses, streams, handler calls) and the memory
tracemalloc traces. Each probe uses the same kept-alive HTTP connection, so the probe's own
connection is part of the baseline.

Clients leave in every way a real one does: mid-stream (vanishing without a close frame, or
closing politely), mid-handshake (a partial upgrade request, a full one then gone), right after
sending a create, with creates queued on several lanes behind `max_in_flight`, and right after a
response finished while post-response work still runs. The short run (200 clients) is part of
the normal suite; 1000+ run with `--run-slow`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import itertools
import json
import os
import random
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from websockets.asyncio.client import ClientConnection, connect

import ws_mode
from tests.servers import serve
from ws_mode import Limits, WebSocketModeMiddleware
from ws_mode._cache import CachedResponse, ResponseCache
from ws_mode._connection import Connection
from ws_mode._events import ResponseStream
from ws_mode._handler_call import HandlerCall

#: ws_mode's objects that live only as long as their connection, or their turn.
TRACKED = (Connection, CachedResponse, ResponseStream, HandlerCall, ws_mode.Turn)
WS_MODE_DIR = os.path.dirname(ws_mode.__file__)
#: How long a handler may run on after its client vanished: a hang, not a speed. The probe's
#: handlers never end on their own (an endless stream, an hour's sleep), so any bound catches
#: a handler left running; a tight one (2 s) failed on a loaded 2-core machine (3.7 s).
CANCEL_BOUND = 30.0
#: Bytes the server may hold on to after all the clients left (see `check_nothing_left`).
MEMORY_SLACK = 192 * 1024
#: ... and what a later round of as many clients may add to it.
ROUND_SLACK = 32 * 1024
#: The clients come in this many rounds (see `check_nothing_left`).
ROUNDS = 3


class Probe:
    """The wrapped app: handlers that record how they end, and the `/debug/state` endpoint."""

    def __init__(self) -> None:
        self.running = 0
        self.calls = 0
        self.started: set[str] = set()
        self.ended: dict[str, float] = {}
        self.hooks_running = 0
        self.middleware: WebSocketModeMiddleware | None = None

    async def respond(self, request: Request) -> Response:
        body = await request.json()
        tag = str((body.get("metadata") or {}).get("tag", ""))
        self.calls += 1
        self.started.add(tag)
        if body.get("model") == "stream":
            return StreamingResponse(self.stream(tag), media_type="text/event-stream")
        if body.get("model") == "sleep":
            self.running += 1
            try:
                await asyncio.sleep(3600)
            finally:
                self.running -= 1
                self.ended[tag] = time.monotonic()
        return JSONResponse(response_object(tag))

    async def stream(self, tag: str) -> AsyncIterator[str]:
        self.running += 1
        try:
            created = {"type": "response.created", "response": response_object(tag, "in_progress")}
            yield sse(created)
            delta = {"type": "response.output_text.delta", "delta": "x" * 200}
            while True:
                yield sse(delta)
                await asyncio.sleep(0.005)
        finally:
            self.running -= 1
            self.ended[tag] = time.monotonic()

    async def after_response(self, turn: ws_mode.Turn, response: dict[str, Any]) -> None:
        self.hooks_running += 1
        try:
            await asyncio.sleep(0.05)
        finally:
            self.hooks_running -= 1

    async def state(self, request: Request) -> Response:
        gc.collect()
        tasks = asyncio.all_tasks()
        mine = []
        for task in tasks:
            code = getattr(task.get_coro(), "cr_code", None)
            if code is not None and code.co_filename.startswith(WS_MODE_DIR):
                mine.append(code.co_qualname)
        objects: dict[str, int] = {}
        for obj in gc.get_objects():
            if issubclass(
                type(obj), TRACKED
            ):  # type(): a lazy object (Django's settings) may not be touched
                name = type(obj).__name__
                objects[name] = objects.get(name, 0) + 1
        traced = traced_memory() if request.query_params.get("memory") else None
        assert self.middleware is not None
        return JSONResponse(
            {
                "tasks": len(tasks),
                "ws_mode_tasks": sorted(mine),
                "objects": objects,
                "connections": self.middleware.connections,
                "running": self.running,
                "hooks_running": self.hooks_running,
                "traced": traced,
            }
        )


def traced_memory() -> int | None:
    """The bytes tracemalloc traces, except this test's own bookkeeping (the tags it records)."""
    if not tracemalloc.is_tracing():
        return None
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [
            tracemalloc.Filter(False, __file__, all_frames=True),
            tracemalloc.Filter(False, tracemalloc.__file__),
        ]
    )
    return sum(stat.size for stat in snapshot.statistics("filename"))


def response_object(tag: str, status: str = "completed") -> dict[str, Any]:
    item = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "ok", "annotations": []}],
    }
    return {
        "id": f"resp_{tag}_{time.monotonic_ns()}",
        "object": "response",
        "status": status,
        "output": [item] if status == "completed" else [],
        "metadata": {"tag": tag},
    }


def sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


def build(probe: Probe) -> WebSocketModeMiddleware:
    app = Starlette(
        routes=[
            Route("/v1/responses", probe.respond, methods=["POST"]),
            Route("/debug/state", probe.state, methods=["GET"]),
        ]
    )
    middleware = WebSocketModeMiddleware(
        app, limits=Limits(max_in_flight=2), on_response=probe.after_response
    )
    probe.middleware = middleware
    return middleware


@dataclass
class Live:
    probe: Probe
    base_url: str
    http: httpx.Client

    @property
    def ws_url(self) -> str:
        return self.base_url.replace("http", "ws", 1) + "/v1/responses"

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])

    def state(self, memory: bool = False) -> dict[str, Any]:
        params = {"memory": "1"} if memory else {}
        answer: dict[str, Any] = self.http.get("/debug/state", params=params).json()
        return answer

    def settle(self, baseline: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        """The server's state, its memory included, once everything the clients started is
        gone (or the timeout). Each probe measures the memory too: the one that finds nothing
        left is the answer, where another probe would only repeat its garbage collection and
        its walk over every object of the process (~0.3 s of CPU in a worker of the suite)."""
        deadline = time.monotonic() + timeout
        while True:
            now = self.state(memory=True)
            if (
                now["connections"] == 0
                and now["running"] == 0
                and now["hooks_running"] == 0
                and not now["ws_mode_tasks"]
                and not now["objects"]
                and now["tasks"] <= baseline["tasks"]
            ) or time.monotonic() > deadline:
                return now
            time.sleep(0.05)


@pytest.fixture
def live() -> Iterator[Live]:
    probe = Probe()
    with serve(build(probe)) as base_url, httpx.Client(base_url=base_url, timeout=10) as http:
        yield Live(probe, base_url, http)


# ----------------------------------------------------------------------------- the clients


def create(tag: str, model: str = "stream", **fields: Any) -> str:
    return json.dumps(
        {
            "type": "response.create",
            "model": model,
            "input": "x",
            "metadata": {"tag": tag},
            **fields,
        }
    )


async def open_socket(url: str) -> ClientConnection:
    return await connect(url, open_timeout=10, close_timeout=1, proxy=None, max_size=None)


async def vanish(ws: ClientConnection) -> None:
    """Leave without a close frame (the kernel answers the server's next bytes with a reset)."""
    ws.transport.abort()
    with contextlib.suppress(Exception):
        async with asyncio.timeout(5):
            await ws.wait_closed()


async def until(ws: ClientConnection, count: int, kind: str) -> None:
    """Read until `count` events of type `kind` arrived."""
    seen = 0
    async with asyncio.timeout(10):
        while seen < count:
            event = json.loads(await ws.recv())
            seen += event["type"] == kind


@dataclass
class Run:
    """What the clients did: when each stream was left, by tag; how many clients of a kind."""

    left: dict[str, float] = field(default_factory=dict)
    kinds: dict[str, int] = field(default_factory=dict)


async def mid_stream(live: Live, run: Run, tag: str, rng: random.Random) -> None:
    """Streams on one to three lanes, then gone (vanished, or closed politely)."""
    ws = await open_socket(live.ws_url)
    lanes = rng.randint(1, 2)  # max_in_flight is 2: both stream at once
    tags = [f"{tag}-{lane}" for lane in range(lanes)]
    for lane, lane_tag in enumerate(tags):
        await ws.send(create(lane_tag, stream_id=f"lane{lane}") if lane else create(lane_tag))
    await until(ws, 2 * lanes, "response.output_text.delta")
    left = time.monotonic()
    for lane_tag in tags:
        run.left[lane_tag] = left
    if rng.random() < 0.8:
        await vanish(ws)
    else:
        await ws.close()


async def mid_handshake(live: Live, run: Run, tag: str, rng: random.Random) -> None:
    """A TCP connection that never becomes a socket: gone before, during or right after the
    upgrade request, or right after the 101 without a frame."""
    reader, writer = await asyncio.open_connection("127.0.0.1", live.port)
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()
    how = rng.randrange(4)
    if how == 1:
        writer.write(request[: rng.randrange(1, len(request) - 4)])
    elif how >= 2:
        writer.write(request)
    await writer.drain()
    if how == 3:
        async with asyncio.timeout(10):
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
    writer.transport.abort()
    await asyncio.sleep(0)


async def after_create(live: Live, run: Run, tag: str, rng: random.Random) -> None:
    """Sends a create (streaming or slow) and is gone before any answer."""
    ws = await open_socket(live.ws_url)
    await ws.send(create(tag, rng.choice(["stream", "sleep", "json"])))
    if rng.random() < 0.5:
        await asyncio.sleep(rng.random() * 0.02)
    await vanish(ws)


async def queued(live: Live, run: Run, tag: str, rng: random.Random) -> None:
    """Creates queued on several lanes behind `max_in_flight=2`, then gone."""
    ws = await open_socket(live.ws_url)
    tags = [f"{tag}-{index}" for index in range(rng.randint(3, 8))]
    for lane_tag in tags:
        lane = rng.choice([None, "a", "b", "c"])
        fields = {"stream_id": lane} if lane else {}
        await ws.send(create(lane_tag, rng.choice(["stream", "sleep"]), **fields))
    if rng.random() < 0.5:
        # Gone once the first turns run and the others wait.
        async with asyncio.timeout(10):
            # The probe lives on the server's thread: poll it.
            while not live.probe.started.intersection(tags):  # noqa: ASYNC110
                await asyncio.sleep(0.005)
    await vanish(ws)


async def after_completion(live: Live, run: Run, tag: str, rng: random.Random) -> None:
    """A finished turn (its cached response, its post-response hook still running), then a
    continuation that was never answered, then gone."""
    ws = await open_socket(live.ws_url)
    await ws.send(create(tag, "json"))
    response_id = None
    async with asyncio.timeout(10):
        while response_id is None:
            event = json.loads(await ws.recv())
            if event["type"] == "response.completed":
                response_id = event["response"]["id"]
    await ws.send(create(tag + "-next", "stream", previous_response_id=response_id))
    await vanish(ws)


CLIENTS = {
    "mid_stream": mid_stream,
    "mid_handshake": mid_handshake,
    "after_create": after_create,
    "queued": queued,
    "after_completion": after_completion,
}


async def vanishing_clients(live: Live, count: int, *, seed: int, concurrency: int = 25) -> Run:
    rng = random.Random(seed)
    run = Run()
    plan = [(f"c{index}", rng.choice(sorted(CLIENTS))) for index in range(count)]
    limit = asyncio.Semaphore(concurrency)

    async def one(tag: str, kind: str) -> None:
        async with limit:
            await CLIENTS[kind](live, run, tag, random.Random(f"{seed}-{tag}"))
            run.kinds[kind] = run.kinds.get(kind, 0) + 1

    await asyncio.gather(*(one(tag, kind) for tag, kind in plan))
    return run


# ----------------------------------------------------------------------------- the checks


def check_nothing_left(live: Live, count: int, *, seed: int) -> None:
    """`count` vanishing clients in three rounds; after each, nothing of them is left."""
    # Warm up: the first sockets import and allocate what every later one reuses, and the
    # server's containers (the loop's task set, ...) grow to what this concurrency needs.
    asyncio.run(vanishing_clients(live, 100, seed=seed + 1))
    baseline = live.settle(live.state())
    assert baseline["connections"] == 0
    tracemalloc.start(4)
    try:
        rounds = [live.settle(baseline)]
        for number in range(ROUNDS):
            run = asyncio.run(vanishing_clients(live, count // ROUNDS, seed=seed + 2 + number))
            rounds.append(live.settle(baseline))
            check_round(live, run, count // ROUNDS, baseline, rounds[-1])
    finally:
        tracemalloc.stop()
    # Memory: what the clients made is gone. What a round may leave is the server's containers
    # grown to a new peak (the loop's task set, uvicorn's connection set) and the allocator's
    # free lists: ~100 KiB after the first round however many clients came, then a few KiB,
    # now and then more when a round reaches a new peak of concurrency. A leak grows every
    # round: 400 bytes per client (one small dict) is 32 KiB in each later round of the short
    # run, 130 KiB in the long one.
    traced = [state["traced"] for state in rounds]
    growth = [after - before for before, after in itertools.pairwise(traced)]
    assert traced[-1] - traced[0] < MEMORY_SLACK, growth
    assert min(growth[1:]) < ROUND_SLACK, growth


def check_round(
    live: Live, run: Run, count: int, baseline: dict[str, Any], after: dict[str, Any]
) -> None:
    assert sum(run.kinds.values()) == count
    assert set(run.kinds) == set(CLIENTS), run.kinds
    # Every handler whose client vanished mid-stream was cancelled within the bound.
    late = {
        tag: live.probe.ended.get(tag, float("inf")) - left
        for tag, left in run.left.items()
        if live.probe.ended.get(tag, float("inf")) - left > CANCEL_BOUND
    }
    assert not late, late
    # Nothing is left: no connection, handler, hook, task, ws_mode object.
    assert after["connections"] == 0, after
    assert live.probe.middleware is not None
    assert live.probe.middleware.connections == 0
    assert after["running"] == 0, after
    assert after["hooks_running"] == 0, after
    assert after["ws_mode_tasks"] == [], after
    assert after["objects"] == {}, after
    assert after["tasks"] <= baseline["tasks"], (baseline, after)


def test_a_thousand_vanishing_clients_leave_nothing_behind_short(live: Live) -> None:
    check_nothing_left(live, 200, seed=7)


@pytest.mark.slow
def test_a_thousand_vanishing_clients_leave_nothing_behind(live: Live) -> None:
    check_nothing_left(live, 1200, seed=11)


@pytest.mark.parametrize("model", ["stream", "sleep"])
@pytest.mark.parametrize("how", ["vanish", "close"])
def test_leaving_mid_turn_cancels_the_handler_within_a_bound(
    live: Live, model: str, how: str
) -> None:
    """A streaming handler and one still computing its JSON answer are both cancelled soon
    after the client leaves; creates queued behind them never reach the handler."""

    async def scenario() -> float:
        ws = await open_socket(live.ws_url)
        await ws.send(create("first", model, stream_id="a"))
        await ws.send(create("second", model, stream_id="b"))
        await ws.send(create("queued", model, stream_id="c"))  # max_in_flight is 2
        await ws.send(create("behind", model, stream_id="a"))
        async with asyncio.timeout(10):
            while live.probe.running < 2:  # noqa: ASYNC110  (the server's thread)
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        left = time.monotonic()
        if how == "vanish":
            await vanish(ws)
        else:
            await ws.close()
        return left

    baseline = live.settle(live.state())
    left = asyncio.run(scenario())
    after = live.settle(baseline, timeout=CANCEL_BOUND + 3)
    assert set(live.probe.ended) == {"first", "second"}
    for tag in ("first", "second"):
        assert live.probe.ended[tag] - left < CANCEL_BOUND
    assert live.probe.calls == 2
    assert after["connections"] == 0
    assert after["running"] == 0
    assert after["objects"] == {}
    assert after["ws_mode_tasks"] == []
    assert after["tasks"] <= baseline["tasks"]


def reachable(connection: Connection) -> list[CachedResponse]:
    """Every cached response a connection holds: its cache's entries and their ancestors."""
    seen: dict[int, CachedResponse] = {}
    for node in list(connection.cache._entries.values()):
        walk: CachedResponse | None = node
        while walk is not None and id(walk) not in seen:
            seen[id(walk)] = walk
            walk = walk.parent
    return list(seen.values())


def test_max_cached_bytes_bounds_what_a_long_conversation_holds() -> None:
    limit = 64 * 1024
    probe = Probe()
    inner = Starlette(routes=[Route("/v1/responses", probe.respond, methods=["POST"])])
    app = WebSocketModeMiddleware(inner, limits=Limits(max_cached_bytes=limit))

    async def chain(url: str) -> tuple[int, int, int]:
        ws = await open_socket(url)
        previous: str | None = None
        recoveries = largest = 0
        for turn in range(40):
            fields: dict[str, Any] = {"previous_response_id": previous} if previous else {}
            await ws.send(create(f"t{turn}", "json", **fields, input="x" * 8000))
            async with asyncio.timeout(10):
                while True:
                    event = json.loads(await ws.recv())
                    if event["type"] == "response.completed":
                        previous = event["response"]["id"]
                        break
                    if event["type"] == "error":
                        # The conversation outgrew the bound and was evicted whole: the
                        # documented recovery starts again from the full context (here, anew).
                        assert event["error"]["code"] == "previous_response_not_found"
                        assert "max_cached_bytes" in event["error"]["message"]  # says why
                        recoveries += 1
                        previous = None
                        break
            [connection] = app._open
            largest = max(largest, sum(node.size for node in reachable(connection)))
            assert connection.cache.bytes <= limit
        await ws.close()
        return largest, recoveries, connection.cache.bytes

    with serve(app) as base_url:
        largest, recoveries, counted = asyncio.run(
            chain(base_url.replace("http", "ws", 1) + "/v1/responses")
        )
    # What the connection holds, evicted ancestors included, never passes the bound.
    assert largest <= limit, largest
    assert recoveries > 0  # 40 turns of 8 KB cannot all stay in 64 KiB
    assert counted <= limit


def test_a_cached_response_costs_about_what_the_cache_counts() -> None:
    tool_output = [{"type": "function_call_output", "call_id": "call_1", "output": "x" * 8000}]
    answer = [{"type": "function_call", "call_id": "call_2", "name": "f", "arguments": "{}"}]
    cache = ResponseCache(max_entries=1000, max_bytes=1 << 30)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for index in range(200):
            # The shared item lists cost nothing here: what is measured is what each node adds.
            node = CachedResponse(
                id=f"resp_{index}",
                response={"id": f"resp_{index}"},
                input_items=tool_output,
                output_items=answer,
                parent=None,
            )
            cache.put(node)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # Each node: its two fragments (8 KB and 70 bytes), the object, the dict; the cache
    # counts the fragments plus 512 bytes. Twice that is generous.
    assert held < 2 * cache.bytes, (held, cache.bytes)
