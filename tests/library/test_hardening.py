"""Faults a long-lived socket meets: hung handlers, slow readers, floods, shutdown."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.servers import free_port, serve
from ws_mode import Limits, WebSocketModeMiddleware, bearer_token, find_middlewares
from ws_mode.server import Server


class Handlers:
    def __init__(self) -> None:
        self.produced = 0
        self.closed = threading.Event()
        self.release = asyncio.Event()
        # "held": the handler says it started, then answers only once the test lets it go.
        self.started = threading.Event()
        self.let_go = threading.Event()

    async def respond(self, request: Request) -> Response:
        body = await request.json()
        behaviour = body.get("model")
        if behaviour == "hang":
            await asyncio.sleep(3600)
        if behaviour == "firehose":
            return StreamingResponse(self.firehose(), media_type="text/event-stream")
        if behaviour == "slow":
            await asyncio.sleep(float(body.get("metadata", {}).get("seconds", "0.5")))
        if behaviour == "held":
            self.started.set()
            while not self.let_go.is_set():  # noqa: ASYNC110  (set from the test's thread)
                await asyncio.sleep(0.01)
        item = {
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "ok", "annotations": []}],
        }
        return JSONResponse(
            {
                "id": f"resp_{time.monotonic_ns()}",
                "object": "response",
                "status": "completed",
                "output": [item],
            }
        )

    async def firehose(self) -> AsyncIterator[str]:
        delta = json.dumps({"type": "response.output_text.delta", "delta": "x" * 1000})
        try:
            while True:
                self.produced += 1
                yield f"event: response.output_text.delta\ndata: {delta}\n\n"
        finally:
            self.closed.set()


def make_app(handlers: Handlers, limits: Limits) -> WebSocketModeMiddleware:
    app = Starlette(routes=[Route("/v1/responses", handlers.respond, methods=["POST"])])
    return WebSocketModeMiddleware(app, limits=limits)


@pytest.fixture
def handlers() -> Handlers:
    return Handlers()


def ws(base_url: str) -> str:
    return base_url.replace("http", "ws", 1) + "/v1/responses"


def send(socket: ClientConnection, model: str, **fields: Any) -> None:
    socket.send(json.dumps({"type": "response.create", "model": model, "input": "x", **fields}))


def terminal(socket: ClientConnection) -> dict[str, Any]:
    while True:
        event: dict[str, Any] = json.loads(socket.recv(timeout=10))
        if event["type"] in ("response.completed", "error", "response.failed"):
            return event


def test_a_hung_handler_times_out_and_the_lane_goes_on(handlers: Handlers) -> None:
    with (
        serve(make_app(handlers, Limits(max_turn_seconds=0.3))) as base_url,
        connect(ws(base_url)) as socket,
    ):
        send(socket, "hang", stream_id="a")
        event = terminal(socket)
        assert (event["type"], event["status"], event["error"]["code"]) == (
            "error",
            504,
            "turn_timeout",
        )
        assert event["stream_id"] == "a"
        send(socket, "ok", stream_id="a")
        assert terminal(socket)["type"] == "response.completed"


def stuck_client(port: int) -> socket.socket:
    """A WebSocket client that sends one create and then never reads again."""
    client = socket.create_connection(("127.0.0.1", port))
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    key = base64.b64encode(os.urandom(16)).decode()
    client.sendall(
        f"GET /v1/responses HTTP/1.1\r\nHost: test\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    assert client.recv(4096).startswith(b"HTTP/1.1 101")
    payload = json.dumps({"type": "response.create", "model": "firehose", "input": "x"}).encode()
    mask = os.urandom(4)
    masked = bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload))
    client.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + masked)
    return client


def test_a_client_that_stops_reading_bounds_the_server_and_is_closed(handlers: Handlers) -> None:
    middleware = make_app(handlers, Limits(max_send_stall_seconds=1.5))
    with serve(middleware) as base_url:
        client = stuck_client(int(base_url.rsplit(":", 1)[1]))
        try:
            time.sleep(1.0)
            # The handler is read no faster than the socket drains: what it made fits in the
            # kernel's and the server's buffers, and it makes no more.
            produced = handlers.produced
            assert 0 < produced * 1000 < 16 * 1024 * 1024
            time.sleep(0.5)
            assert handlers.produced == produced
            # Past the stall limit the server gives up on the client: the socket is closed.
            deadline = time.monotonic() + 10
            while middleware.connections and time.monotonic() < deadline:
                time.sleep(0.05)
            assert middleware.connections == 0
            assert handlers.produced == produced
        finally:
            client.close()


def test_a_flood_of_creates_is_bounded(handlers: Handlers) -> None:
    limits = Limits(max_queued=3, max_in_flight=1)
    with serve(make_app(handlers, limits)) as base_url, connect(ws(base_url)) as socket:
        for _ in range(6):
            send(socket, "slow", metadata={"seconds": "0.3"})
        events = [terminal(socket) for _ in range(6)]
    refused = [event for event in events if event["type"] == "error"]
    # Six creates, at most three waiting: the rest are refused (how many depends on how far
    # the first one got before the others arrived), and every one is answered.
    assert 2 <= len(refused) <= 3
    assert {event["error"]["code"] for event in refused} == {"too_many_queued_requests"}
    assert {event["status"] for event in refused} == {429}
    assert sum(event["type"] == "response.completed" for event in events) == 6 - len(refused)


def close_code(socket: ClientConnection) -> int | None:
    """Read until the server closes the socket; the close code it sent."""
    try:
        while True:
            socket.recv(timeout=5)
    except ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd is not None else None


def run_server(app: Any, port: int, *, find: bool = False) -> tuple[Server, threading.Thread]:
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    # gc_threshold=None: the collector is the test worker's, left as it is.
    server = Server(config, gc_threshold=None) if find else Server(config, [app], gc_threshold=None)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    return server, thread


def test_shutdown_lets_running_turns_finish_then_closes_with_1001(handlers: Handlers) -> None:
    app = make_app(handlers, Limits(shutdown_grace_seconds=5))
    port = free_port()
    server, thread = run_server(app, port)
    try:
        with connect(f"ws://127.0.0.1:{port}/v1/responses") as socket:
            send(socket, "slow", metadata={"seconds": "1.0"})
            time.sleep(0.2)
            server.should_exit = True  # what SIGTERM does
            # The running turn still completes...
            assert terminal(socket)["type"] == "response.completed"
            # ...then the socket closes with 1001 so the client reconnects elsewhere.
            assert close_code(socket) == 1001
    finally:
        server.should_exit = True
        thread.join(15)


def test_while_draining_new_sockets_are_refused_with_503(handlers: Handlers) -> None:
    # Each step waits for the one before it (no sleeps): on a loaded machine a fixed pause let
    # the test connect before the drain began, and end while the drain request was still on
    # its way (ECONNREFUSED in the drain thread, the server gone).
    holder: dict[str, WebSocketModeMiddleware] = {}
    draining = threading.Event()
    drained: list[httpx.Response] = []

    async def drain(request: Request) -> Response:
        # drain() sets its flag before its first await, so by the time the loop serves
        # anything else the middleware refuses new sockets.
        draining.set()
        await holder["app"].drain()
        return Response("drained")

    inner = Starlette(
        routes=[
            Route("/v1/responses", handlers.respond, methods=["POST"]),
            Route("/drain", drain, methods=["POST"]),
        ]
    )
    app = holder["app"] = WebSocketModeMiddleware(inner, limits=Limits(shutdown_grace_seconds=30))
    with serve(app) as base_url, connect(ws(base_url)) as socket_:
        send(socket_, "held")
        assert handlers.started.wait(10)
        drainer = threading.Thread(
            target=lambda: drained.append(httpx.post(base_url + "/drain", timeout=30)),
            daemon=True,
        )
        drainer.start()
        assert draining.wait(10)
        with pytest.raises(InvalidStatus) as refused:
            connect(ws(base_url))
        # 503, which clients retry (elsewhere, through a balancer); a 426 would send Codex to
        # HTTP for good.
        answer = refused.value.response
        assert answer.status_code == 503
        assert answer.headers["retry-after"] == "1"
        assert json.loads(answer.body)["error"]["code"] == "server_shutting_down"
        # A request sent while draining is refused; the running one finishes.
        send(socket_, "ok", stream_id="late")
        refusal = terminal(socket_)
        assert refusal["type"] == "error"
        assert refusal["error"]["code"] == "server_shutting_down"
        handlers.let_go.set()
        assert terminal(socket_)["type"] == "response.completed"
        assert close_code(socket_) == 1001
        drainer.join(30)
        assert [response.text for response in drained] == ["drained"]


def _shaped(shape: str, handlers: Handlers, limits: Limits) -> tuple[Any, str]:
    """An app with the middleware added the way `shape` says, and its socket path."""
    route = Route("/v1/responses", handlers.respond, methods=["POST"])
    if shape == "fastapi-add_middleware":
        api = FastAPI()
        api.router.routes.append(route)
        api.add_middleware(WebSocketModeMiddleware, limits=limits)
        return api, "/v1/responses"
    if shape == "starlette-Middleware":
        middleware = [Middleware(WebSocketModeMiddleware, limits=limits)]
        return Starlette(routes=[route], middleware=middleware), "/v1/responses"
    if shape == "wrapped":  # how Django's ASGI application is wrapped
        return WebSocketModeMiddleware(Starlette(routes=[route]), limits=limits), "/v1/responses"
    inner = Starlette(routes=[route])
    inner.add_middleware(WebSocketModeMiddleware, limits=limits)
    return Starlette(routes=[Mount("/api", app=inner)]), "/api/v1/responses"


@pytest.mark.parametrize(
    "shape", ["fastapi-add_middleware", "starlette-Middleware", "wrapped", "mounted"]
)
def test_shutdown_drains_however_the_middleware_was_added(handlers: Handlers, shape: str) -> None:
    """`Server` finds the live middleware in the app (`find_middlewares`), so running turns
    finish and sockets close with 1001 instead of uvicorn's 1012."""
    app, path = _shaped(shape, handlers, Limits(shutdown_grace_seconds=5))
    port = free_port()
    server, thread = run_server(app, port, find=True)
    try:
        assert len(server.middlewares) == 1
        (live,) = find_middlewares(app)
        assert live is server.middlewares[0]
        with connect(f"ws://127.0.0.1:{port}{path}") as socket:
            send(socket, "slow", metadata={"seconds": "0.5"})
            time.sleep(0.2)
            assert live.stats.connections_open == 1  # the instance serving this socket
            server.should_exit = True
            assert terminal(socket)["type"] == "response.completed"
            assert close_code(socket) == 1001
    finally:
        server.should_exit = True
        thread.join(15)


def test_an_idle_socket_is_told_and_closed(handlers: Handlers) -> None:
    """No frame and nothing running for `max_idle_seconds`: an error event, then 1001 (a
    vanished peer's slot and cache are freed as well)."""
    with serve(make_app(handlers, Limits(max_idle_seconds=0.5))) as base_url:
        # Timed from before the handshake: the server's idle clock starts inside it, so a
        # loaded machine that returns from connect() late cannot make the wait look short.
        started = time.monotonic()
        with connect(ws(base_url)) as socket:
            event = json.loads(socket.recv(timeout=5))
            assert event["type"] == "error"
            assert event["error"]["code"] == "websocket_idle_timeout"
            assert close_code(socket) == 1001
            assert time.monotonic() - started >= 0.5 - 0.005  # timers may fire that early


def test_a_running_turn_or_a_frame_keeps_a_socket_from_idling(handlers: Handlers) -> None:
    with (
        serve(make_app(handlers, Limits(max_idle_seconds=0.4))) as base_url,
        connect(ws(base_url)) as socket,
    ):
        send(socket, "slow", metadata={"seconds": "1.0"})  # longer than the idle limit
        assert terminal(socket)["type"] == "response.completed"
        for _ in range(3):  # frames closer together than the limit
            time.sleep(0.25)
            send(socket, "slow", metadata={"seconds": "0"})
            assert terminal(socket)["type"] == "response.completed"
        event = json.loads(socket.recv(timeout=5))
        assert event["error"]["code"] == "websocket_idle_timeout"


def test_connections_per_client_are_capped_by_address_or_principal(handlers: Handlers) -> None:
    """One client (an address, or a principal when `authenticate` names one) cannot hold
    every slot: past `max_connections_per_client` it gets 426, others still get in."""
    route = Route("/v1/responses", handlers.respond, methods=["POST"])
    limits = Limits(max_connections_per_client=2)
    by_address = WebSocketModeMiddleware(Starlette(routes=[route]), limits=limits)
    by_key = WebSocketModeMiddleware(
        Starlette(routes=[route]), limits=limits, authenticate=bearer_token
    )
    with serve(by_address) as base_url, connect(ws(base_url)), connect(ws(base_url)):
        with pytest.raises(InvalidStatus) as refused, connect(ws(base_url)):
            pass
        assert refused.value.response.status_code == 426
    with serve(by_address) as base_url:  # a closed socket frees its slot
        for _ in range(3):
            with connect(ws(base_url)) as socket:
                send(socket, "slow", metadata={"seconds": "0"})
                assert terminal(socket)["type"] == "response.completed"

    def key(name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {name}"}

    with (
        serve(by_key) as base_url,
        connect(ws(base_url), additional_headers=key("a")),
        connect(ws(base_url), additional_headers=key("a")),
    ):
        with pytest.raises(InvalidStatus), connect(ws(base_url), additional_headers=key("a")):
            pass
        with connect(ws(base_url), additional_headers=key("b")) as other:  # same address
            send(other, "slow", metadata={"seconds": "0"})
            assert terminal(other)["type"] == "response.completed"
