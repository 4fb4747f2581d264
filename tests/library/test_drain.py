"""What a drain covers, on a real uvicorn (`ws_mode.server.Server`, told to exit as SIGTERM
does, and `ws-mode serve` sent SIGTERM) with the websockets client: an upgrade not yet
accepted when it begins (its `authenticate` hook still running) is answered 503
`server_shutting_down` with `Retry-After`; a draining socket starts no turn by any path (a
steer is refused, a queued create is not started, no successor runs for steering input
accepted before); and the access log says when the drain began and how it ended, and logs the
refused creates with their `previous_response_id`, apart from the turns. Plain uvicorn sent
SIGTERM answers such an upgrade itself, before the application hears of its shutdown."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.library.test_server import HANG, Held, config, running, send_create, until_closed
from tests.logfmt import read
from tests.servers import ws_mode_serve
from ws_mode import Limits, WebSocketModeMiddleware
from ws_mode._access_log import ACCESS_LOGGER
from ws_mode.server import Server
from ws_mode.testing._loopback import server_process


async def until(condition: Callable[[], bool]) -> None:
    """Poll `condition` until it holds (within `HANG`)."""
    async with asyncio.timeout(HANG):
        while not condition():  # noqa: ASYNC110 (the condition has no event to wait on)
            await asyncio.sleep(0.01)


def access_fields(caplog: pytest.LogCaptureFixture, prefix: str) -> list[dict[str, str]]:
    """The fields of the access log's lines starting with `prefix`, as logfmt reads them."""
    return [
        {key: value for key, value in read(record.getMessage()) if value is not None}
        for record in caplog.records
        if record.name == ACCESS_LOGGER and record.getMessage().startswith(prefix)
    ]


async def upgrade(url: str, **headers: str) -> tuple[int, dict[str, str]]:
    """Open a socket: the HTTP status that refused it and its headers, or 101 (closed at
    once) when it was accepted."""
    try:
        async with connect(url, additional_headers=headers, open_timeout=HANG):
            return 101, {}
    except InvalidStatus as refused:
        return refused.response.status_code, dict(refused.response.headers)


class SlowAuthentication:
    """An `authenticate` hook that holds the upgrades asking for it (`x-slow`) until let go."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, scope: dict[str, Any]) -> str:
        if (b"x-slow", b"1") in scope["headers"]:
            self.entered.set()
            await self.release.wait()
        return "someone"


@pytest.mark.anyio
async def test_an_upgrade_in_authenticate_when_the_drain_begins_is_refused_503(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    held = Held()
    authenticate = SlowAuthentication()
    middleware = WebSocketModeMiddleware(
        Starlette(routes=held.routes()),
        authenticate=authenticate,
        limits=Limits(shutdown_grace_seconds=HANG),
    )
    server = Server(config(middleware), gc_threshold=None)
    async with running(server) as base_url:
        url = base_url + "/v1/responses"
        async with connect(url) as socket:  # a turn runs: the drain lasts until it ends
            await send_create(socket)
            await asyncio.wait_for(held.started.wait(), HANG)
            slow = asyncio.create_task(upgrade(url, **{"x-slow": "1"}))
            await asyncio.wait_for(authenticate.entered.wait(), HANG)
            server.should_exit = True  # what SIGTERM does
            await until(lambda: middleware._draining)
            # The hook ends after the drain began, as a slow one does: the upgrade must not be
            # accepted into a server that is going away.
            authenticate.release.set()
            status, headers = await asyncio.wait_for(slow, HANG)
            assert status == 503, status
            assert headers.get("retry-after") == "1"
            held.release.set()
            kinds, code = await until_closed(socket)
    assert kinds[-1] == "response.completed"
    assert code == 1001
    assert middleware.stats.turns == 1
    (began,) = access_fields(caplog, "drain began")
    assert (began["sockets"], began["turns"], began["upgrades"]) == ("1", "1", "1")
    (ended,) = access_fields(caplog, "drain ended")
    assert (ended["sockets"], ended["turns_finished"], ended["turns_cut"]) == ("1", "1", "0")


class Streamer:
    """A handler streaming one message item, held after its first event until let go; it
    records each call."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.release = asyncio.Event()

    async def respond(self, request: Request) -> StreamingResponse:
        body = await request.json()
        self.calls.append(body)
        response_id = f"resp_{len(self.calls)}"
        return StreamingResponse(self._events(response_id, body), media_type="text/event-stream")

    async def _events(self, response_id: str, body: dict[str, Any]) -> AsyncIterator[str]:
        response = {"id": response_id, "object": "response", "status": "in_progress",
                    "model": body["model"], "output": []}  # fmt: skip
        part = {"type": "output_text", "text": "hi", "annotations": []}
        item = {"type": "message", "id": f"msg_{response_id}", "role": "assistant",
                "status": "completed", "content": [part]}  # fmt: skip
        events = [
            {"type": "response.created", "response": response},
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**item, "status": "in_progress", "content": []},
            },
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {
                "type": "response.completed",
                "response": {**response, "status": "completed", "output": [item]},
            },
        ]
        for number, event in enumerate(events):
            if number == 2:
                await self.release.wait()
            event = {**event, "sequence_number": number}
            yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"

    def routes(self) -> list[Route]:
        return [Route("/v1/responses", self.respond, methods=["POST"])]


async def next_event(socket: ClientConnection, kind: str) -> dict[str, Any]:
    async with asyncio.timeout(HANG):
        while True:
            event: dict[str, Any] = json.loads(await socket.recv())
            if event["type"] == kind:
                return event


async def rest(socket: ClientConnection) -> list[dict[str, Any]]:
    """The events received until the server closed the socket."""
    events: list[dict[str, Any]] = []
    try:
        async with asyncio.timeout(HANG):
            async for text in socket:
                events.append(json.loads(text))
    except ConnectionClosed:
        pass
    return events


async def send(socket: ClientConnection, event: dict[str, Any]) -> None:
    await socket.send(json.dumps(event))


@pytest.mark.anyio
async def test_a_draining_socket_starts_no_turn_by_any_path(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    handler = Streamer()
    middleware = WebSocketModeMiddleware(
        Starlette(routes=handler.routes()), limits=Limits(shutdown_grace_seconds=HANG)
    )
    server = Server(config(middleware), gc_threshold=None)
    async with running(server) as base_url, connect(base_url + "/v1/responses") as socket:
        await send(socket, {"type": "response.create", "model": "m", "input": "hi"})
        first = (await next_event(socket, "response.created"))["response"]["id"]
        # Before the drain: steering input for the running response (a successor would
        # continue it), and a continuation queued behind it on its lane.
        steer = {"type": "response.steer", "previous_response_id": first}
        await send(socket, {**steer, "input": "before"})
        accepted = await next_event(socket, "response.steer.accepted")
        await send(socket, {"type": "response.create", "model": "m", "input": "next",
                            "previous_response_id": first})  # fmt: skip
        server.should_exit = True  # what SIGTERM does
        await until(lambda: middleware._draining)
        await send(socket, {**steer, "input": "during"})
        refused = await next_event(socket, "response.steer.failed")
        handler.release.set()
        events = await rest(socket)
        code = socket.close_code
    # The steer sent during the drain: refused at once, its input back, as a create is.
    assert refused["error"]["code"] == "server_shutting_down"
    assert refused["steer"]["input"] == "during"
    # The input accepted before: no successor takes it, it comes back.
    (returned,) = [event for event in events if event["type"] == "response.steer.failed"]
    assert returned["error"]["code"] == "server_shutting_down"
    assert returned["steer"]["id"] == accepted["steer"]["id"]
    assert returned["steer"]["input"] == "before"
    # The queued continuation never started.
    (error,) = [event for event in events if event["type"] == "error"]
    assert error["error"]["code"] == "server_shutting_down"
    assert not [event for event in events if event["type"] == "response.created"]
    assert len(handler.calls) == 1  # only the turn that ran when the drain began
    assert code == 1001
    # The access log: the refused continuation with its previous id, counted apart.
    lines = access_fields(caplog, "127.0.0.1")
    (line,) = [fields for fields in lines if fields.get("code") == "server_shutting_down"]
    assert line["previous"] == first
    (connection,) = [fields for fields in lines if "by" in fields]
    assert (connection["turns"], connection["refused"]) == ("1", "1")
    (ended,) = access_fields(caplog, "drain ended")
    assert (ended["turns_finished"], ended["turns_cut"]) == ("1", "0")


#: An app for `ws-mode serve --app`: a turn held until a file exists, an authenticate hook
#: holding the upgrades that ask (`x-slow`) until another file exists (as a slow hook that ends
#: once the shutdown has begun).
SLOW_APP = """
import asyncio, os
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from ws_mode import WebSocketModeMiddleware

async def authenticate(scope):
    if (b"x-slow", b"1") in scope["headers"]:
        open(os.environ["AUTH_ENTERED"], "w").close()
        for _ in range(3000):
            if os.path.exists(os.environ["AUTH_RELEASE"]):
                break
            await asyncio.sleep(0.01)
    return "someone"

async def respond(request):
    await request.body()
    open(os.environ["TURN_STARTED"], "w").close()
    while not os.path.exists(os.environ["TURN_RELEASE"]):
        await asyncio.sleep(0.01)
    item = {"type": "message", "role": "assistant", "status": "completed", "content": []}
    return JSONResponse({"id": "resp_1", "object": "response", "status": "completed",
                         "output": [item]})

app = WebSocketModeMiddleware(
    Starlette(routes=[Route("/v1/responses", respond, methods=["POST"])]),
    authenticate=authenticate,
)
"""


NAMES = ("AUTH_ENTERED", "AUTH_RELEASE", "TURN_STARTED", "TURN_RELEASE")


async def until_exists(path: Path) -> None:
    await until(path.exists)


async def until_not_listening(url: str) -> None:
    """Wait until nothing listens at `url`'s port: the server's shutdown has begun (`Server`
    and uvicorn close their listening sockets first)."""
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    async with asyncio.timeout(HANG):
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except ConnectionRefusedError:
                return
            writer.close()
            await asyncio.sleep(0.01)


@pytest.mark.anyio
async def test_ws_mode_serve_sent_sigterm_refuses_an_upgrade_still_in_authenticate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "slow_app.py").write_text(textwrap.dedent(SLOW_APP))
    files = {name: tmp_path / name for name in NAMES}
    for name, path in files.items():
        monkeypatch.setenv(name, str(path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    with ws_mode_serve("--app", "slow_app:app", cwd=tmp_path) as served:
        url = served.origin.replace("http", "ws") + "/v1/responses"
        async with connect(url, open_timeout=HANG) as socket:
            await send_create(socket)
            await until_exists(files["TURN_STARTED"])
            slow = asyncio.create_task(upgrade(url, **{"x-slow": "1"}))
            await until_exists(files["AUTH_ENTERED"])
            sent = time.monotonic()
            served.process.send_signal(signal.SIGTERM)
            await until_not_listening(url)  # the drain has begun
            files["AUTH_RELEASE"].touch()  # the hook ends now, after the drain began
            status, headers = await asyncio.wait_for(slow, HANG)
            answered = time.monotonic() - sent
            files["TURN_RELEASE"].touch()
            kinds, code = await until_closed(socket)
    assert (status, headers.get("retry-after")) == (503, "1")
    assert kinds[-1] == "response.completed"
    assert code == 1001
    print(f"the upgrade in authenticate was refused {answered:.3f}s after SIGTERM")


#: A child of `server_process` (plain uvicorn, lifespan on): the same app, its access log in
#: the file `ACCESS_LOG` names.
PLAIN_UVICORN_CHILD = """
import argparse, logging, os
from slow_app import app
from ws_mode.testing._loopback import add_child_arguments, serve_inherited

access = logging.getLogger("ws_mode.access")
access.setLevel(logging.INFO)
access.addHandler(logging.FileHandler(os.environ["ACCESS_LOG"]))
parser = argparse.ArgumentParser()
add_child_arguments(parser)
serve_inherited(app, parser.parse_args(), lifespan="on")
"""


@pytest.mark.anyio
async def test_plain_uvicorn_sent_sigterm_never_accepts_an_upgrade_still_in_authenticate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain uvicorn (no `Server`) closes its sockets (1012) and answers the upgrades not yet
    accepted itself (500) as its shutdown begins, before the application hears of it: the
    middleware cannot make that a 503 or give turns a grace. What it does: the upgrade whose
    hook ends afterwards is never accepted, and the drain at the lifespan shutdown says what it
    found (nothing left: uvicorn closed it all)."""
    (tmp_path / "slow_app.py").write_text(textwrap.dedent(SLOW_APP))
    (tmp_path / "plain_uvicorn_child.py").write_text(textwrap.dedent(PLAIN_UVICORN_CHILD))
    files = {name: tmp_path / name for name in NAMES}
    for name, path in files.items():
        monkeypatch.setenv(name, str(path))
    access_log = tmp_path / "access.log"
    monkeypatch.setenv("ACCESS_LOG", str(access_log))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    with server_process("plain_uvicorn_child", lifetime=120) as child:
        url = child.base_url.replace("http", "ws") + "/v1/responses"
        async with connect(url, open_timeout=HANG) as socket:
            await send_create(socket)
            await until_exists(files["TURN_STARTED"])
            slow = asyncio.create_task(upgrade(url, **{"x-slow": "1"}))
            await until_exists(files["AUTH_ENTERED"])
            os.kill(child.pid, signal.SIGTERM)
            await until_not_listening(url)  # uvicorn's shutdown has begun
            files["AUTH_RELEASE"].touch()
            status, _ = await asyncio.wait_for(slow, HANG)
            kinds, code = await until_closed(socket)
        await until(lambda: "drain ended" in access_log.read_text())
    assert status == 500  # uvicorn's own answer, before the app hears of the shutdown
    assert "response.completed" not in kinds
    assert code == 1012
    lines = access_log.read_text().splitlines()
    # The drain came after uvicorn had closed every socket and waited for the upgrade's hook.
    (began,) = [dict(read(line)) for line in lines if line.startswith("drain began")]
    assert (began["sockets"], began["turns"], began["upgrades"]) == ("0", "0", "0")
    # The upgrade in authenticate: its accept went to a socket uvicorn had closed (1006), and
    # it took no turn.
    closed = [dict(read(line)) for line in lines if '"WebSocket /v1/responses"' in line]
    assert sorted((fields["by"], fields["turns"]) for fields in closed) == [
        ("client", "0"),
        ("server", "1"),
    ]
