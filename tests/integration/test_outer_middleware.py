"""A socket turn meets the HTTP middleware a plain `POST` meets, those outside ws_mode included.

A key check added after `WebSocketModeMiddleware` (so it is the outermost layer), as a pure ASGI
middleware or a `BaseHTTPMiddleware`, with `add_middleware` or `Middleware([...])`, in FastAPI
and Starlette: a wrong key gets the check's 401 over HTTP and, over the socket, an `error`
event with status 401; the right key gets the answer. Through an outer `BaseHTTPMiddleware`
events still stream one by one and a client that leaves cancels the handler; with
`stateful_http=True` the turn is not intercepted a second time on its way down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

import ws_mode
from tests.client_tls import CLIENT_TLS
from tests.integration.apps import sse, turn_events
from tests.integration.clients import Server, completed_response
from tests.servers import SERVERS, serve
from ws_mode import WebSocketModeMiddleware
from ws_mode._store import MemoryStore

KEY = "right-key"
UNAUTHORIZED = {
    "error": {"type": "invalid_request_error", "code": "invalid_api_key", "message": "Bad key."}
}


@dataclass
class Seen:
    """What the handler and the key check saw; shared with the server's thread."""

    bodies: list[dict[str, Any]] = field(default_factory=list)
    #: Requests the key check saw that were socket turns (`ws_mode.turn(scope)` set).
    checked_turns: int = 0
    #: How each endless stream ended: "cancelled", "closed" or "completed".
    endings: list[str] = field(default_factory=list)
    gate: threading.Event = field(default_factory=threading.Event)


class PureKeyCheck:
    """A pure ASGI middleware that answers 401 (JSON) to HTTP requests without the key."""

    def __init__(self, app: ASGIApp, seen: Seen) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if ws_mode.turn(scope) is not None:
                self.seen.checked_turns += 1
            if dict(scope["headers"]).get(b"x-api-key") != KEY.encode():
                await JSONResponse(UNAUTHORIZED, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BaseKeyCheck(BaseHTTPMiddleware):
    """The same check as a `BaseHTTPMiddleware`, answering 401 in plain text."""

    def __init__(self, app: ASGIApp, seen: Seen) -> None:
        super().__init__(app)
        self.seen = seen

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if ws_mode.turn(request) is not None:
            self.seen.checked_turns += 1
        if request.headers.get("x-api-key") != KEY:
            return PlainTextResponse("Bad key.", status_code=401)
        return await call_next(request)


CHECKS: dict[str, type[PureKeyCheck] | type[BaseKeyCheck]] = {
    "pure": PureKeyCheck,
    "base": BaseKeyCheck,
}


def routes(seen: Seen) -> list[Route]:
    """`POST /v1/responses` (models: scripted, gated, endless) and `GET /debug/tasks`."""

    async def respond(request: Request) -> Response:
        body = json.loads(await request.body())
        seen.bodies.append(body)
        item = {
            "type": "message",
            "id": "msg_" + uuid.uuid4().hex,
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Hello there.", "annotations": []}],
        }
        events = turn_events(body, item, "Hello there.", 3)
        model = body.get("model")
        if not body.get("stream"):
            return JSONResponse(events[-1]["response"])

        async def generate() -> AsyncIterator[str]:
            how = "closed"
            try:
                for number, event in enumerate(events):
                    if model == "gated" and number == 5:  # after the first delta
                        await asyncio.to_thread(seen.gate.wait, 10)
                    yield sse(event)
                    if model == "endless" and number == 5:
                        while True:
                            await asyncio.sleep(0.02)
                            yield sse({**event, "delta": "."})
                how = "completed"
            except asyncio.CancelledError:
                how = "cancelled"
                raise
            finally:
                seen.endings.append(how)

        return StreamingResponse(generate(), media_type="text/event-stream")

    async def tasks(request: Request) -> Response:
        """The tasks a turn could leave behind: those of ws_mode, the frameworks (a
        `BaseHTTPMiddleware` runs the app in a task group), anyio and this module; not the
        server's own connection tasks, which a server may keep a while after a close."""
        ours = ("/ws_mode/", "/starlette/", "/fastapi/", "/anyio/", "/tests/")
        count = 0
        for task in asyncio.all_tasks():
            code = getattr(task.get_coro(), "cr_code", None)
            filename = code.co_filename if code is not None else ""
            count += any(part in filename for part in ours)
        return JSONResponse({"count": count})

    return [
        Route("/v1/responses", respond, methods=["POST"]),
        Route("/debug/tasks", tasks, methods=["GET"]),
    ]


def build(framework: str, check: str, placement: str, seen: Seen, **options: Any) -> ASGIApp:
    """The app with ws_mode and the key check placed as `placement` says:

    - `added-after`: `add_middleware(WebSocketModeMiddleware)`, then `add_middleware(check)`
      (the check is the outermost layer);
    - `added-before`: the other way round (the check is inside ws_mode);
    - `constructor`: `middleware=[Middleware(check), Middleware(WebSocketModeMiddleware)]`
      (the first entry is the outermost).
    """
    cls = CHECKS[check]
    kind = FastAPI if framework == "fastapi" else Starlette
    if placement == "constructor":
        listed = [Middleware(cls, seen=seen), Middleware(WebSocketModeMiddleware, **options)]
        return kind(routes=routes(seen), middleware=listed)
    app = kind(routes=routes(seen))
    if placement == "added-after":
        app.add_middleware(WebSocketModeMiddleware, **options)
        app.add_middleware(cls, seen=seen)
    else:
        app.add_middleware(cls, seen=seen)
        app.add_middleware(WebSocketModeMiddleware, **options)
    return app


@contextlib.contextmanager
def running(app: ASGIApp, server: str = "uvicorn") -> Iterator[Server]:
    with serve(app, server) as base_url:
        yield Server(name=server, base_url=base_url, recorder=None)  # type: ignore[arg-type]


def turn(server: Server, key: str, model: str = "scripted", **fields: Any) -> list[dict[str, Any]]:
    with server.raw(headers={"x-api-key": key}) as ws:
        ws.send({"type": "response.create", "model": model, "input": "Hi", **fields})
        return ws.until_terminal()


@pytest.mark.parametrize("placement", ["added-after", "constructor", "added-before"])
@pytest.mark.parametrize("check", ["pure", "base"])
@pytest.mark.parametrize("framework", ["fastapi", "starlette"])
def test_the_key_check_guards_socket_turns_wherever_it_is_added(
    framework: str, check: str, placement: str
) -> None:
    seen = Seen()
    with running(build(framework, check, placement, seen)) as server:
        over_http = httpx.post(
            server.base_url + "/v1/responses",
            json={"model": "m", "input": "Hi"},
            headers={"x-api-key": "wrong"},
            timeout=5,
            verify=CLIENT_TLS,
        )
        assert over_http.status_code == 401
        refused = turn(server, "wrong")
        answered = turn(server, KEY)
    assert [event["type"] for event in refused] == ["error"]
    error = refused[0]
    assert error["status"] == 401
    assert error["error"]["type"] == "invalid_request_error"
    # The check's JSON error body reaches the client as it is; a plain-text one is the message.
    assert error["error"]["message"] == "Bad key."
    if check == "pure":
        assert error["error"]["code"] == "invalid_api_key"
    assert completed_response(answered)["output"][0]["content"][0]["text"] == "Hello there."
    assert len(seen.bodies) == 1  # the refused turn never reached the handler
    assert seen.checked_turns == 2


def _tasks(server: Server) -> int:
    answer = httpx.get(
        server.base_url + "/debug/tasks", headers={"x-api-key": KEY}, timeout=5, verify=CLIENT_TLS
    )
    count: int = answer.json()["count"]
    return count


def _settled_tasks(server: Server, before: int, timeout: float = 5.0) -> int:
    """The server's task count once it is back to `before`, or what it is after `timeout`."""
    deadline = time.monotonic() + timeout
    count = _tasks(server)
    while count > before and time.monotonic() < deadline:
        time.sleep(0.05)
        count = _tasks(server)
    return count


@pytest.mark.parametrize("server_name", SERVERS)
def test_events_stream_one_by_one_through_an_outer_base_http_middleware(server_name: str) -> None:
    seen = Seen()
    with running(build("fastapi", "base", "added-after", seen), server_name) as server:
        before = _tasks(server)
        with server.raw(headers={"x-api-key": KEY}) as ws:
            ws.send({"type": "response.create", "model": "gated", "input": "Hi"})
            # The first delta arrives while the handler still waits for the gate: not buffered.
            while ws.recv()["type"] != "response.output_text.delta":
                pass
            assert not seen.gate.is_set()
            seen.gate.set()
            completed_response(ws.until_terminal())
        after = _settled_tasks(server, before)
    assert seen.checked_turns == 1
    assert seen.endings == ["completed"]
    assert after <= before, f"{after - before} tasks left behind by a finished turn"


@pytest.mark.parametrize("server_name", SERVERS)
def test_leaving_cancels_the_handler_through_an_outer_base_http_middleware(
    server_name: str,
) -> None:
    seen = Seen()
    with running(build("fastapi", "base", "added-after", seen), server_name) as server:
        before = _tasks(server)
        with server.raw(headers={"x-api-key": KEY}) as ws:
            ws.send({"type": "response.create", "model": "endless", "input": "Hi"})
            deltas = 0
            while deltas < 3:
                deltas += ws.recv()["type"] == "response.output_text.delta"
        deadline = time.monotonic() + 5
        while not seen.endings and time.monotonic() < deadline:
            time.sleep(0.02)
        assert seen.endings
        assert seen.endings[0] in ("cancelled", "closed")
        after = _settled_tasks(server, before)
    assert seen.checked_turns == 1
    assert after <= before, f"{after - before} tasks left behind"


async def principal(scope: Scope) -> str:
    return "tenant-a"


def test_stateful_http_does_not_intercept_a_socket_turn_on_its_way_down() -> None:
    """With the whole app entered, the turn passes ws_mode's own middleware again: the
    stateful HTTP side must leave it alone (it was resolved against the socket's cache)."""
    seen = Seen()
    app = build(
        "fastapi",
        "pure",
        "added-after",
        seen,
        store=MemoryStore(),
        stateful_http=True,
        authenticate=principal,
        full_context="on_miss",
    )
    with running(app) as server:
        refused = turn(server, "wrong")
        with server.raw(headers={"x-api-key": KEY}) as ws:
            ws.send({"type": "response.create", "model": "m", "input": "One"})
            first = completed_response(ws.until_terminal())
            ws.send(
                {
                    "type": "response.create",
                    "model": "m",
                    "input": "Two",
                    "previous_response_id": first["id"],
                }
            )
            completed_response(ws.until_terminal())
    assert refused[-1]["type"] == "error"
    assert refused[-1]["status"] == 401
    assert len(seen.bodies) == 2  # one handler call per turn
    # The cache-aware turn reaches the handler as ws_mode built it: the parent's id and only
    # the new input, not the stored history the stateful side would have put in front.
    assert seen.bodies[1]["previous_response_id"] == first["id"]
    assert "One" not in json.dumps(seen.bodies[1]["input"])
    assert seen.checked_turns == 3


# Where no framework exposes the whole application, ws_mode says so once.


def _startup_lines(app: ASGIApp, caplog: pytest.LogCaptureFixture) -> list[str]:
    """The ws_mode warnings of serving one socket turn of `app` (no key check in it)."""
    with caplog.at_level(logging.WARNING, logger="ws_mode"), running(app) as server:
        for _ in range(2):
            completed_response(turn(server, KEY))
    return [r.getMessage() for r in caplog.records if r.name.startswith("ws_mode")]


def _inner(seen: Seen) -> Starlette:
    return Starlette(routes=routes(seen))


def test_a_bare_app_wrapped_from_outside_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    lines = _startup_lines(WebSocketModeMiddleware(_inner(Seen())), caplog)
    assert len(lines) == 1  # once, not per socket
    assert "HTTP middleware wrapped around it from outside" in lines[0]
    assert "authenticate=" in lines[0]


def test_a_mounted_app_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    """A sub-app's `scope["app"]` replaces the mounting app's: its middleware is not met."""
    inner = _inner(Seen())
    inner.add_middleware(WebSocketModeMiddleware)
    outer = Starlette(routes=[Mount("/api", app=inner)])
    with (
        caplog.at_level(logging.WARNING, logger="ws_mode"),
        running(outer) as server,
        server.raw("/api", headers={"x-api-key": KEY}) as ws,
    ):
        ws.send({"type": "response.create", "model": "m", "input": "Hi"})
        completed_response(ws.until_terminal())
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("ws_mode")]
    assert len(lines) == 1
    assert "mounts this one" in lines[0]


@pytest.mark.parametrize("shape", ["inside-the-app", "with-authenticate"])
def test_no_report_when_the_stack_is_entered_or_the_handshake_guarded(
    shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    seen = Seen()
    if shape == "inside-the-app":
        app: ASGIApp = FastAPI(routes=routes(seen))
        app.add_middleware(WebSocketModeMiddleware)
    else:
        app = WebSocketModeMiddleware(_inner(seen), authenticate=principal)
    assert _startup_lines(app, caplog) == []
