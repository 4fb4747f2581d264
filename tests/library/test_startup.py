"""Mistakes caught at start: a bad option given through `app.add_middleware(...)` (made by
Starlette at the app's first call, the lifespan's) and a `handler_path` no route serves fail the
server's start with one line naming them, under a real uvicorn in its default `--lifespan auto`;
mounted sub-apps and routes with path parameters are no false alarms."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.routing import Route
from websockets.sync.client import connect

from tests.servers import ROOT, free_port, serve
from tests.startup_apps import respond
from ws_mode import WebSocketModeMiddleware
from ws_mode._errors import ConfigError


def start_fails(target: str) -> list[str]:
    """uvicorn's output lines when it serves `tests.startup_apps:<target>`, which must end by
    itself (a failed startup) without ever saying the startup completed."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "uvicorn", f"tests.startup_apps:{target}"]
    command += ["--port", str(free_port())]  # uvicorn's default --lifespan auto
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    lines = (done.stdout + done.stderr).splitlines()
    assert done.returncode != 0, lines
    assert not any("Application startup complete" in line for line in lines), lines
    assert any("Application startup failed. Exiting." in line for line in lines), lines
    return [line for line in lines if "WebSocket" in line]


def test_a_bad_option_through_add_middleware_fails_the_start_naming_it() -> None:
    (line,) = start_fails("bad_value")
    assert line.startswith("ERROR:")
    assert "steering must be True or False, got 'yes'" in line


def test_an_unknown_option_through_add_middleware_fails_the_start_naming_it() -> None:
    (line,) = start_fails("unknown_option")
    assert "no option 'steerng'" in line
    assert "steering" in line  # the options it has


def test_a_handler_path_no_route_serves_fails_the_start() -> None:
    (line,) = start_fails("missing_route")
    assert "no route of the application serves POST /v1/respones" in line
    assert "handler_path='/v1/respones'" in line


def test_a_bad_option_made_directly_still_raises_at_once() -> None:
    with pytest.raises(ConfigError, match="steering must be True or False"):
        WebSocketModeMiddleware(respond, steering="yes")  # type: ignore[arg-type]  # a request handler, never called
    with pytest.raises(ConfigError, match="no option 'steerng'"):
        WebSocketModeMiddleware(respond, steerng=False)  # type: ignore[call-arg,arg-type]


@pytest.mark.parametrize("target", ["served", "served_by_a_path_parameter", "mounted"])
def test_routes_that_serve_the_handler_path_start(target: str) -> None:
    """A route at the path, one with a `{rest:path}` parameter, a mounted sub-app: served."""
    with serve(f"tests.startup_apps:{target}") as base_url:
        url = base_url.replace("http", "ws") + "/v1/responses"
        with connect(url) as socket:
            socket.send('{"type": "response.create", "model": "m", "input": []}')
            events = [json.loads(socket.recv(timeout=10))["type"] for _ in range(3)]
    assert events[-1] == "response.completed"  # the turn reached the handler


def test_a_route_without_post_fails_the_start() -> None:
    app = Starlette(routes=[Route("/v1/responses", respond, methods=["GET"])])
    assert lifespan_of(WebSocketModeMiddleware(app)) == (
        "lifespan.startup.failed",
        "WebSocket mode at /v1/responses: the route at /v1/responses does not take POST (turns "
        "would get 405 Method Not Allowed), where every turn goes (WebSocketModeMiddleware's "
        "handler_path='/v1/responses'). Give the path of the app's POST /v1/responses handler.",
    )


def test_an_app_without_routes_is_said_once_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    async def plain(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "lifespan.startup.complete"})

    with caplog.at_level(logging.INFO, logger="ws_mode._middleware"):
        assert lifespan_of(WebSocketModeMiddleware(plain))[0] == "lifespan.startup.complete"
    (record,) = [r for r in caplog.records if "handler_path" in r.getMessage()]
    assert "cannot check that it serves POST /v1/responses" in record.getMessage()


def lifespan_of(app: Any) -> tuple[str, str | None]:
    """The app's answer to a lifespan startup: its type and message (`raised` and the
    exception when it raised first: Django's application, for one, serves no lifespan)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "lifespan.startup"}

    async def run() -> tuple[str, str | None]:
        answered = asyncio.Event()

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            answered.set()

        task = asyncio.ensure_future(app({"type": "lifespan", "state": {}}, receive, send))
        waiting = asyncio.ensure_future(answered.wait())
        await asyncio.wait([task, waiting], return_when=asyncio.FIRST_COMPLETED)
        task.cancel()
        waiting.cancel()
        if not sent:
            return "raised", repr(task.exception())
        return sent[0]["type"], sent[0].get("message")

    return asyncio.run(run())


#: Run in a child: Django's settings, once configured, change how hooks run in this process.
DJANGO_CHILD = """
import asyncio, sys
from tests.examples.django_env import setup
setup()
from django.core.asgi import get_asgi_application
from ws_mode import WebSocketModeMiddleware
from tests.library.test_startup import lifespan_of
for handler_path in sys.argv[1:]:
    app = WebSocketModeMiddleware(get_asgi_application(), handler_path=handler_path)
    print(*lifespan_of(app))
"""


def test_a_handler_path_django_does_not_resolve_fails_the_start() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-c", DJANGO_CHILD, "/cached/v1/responses", "/v1/respones"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    served, missing = done.stdout.splitlines()
    assert served.startswith("raised ValueError('Django can only handle ASGI/HTTP")  # not failed
    assert missing.startswith("lifespan.startup.failed")
    assert "no URL pattern of the Django project serves /v1/respones" in missing
