"""`ws_mode.server.Server`, uvicorn that drains WebSocket mode before it shuts down: it finds
the middlewares in its app (or is given them); on shutdown it stops listening first (a new
connection is refused at TCP level, and one that got in just before is answered 503, never
426), running turns finish and sockets close
with 1001, where a plain `uvicorn.Server` closes them at once with 1012; and it drops uvicorn's
spurious line after a refused upgrade (`RefusalLineFilter`, whose effect
tests/library/test_logs.py shows)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from tests.fresh_python import fresh_output
from ws_mode import GC_THRESHOLD, Limits, WebSocketModeMiddleware, find_middlewares, tune_gc
from ws_mode._budget import BUDGET_EXTENSION
from ws_mode.server import RefusalLineFilter, Server
from ws_mode.testing._loopback import bind_loopback

#: A bound on what must not hang (never a speed).
HANG = 20.0


class Held:
    """A handler that answers only once the test lets it go."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def respond(self, request: Request) -> JSONResponse:
        await request.body()
        self.started.set()
        await self.release.wait()
        item = {"type": "message", "role": "assistant", "status": "completed", "content": []}
        return JSONResponse(
            {"id": "resp_1", "object": "response", "status": "completed", "output": [item]}
        )

    def routes(self) -> list[Route]:
        return [Route("/v1/responses", self.respond, methods=["POST"])]


# --- which middlewares it drains ------------------------------------------------------------


def config(app: Any) -> uvicorn.Config:
    return uvicorn.Config(app, lifespan="off", log_config=None)


def shaped(shape: str) -> Any:
    """An app that has not started, with the middleware where `shape` says."""
    routes = Held().routes()
    if shape == "wrapped":  # how Django's ASGI application is wrapped
        return WebSocketModeMiddleware(Starlette(routes=routes))
    if shape == "in-the-middleware-list":
        return Starlette(routes=routes, middleware=[Middleware(WebSocketModeMiddleware)])
    if shape == "mounted":
        return Starlette(routes=[Mount("/api", app=WebSocketModeMiddleware(Starlette()))])
    return Starlette(routes=routes)


@pytest.mark.parametrize(
    ("shape", "count"), [("wrapped", 1), ("in-the-middleware-list", 1), ("mounted", 1), ("none", 0)]
)
def test_by_default_it_drains_the_middlewares_found_in_its_app(shape: str, count: int) -> None:
    app = shaped(shape)
    server = Server(config(app))
    assert len(server.middlewares) == count
    assert server.middlewares == find_middlewares(app)  # the very instances that will serve
    if isinstance(app, Starlette):
        assert app.middleware_stack is None  # found without building the app


def test_it_drains_the_middlewares_it_is_given() -> None:
    found = WebSocketModeMiddleware(Starlette())
    given = WebSocketModeMiddleware(Starlette())
    server = Server(config(found), [given])
    assert server.middlewares == [given]
    assert Server(config(found), []).middlewares == []


def test_it_drops_uvicorns_line_after_a_refused_upgrade() -> None:
    uvicorn_error = logging.getLogger("uvicorn.error")
    saved = list(uvicorn_error.filters)
    for each in saved:
        uvicorn_error.removeFilter(each)
    try:
        Server(config(Starlette()))
        Server(config(Starlette()))
        added = [each for each in uvicorn_error.filters if isinstance(each, RefusalLineFilter)]
        assert len(added) == 1  # once per process
    finally:
        for each in list(uvicorn_error.filters):
            uvicorn_error.removeFilter(each)
        for each in saved:
            uvicorn_error.addFilter(each)


# --- shutting down --------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def running(server: uvicorn.Server) -> AsyncIterator[str]:
    """`server` serving on a loopback socket in this event loop; its `ws://` base URL. On the
    way out it is told to exit (as SIGTERM does) and awaited."""
    sock = bind_loopback()
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(HANG):
            while not server.started:
                assert not serving.done()
                await asyncio.sleep(0.01)
        yield f"ws://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, HANG)
        sock.close()


async def send_create(socket: ClientConnection) -> None:
    await socket.send(json.dumps({"type": "response.create", "model": "m", "input": "x"}))


async def until_closed(socket: ClientConnection) -> tuple[list[str], int | None]:
    """The event types received until the server closed the socket, and its close code."""
    kinds: list[str] = []
    try:
        async with asyncio.timeout(HANG):
            async for text in socket:
                kinds.append(json.loads(text)["type"])
    except ConnectionClosed:
        pass
    return kinds, socket.close_code


async def refused_while_draining(url: str) -> tuple[list[int], BaseException]:
    """Connect until a connection is refused at TCP level (the shutdown has begun, nothing
    listens); the statuses of the upgrades answered on the way, and what ended it. An upgrade
    accepted just before the listening socket closed reaches the draining middleware, which
    answers it; the loop goes on past those."""
    answered: list[int] = []
    async with asyncio.timeout(HANG):
        while True:
            try:
                async with connect(url, open_timeout=HANG):
                    pass  # not shutting down yet
            except ConnectionRefusedError as refused:
                return answered, refused
            except InvalidStatus as refused:
                answered.append(refused.response.status_code)
            except (OSError, InvalidHandshake):
                pass  # queued just before the listening socket closed, and dropped with it
            await asyncio.sleep(0.01)


@pytest.mark.anyio
async def test_on_shutdown_it_stops_listening_then_running_turns_finish_and_close_1001() -> None:
    held = Held()
    middleware = WebSocketModeMiddleware(
        Starlette(routes=held.routes()), limits=Limits(shutdown_grace_seconds=HANG)
    )
    # The collector is the process's: a server started in the test worker leaves it alone.
    server = Server(config(middleware), gc_threshold=None)
    async with running(server) as base_url:
        url = base_url + "/v1/responses"
        async with connect(url) as socket:
            await send_create(socket)
            await asyncio.wait_for(held.started.wait(), HANG)
            server.should_exit = True
            # Nothing listens any more: a balancer sends the connection to another server,
            # where a 426 would send Codex to HTTP for good.
            answered, refused = await refused_while_draining(url)
            assert isinstance(refused, ConnectionRefusedError), repr(refused)
            # One that got in just before: 503, which clients retry, never 426.
            assert set(answered) <= {503}, answered
            assert not held.release.is_set()  # the turn still runs: the drain is under way
            held.release.set()  # the running turn ends only now, during the drain
            kinds, code = await until_closed(socket)
    assert kinds[-1] == "response.completed"
    assert code == 1001  # "going away": the client reconnects elsewhere
    assert middleware.stats.turns == 1
    assert middleware.stats.turns_failed == 0


@pytest.mark.anyio
@pytest.mark.parametrize(("ws", "counted"), [("auto", True), ("wsproto", False)])
async def test_by_default_it_runs_ws_mode_s_protocol(ws: str, counted: bool) -> None:
    """uvicorn's default WebSocket protocol holds a message still arriving outside the memory
    budget; ws_mode's offers the budget extension. A protocol named on purpose is kept."""
    offered: list[bool] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()  # websocket.connect
        offered.append(BUDGET_EXTENSION in scope["extensions"])
        await send({"type": "websocket.close"})

    server = Server(uvicorn.Config(app, lifespan="off", log_config=None, ws=ws), gc_threshold=None)
    async with running(server) as base_url:
        with contextlib.suppress(InvalidStatus, ConnectionClosed):
            async with connect(base_url + "/"):
                pass
    assert offered == [counted]


@pytest.mark.anyio
async def test_a_plain_uvicorn_server_cuts_running_turns_with_1012() -> None:
    """What `Server` is for: uvicorn alone closes every socket as its shutdown starts."""
    held = Held()
    middleware = WebSocketModeMiddleware(
        Starlette(routes=held.routes()), limits=Limits(shutdown_grace_seconds=HANG)
    )
    server = uvicorn.Server(config(middleware))
    async with running(server) as base_url, connect(base_url + "/v1/responses") as socket:
        await send_create(socket)
        await asyncio.wait_for(held.started.wait(), HANG)
        server.should_exit = True
        kinds, code = await until_closed(socket)
        held.release.set()
    assert "response.completed" not in kinds
    assert code == 1012


# --- the garbage collector ------------------------------------------------------------------

#: Runs in a fresh interpreter (the collector's settings are the process's): a `Server` with
#: the given `gc_threshold` serves on loopback until started, then prints the collector's
#: first threshold and how many objects it froze; and a cycle made afterwards is still freed.
GC_PROBE = """
import asyncio, gc, sys, weakref
import uvicorn
from starlette.applications import Starlette
from ws_mode.server import Server

async def main() -> None:
    threshold = None if sys.argv[1] == "none" else int(sys.argv[1])
    config = uvicorn.Config(Starlette(), host="127.0.0.1", port=0, lifespan="off", log_config=None)
    server = Server(config, [], gc_threshold=threshold)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    class Node: pass
    node = Node(); node.self = node; gone = weakref.ref(node); del node
    gc.collect()
    print(gc.get_threshold()[0], gc.get_freeze_count(), gone() is None)
    server.should_exit = True
    await task

asyncio.run(main())
"""


@pytest.mark.parametrize(("threshold", "expected"), [("default", 50_000), ("1234", 1234)])
def test_a_started_server_makes_the_collector_cheaper(threshold: str, expected: int) -> None:
    argument = str(GC_THRESHOLD) if threshold == "default" else threshold
    first, frozen, freed = fresh_output(GC_PROBE, argument)
    assert int(first) == expected
    assert int(frozen) > 1000  # the modules and the app, out of the collections' walk
    assert freed == "True"  # cyclic garbage is still collected


def test_gc_threshold_none_leaves_the_collector_alone() -> None:
    first, frozen, freed = fresh_output(GC_PROBE, "none")
    assert (int(first), int(frozen), freed) == (700, 0, "True")


@pytest.mark.parametrize("threshold", [0, -1])
def test_a_threshold_below_one_is_refused(threshold: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Server(config(Starlette()), [], gc_threshold=threshold)
    with pytest.raises(ValueError, match="at least 1"):
        tune_gc(threshold)


def test_tune_gc_needs_no_uvicorn() -> None:
    """Under Hypercorn, Daphne or granian the application calls it itself: `ws_mode` offers it
    with no server package installed."""
    code = (
        "import gc, sys\n"
        "sys.modules['uvicorn'] = None\n"
        "import ws_mode\n"
        "ws_mode.tune_gc(4321)\n"
        "print(gc.get_threshold()[0], gc.get_freeze_count() > 0)\n"
    )
    assert fresh_output(code) == ["4321", "True"]
