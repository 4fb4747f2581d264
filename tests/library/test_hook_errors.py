"""An exception a hook of the application raises is reported as the application's, under
uvicorn with a real socket client (and httpx for stateful HTTP): one ERROR line that names the
hook and the exception, with the traceback, once per failure; the client's error names the
stage (`server_error`, `param` the hook's keyword, "The application's renderer failed on this
request.") and nothing of the exception; the socket goes on, its cached responses kept, where
the failure was one turn's."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from websockets.exceptions import InvalidStatus

from tests.servers import serve
from ws_mode import Turn, WebSocketModeMiddleware
from ws_mode._store import MemoryStore
from ws_mode.testing._client import SyncSocket, connect

SECRET = "s3cr3t-detail"


async def handler(request: Request) -> JSONResponse:
    """Answers every turn at once, echoing its last input's text."""
    body = await request.json()
    given = body["input"]
    last = given if isinstance(given, str) else str(given[-1].get("content"))
    text = "echo: " + last
    item = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }
    return JSONResponse(
        {
            "id": f"resp_{time.monotonic_ns()}",
            "object": "response",
            "status": "completed",
            "output": [item],
        }
    )


def app(**options: Any) -> WebSocketModeMiddleware:
    routes = [Route("/v1/responses", handler, methods=["POST"])]
    return WebSocketModeMiddleware(Starlette(routes=routes), **options)


def create(text: str, previous: str | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "response.create", "model": "m", "input": text}
    if previous is not None:
        event["previous_response_id"] = previous
    return event


def turn(socket: SyncSocket, text: str, previous: str | None = None) -> dict[str, Any]:
    """The terminal event of one turn."""
    socket.send(create(text, previous))
    return socket.receive_turn(timeout=20)[-1]


def completed(socket: SyncSocket, text: str, previous: str | None = None) -> str:
    end = turn(socket, text, previous)
    assert end["type"] == "response.completed", end
    response_id: str = end["response"]["id"]
    return response_id


def hook_lines(caplog: pytest.LogCaptureFixture, hook: str) -> list[logging.LogRecord]:
    """The ERROR records of ws_mode that say `hook` raised."""
    return [
        record
        for record in caplog.records
        if record.name.startswith("ws_mode")
        and record.levelno == logging.ERROR
        and record.getMessage().startswith(f"{hook} raised ")
    ]


def wait_for_lines(caplog: pytest.LogCaptureFixture, hook: str, count: int) -> None:
    deadline = time.monotonic() + 20
    while len(hook_lines(caplog, hook)) < count and time.monotonic() < deadline:
        time.sleep(0.02)


def assert_one_line(caplog: pytest.LogCaptureFixture, hook: str, said: str) -> None:
    """Exactly one ERROR line names `hook` and the exception, with its traceback; no other
    ERROR line of ws_mode carries a traceback for it."""
    lines = hook_lines(caplog, hook)
    assert len(lines) == 1, [record.getMessage() for record in lines]
    assert lines[0].getMessage().startswith(f"{hook} raised {said}"), lines[0].getMessage()
    assert lines[0].exc_info is not None
    assert lines[0].exc_info[0] is not None
    others = [
        record.getMessage()
        for record in caplog.records
        if record.name.startswith("ws_mode") and record.exc_info and record not in lines
    ]
    assert not others, others


def names_the_hook(error: dict[str, Any], hook: str, message: str) -> None:
    assert error["type"] == "server_error"
    assert error["code"] == "server_error"
    assert error["param"] == hook
    assert error["message"] == message
    assert SECRET not in orjson.dumps(error).decode()  # nothing of the exception


@pytest.fixture(autouse=True)
def errors(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="ws_mode")


def render(items: list[dict[str, Any]]) -> Iterable[int]:
    """A tokenizer that refuses input over its size, as a real one may."""
    for item in items:
        if "TOO-LONG" in str(item.get("content")):
            raise ValueError(f"input over 1 MB ({SECRET})")
    return [len(items)]


@pytest.mark.parametrize("full_context", ["always", "on_miss"])
def test_a_renderer_that_raises_fails_the_turn_and_says_so(
    caplog: pytest.LogCaptureFixture, full_context: str
) -> None:
    served = app(renderer=render, full_context=full_context)
    with serve(served) as base_url, connect(base_url) as socket:
        first = completed(socket, "hi")
        end = turn(socket, "TOO-LONG", first)
        assert end["type"] == "error", end
        assert end["status"] == 500
        names_the_hook(
            end["error"], "renderer", "The application's renderer failed on this request."
        )
        # The socket goes on, and the response the failed turn continued is still cached.
        second = completed(socket, "short", first)
        completed(socket, "and on", second)
    assert_one_line(caplog, "renderer", f"ValueError: input over 1 MB ({SECRET})")
    assert "the turn fails" in hook_lines(caplog, "renderer")[0].getMessage()


def test_a_renderer_that_raises_on_an_output_fails_the_turn_that_continues_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The output is rendered after the response, off the next turn's path: its failure is
    logged there, and a turn continuing that response fails with the renderer named; the
    socket and its other responses go on."""

    def render_output(items: list[dict[str, Any]]) -> list[int]:
        if any(item.get("role") == "assistant" and "POISON" in str(item) for item in items):
            raise RuntimeError(SECRET)
        return [1] * len(items)

    with serve(app(renderer=render_output)) as base_url, connect(base_url) as socket:
        first = completed(socket, "hi")
        poisoned = completed(socket, "say POISON", first)
        wait_for_lines(caplog, "renderer", 1)
        lines = hook_lines(caplog, "renderer")
        assert len(lines) == 1
        assert lines[0].getMessage().startswith(f"renderer raised RuntimeError: {SECRET}")
        assert "a turn continuing it fails" in lines[0].getMessage()
        end = turn(socket, "next", poisoned)
        assert end["type"] == "error", end
        names_the_hook(
            end["error"], "renderer", "The application's renderer failed on this request."
        )
        completed(socket, "still here", first)
    assert len(hook_lines(caplog, "renderer")) == 2  # one line per failure


def test_an_on_response_hook_that_raises_is_named_and_the_socket_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client has its response when the hook runs: nothing is sent for it."""
    calls: list[str] = []

    async def on_response(current: Turn, response: dict[str, Any]) -> None:
        calls.append(response["id"])
        raise KeyError(SECRET)

    with serve(app(on_response=on_response)) as base_url, connect(base_url) as socket:
        first = completed(socket, "hi")
        wait_for_lines(caplog, "on_response", 1)
        completed(socket, "again", first)
        wait_for_lines(caplog, "on_response", 2)
    lines = hook_lines(caplog, "on_response")
    assert len(lines) == 2 == len(calls)  # once per failure
    assert lines[0].getMessage().startswith(f"on_response raised KeyError: '{SECRET}'")
    assert "the socket goes on" in lines[0].getMessage()
    assert all(record.exc_info for record in lines)


def refused(base_url: str) -> tuple[int, dict[str, Any]]:
    with pytest.raises(InvalidStatus) as refusal:
        connect(base_url).close()
    response = refusal.value.response
    return response.status_code, orjson.loads(response.body or b"{}")["error"]


def raising_authenticate(scope: Any) -> str:
    raise ConnectionError(f"the auth service is down ({SECRET})")


class Caller:
    """A principal with no key of its own: `principal_key` names it."""


def raising_key(principal: Any) -> str:
    raise AttributeError(SECRET)


def test_an_authenticate_hook_that_raises_refuses_the_upgrade_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with serve(app(authenticate=raising_authenticate)) as base_url:
        status, error = refused(base_url)
    assert status == 500
    names_the_hook(
        error, "authenticate", "The application's authenticate hook failed on this request."
    )
    assert_one_line(caplog, "authenticate", "ConnectionError: the auth service is down")


def test_a_principal_key_function_that_raises_refuses_the_upgrade_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    options = {"authenticate": lambda scope: Caller(), "principal_key": raising_key}
    with serve(app(store=MemoryStore(), **options)) as base_url:
        status, error = refused(base_url)
    assert status == 500
    names_the_hook(
        error, "principal_key", "The application's principal_key function failed on this request."
    )
    assert_one_line(caplog, "principal_key", f"AttributeError: {SECRET}")


def test_a_handshake_headers_hook_that_raises_refuses_the_upgrade_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def headers(scope: Any, principal: Any) -> dict[str, str]:
        raise LookupError(SECRET)

    with serve(app(handshake_headers=headers)) as base_url:
        status, error = refused(base_url)
    assert status == 500
    names_the_hook(
        error,
        "handshake_headers",
        "The application's handshake_headers hook failed on this request.",
    )
    assert_one_line(caplog, "handshake_headers", f"LookupError: {SECRET}")


def test_an_authenticate_hook_that_raises_on_an_open_socket_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With `reauthenticate_seconds`, the hook runs again before work: raising there refuses
    the work with the hook named (and, as for a refused credential, closes the socket)."""
    checks: list[int] = []

    def flaky(scope: Any) -> str:
        checks.append(1)
        if len(checks) > 1:
            raise TimeoutError(SECRET)
        return "alice"

    served = app(authenticate=flaky, reauthenticate_seconds=0)
    with serve(served) as base_url, connect(base_url) as socket:
        end = turn(socket, "hi")
    assert end["type"] == "error", end
    names_the_hook(
        end["error"], "authenticate", "The application's authenticate hook failed on this request."
    )
    assert_one_line(caplog, "authenticate", f"TimeoutError: {SECRET}")


@pytest.mark.parametrize("hook", ["authenticate", "principal_key"])
def test_stateful_http_names_the_hook_that_raised(
    caplog: pytest.LogCaptureFixture, hook: str
) -> None:
    options: dict[str, Any] = {"store": MemoryStore(), "stateful_http": True}
    if hook == "authenticate":
        options["authenticate"] = raising_authenticate
    else:
        options |= {"authenticate": lambda scope: Caller(), "principal_key": raising_key}
    with serve(app(**options)) as base_url:
        answer = httpx.post(base_url + "/v1/responses", json={"model": "m", "input": "hi"})
        read = httpx.get(base_url + "/v1/responses/resp_1")
    for each in (answer, read):
        assert each.status_code == 500
        error = each.json()["error"]
        assert error["param"] == hook
        assert error["type"] == "server_error"
        assert hook in error["message"]
        assert SECRET not in each.text
    assert len(hook_lines(caplog, hook)) == 2  # one line per request that failed
