"""The application around a middleware, read as it stands and never built (`ws_mode._stack`).

`find` (`find_middlewares`) finds the middlewares without starting the app: `add_middleware`
still works afterwards, and what it returned is the instance that serves. `entry` is the
application a socket turn enters: the framework's app when its built stack holds the
middleware, following middlewares only (never routes). `say_where_turns_enter` warns when turns
may miss HTTP middleware a plain `POST` meets and no `authenticate` hook guards the handshake.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from websockets.sync.client import connect

from tests.servers import serve
from ws_mode import WebSocketModeMiddleware, find_middlewares
from ws_mode._stack import entry, find, say_where_turns_enter
from ws_mode.prometheus import register


async def respond(request: Request) -> JSONResponse:
    item = {
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "hi"}],
    }
    return JSONResponse(
        {"id": "resp_1", "object": "response", "status": "completed", "output": [item]}
    )


class Tagged:
    """A middleware added after the lookup: it marks every HTTP answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-tagged", b"1")]
            await send(message)

        await self.app(scope, receive, tagged if scope["type"] == "http" else send)


def one_turn(base_url: str, prefix: str = "") -> None:
    with connect(base_url.replace("http", "ws", 1) + prefix + "/v1/responses") as ws:
        ws.send(json.dumps({"type": "response.create", "model": "m", "input": "hi"}))
        while json.loads(ws.recv(timeout=10))["type"] not in ("response.completed", "error"):
            pass


ROUTES = [Route("/v1/responses", respond, methods=["POST"])]


def shaped(shape: str) -> tuple[Any, str]:
    """An app that has not started, with ws_mode added as `shape` says; the socket's prefix."""
    if shape == "fastapi-add_middleware":
        app = FastAPI(routes=list(ROUTES))
        app.add_middleware(WebSocketModeMiddleware)
        return app, ""
    if shape == "starlette-Middleware":
        return Starlette(routes=ROUTES, middleware=[Middleware(WebSocketModeMiddleware)]), ""
    inner = Starlette(routes=ROUTES)
    inner.add_middleware(WebSocketModeMiddleware)
    return Starlette(routes=[Mount("/api", app=inner)]), "/api"


@pytest.mark.parametrize("shape", ["fastapi-add_middleware", "starlette-Middleware", "mounted"])
def test_find_middlewares_then_add_middleware_and_the_found_instance_serves(shape: str) -> None:
    app, prefix = shaped(shape)
    (found,) = find_middlewares(app)
    assert app.middleware_stack is None  # not built: the app has not started
    registry = CollectorRegistry()
    register(found, registry=registry)  # metrics registered before the app starts
    app.add_middleware(Tagged)  # raised "Cannot add middleware after an application has started"
    assert find_middlewares(app) == [found]  # the same instance when asked again
    with serve(app) as base_url:
        one_turn(base_url, prefix)
        assert find_middlewares(app) == [found]  # and once the app has built its stack
    assert found.stats.turns == 1
    assert found.stats.connections_total == 1
    assert "ws_mode_turns_total 1.0" in generate_latest(registry).decode()


# --- find: through wrapped apps, built stacks, listed middleware and mounts; never building --


async def start(app: Any) -> None:
    """What a server does first: the lifespan startup (Starlette builds its stack on it)."""
    lifespan = ApplicationCommunicator(app, {"type": "lifespan"})
    await lifespan.send_input({"type": "lifespan.startup"})
    assert (await lifespan.receive_output(10))["type"] == "lifespan.startup.complete"
    await lifespan.send_input({"type": "lifespan.shutdown"})
    assert (await lifespan.receive_output(10))["type"] == "lifespan.shutdown.complete"
    await lifespan.wait(10)


def test_find_follows_wrapped_apps_outermost_first_and_only_the_kind_asked() -> None:
    inner = WebSocketModeMiddleware(Starlette(routes=ROUTES), path="/inner")
    tagged = Tagged(inner)
    outer = WebSocketModeMiddleware(tagged, path="/outer")
    assert find(outer, WebSocketModeMiddleware) == [outer, inner]
    assert find(outer, Tagged) == [tagged]
    assert find(Starlette(routes=ROUTES), WebSocketModeMiddleware) == []


@pytest.mark.anyio
async def test_find_makes_a_listed_middleware_once_with_its_options_and_it_is_the_one_built() -> (
    None
):
    app = Starlette(
        routes=ROUTES,
        middleware=[Middleware(WebSocketModeMiddleware, path="/ws", handler_path="/v1/responses")],
    )
    (early,) = find(app, WebSocketModeMiddleware)
    assert early.settings.path == "/ws"  # made with the options listed
    assert app.middleware_stack is None
    assert find(app, WebSocketModeMiddleware) == [early]  # not made twice
    await start(app)
    assert app.middleware_stack is not None
    assert find(app, WebSocketModeMiddleware) == [early]  # read in the built stack now
    assert entry({"app": app}, early.settings) is app


def test_find_goes_into_mounted_apps() -> None:
    mounted = WebSocketModeMiddleware(Starlette(routes=ROUTES))
    app = Starlette(routes=[Mount("/api", app=mounted)])
    assert find(app, WebSocketModeMiddleware) == [mounted]
    assert app.middleware_stack is None


class Loop:
    """A wrapper whose app is itself, and whose routes lead back to it."""

    def __init__(self) -> None:
        self.app = self
        self.routes = [self]


def test_find_ends_on_an_app_that_leads_back_to_itself() -> None:
    assert find(Loop(), WebSocketModeMiddleware) == []


# --- entry: the application a socket turn enters --------------------------------------------


@pytest.mark.anyio
async def test_a_turn_enters_the_framework_app_whose_built_stack_holds_the_middleware() -> None:
    app = Starlette(routes=ROUTES, middleware=[Middleware(WebSocketModeMiddleware)])
    await start(app)
    (middleware,) = find(app, WebSocketModeMiddleware)
    other = WebSocketModeMiddleware(Starlette(routes=ROUTES))
    assert entry({"app": app}, middleware.settings) is app
    assert entry({"app": app}, other.settings) is None  # another middleware's settings
    assert entry({}, middleware.settings) is None  # no framework exposed an app


@pytest.mark.anyio
async def test_entry_follows_middlewares_never_routes() -> None:
    """A middleware mounted as a route's app sits under a `root_path` the outer app did not
    see: entering the outer app would route the turn elsewhere."""
    inner = Starlette(routes=ROUTES, middleware=[Middleware(WebSocketModeMiddleware)])
    outer = Starlette(routes=[Mount("/api", app=inner)])
    await start(outer)
    await start(inner)
    (middleware,) = find(outer, WebSocketModeMiddleware)
    assert entry({"app": outer}, middleware.settings) is None
    assert entry({"app": inner}, middleware.settings) is inner


# --- say_where_turns_enter -----------------------------------------------------------------


async def no_one(scope: Any) -> str:
    return "alice"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("where", "warned"),
    [
        ("in the app's middleware", False),
        ("wrapping the app", True),  # no framework exposes an app holding it
        ("mounted", True),  # Starlette replaced the mounting app in scope["app"]
        ("wrapping the app, with authenticate", False),  # the hook guards the handshake
    ],
)
async def test_turns_that_may_miss_outer_http_middleware_are_warned_about(
    where: str, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    scope: dict[str, Any] = {"type": "websocket", "path": "/v1/responses"}
    if where.startswith("wrapping the app"):
        hook = no_one if where.endswith("authenticate") else None
        middleware = WebSocketModeMiddleware(Starlette(routes=ROUTES), authenticate=hook)
    else:
        app = Starlette(routes=ROUTES, middleware=[Middleware(WebSocketModeMiddleware)])
        await start(app)
        (middleware,) = find(app, WebSocketModeMiddleware)
        scope["app"] = app
        if where == "mounted":
            scope["app_root_path"] = "/api"
    with caplog.at_level(logging.WARNING, logger="ws_mode._stack"):
        say_where_turns_enter(scope, middleware.settings)
    said = [record.getMessage() for record in caplog.records]
    assert len(said) == (1 if warned else 0), said
    if warned:
        assert "WebSocket mode at /v1/responses" in said[0]
        assert "authenticate=" in said[0]
