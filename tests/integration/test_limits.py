"""Connection limits, and what a client that leaves leaves behind (nothing)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from typing import Any

import httpx
import pytest
from openai.types.responses.responses_server_event import ResponseWsError
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.client_tls import CLIENT_TLS
from tests.integration.clients import Server, async_recv, completed_response, create


def ws_mode_tasks(http: httpx.Client) -> tuple[int, list[str]]:
    """The server loop's task count, and the tasks running ws_mode's code.

    Ask over one kept-alive HTTP connection: hypercorn keeps the tasks of a closed HTTP
    connection for a while, which would blur the count if each probe used a new one.
    """
    answer = http.get("/debug/tasks").json()
    mine = [
        task["name"] for task in answer["tasks"] if "/ws_mode/" in task["file"].replace("\\", "/")
    ]
    return answer["count"], mine


def wait_until(predicate: Any, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def test_connection_lifetime_limit(server: Server, tag: str) -> None:
    with server.raw("/short") as ws:
        started = time.monotonic()
        ws.send(create(tag, input="Hi", meta={"k": "0"}))
        completed_response(ws.until_terminal())
        error = ws.recv(timeout=30)  # a hang, not a speed
        elapsed = time.monotonic() - started
        assert error == {
            "type": "error",
            "sequence_number": 0,
            "status": 400,
            "error": {
                "type": "invalid_request_error",
                "code": "websocket_connection_limit_reached",
                "message": error["error"]["message"],
                "param": None,
            },
        }
        assert elapsed > 0.8  # not before the 1 s lifetime (an upper bound would be a speed)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1001


def test_connection_lifetime_limit_cancels_a_running_turn(server: Server, tag: str) -> None:
    with server.raw("/short") as ws:
        ws.send(create(tag, "slow", input="Hi", stream_id="s"))
        events: list[dict[str, Any]] = []

        def read_until_closed() -> None:
            while True:
                events.append(ws.recv(timeout=5))

        with pytest.raises(ConnectionClosed) as closed:
            read_until_closed()
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1001
    assert events[0]["type"] == "response.created"
    errors = [event for event in events if event["type"] == "error"]
    assert [error["error"]["code"] for error in errors] == ["websocket_connection_limit_reached"]
    assert events[-1] is errors[0]
    [call] = server.recorder.settled(tag, 1, timeout=30)
    assert call.exit in ("cancelled", "closed")


@pytest.mark.anyio
async def test_connection_lifetime_limit_with_the_async_sdk(server: Server, tag: str) -> None:
    async with server.async_openai("/short") as client, client.responses.connect() as conn:
        event = await async_recv(conn, 5)
        assert isinstance(event, ResponseWsError)
        assert event.status == 400
        assert event.error.code == "websocket_connection_limit_reached"
        with pytest.raises(ConnectionClosed) as closed:
            await async_recv(conn, 5)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1001


def test_max_connections_refuses_the_upgrade_with_426(server: Server, tag: str) -> None:
    # Both uvicorn and hypercorn offer the WebSocket denial response extension, so both
    # answer an HTTP 426 with ws_mode's JSON error body (not a close after an accept).
    with server.raw("/single") as first:
        first.send(create(tag, input="Hi", meta={"k": "0"}))
        completed_response(first.until_terminal())
        with pytest.raises(InvalidStatus) as refused, server.raw("/single"):
            pass
        assert refused.value.response.status_code == 426
        body = json.loads(refused.value.response.body)
        assert body["error"]["code"] == "websocket_connection_limit_reached"
        # The SDK gets the same refusal.
        with pytest.raises(InvalidStatus) as refused, server.connect("/single"):
            pass
        assert refused.value.response.status_code == 426
        # The open connection is unaffected.
        first.send(create(tag, input="Again", meta={"k": "0"}))
        completed_response(first.until_terminal())

    # Once it closes, the slot is free again.
    def connects() -> bool:
        try:
            with server.raw("/single") as again:
                again.send(create(tag, input="Hi", meta={"k": "0"}))
                completed_response(again.until_terminal())
        except InvalidStatus:
            return False
        return True

    assert wait_until(connects, timeout=5, interval=0.1)


def _drop(ws: Any) -> None:
    """Vanish without a close frame."""
    sock = ws.ws.socket
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@pytest.mark.parametrize("how", ["close", "drop"])
def test_client_leaving_mid_stream_cancels_the_handler(server: Server, tag: str, how: str) -> None:
    with httpx.Client(verify=CLIENT_TLS, base_url=server.base_url, timeout=5) as http:
        check_leaving_mid_stream(server, http, tag, how)


def check_leaving_mid_stream(server: Server, http: httpx.Client, tag: str, how: str) -> None:
    assert wait_until(lambda: not ws_mode_tasks(http)[1], timeout=30), ws_mode_tasks(http)
    baseline, _ = ws_mode_tasks(http)
    with server.raw() as ws:
        ws.send(create(tag, "slow", input="Hi", stream_id="a"))
        ws.send(create(tag, "slow", input="Hi"))
        deltas = 0
        while deltas < 6:
            deltas += ws.recv()["type"] == "response.output_text.delta"
        during, mine = ws_mode_tasks(http)
        assert during > baseline
        assert mine  # the lanes' tasks
        calls = server.recorder.for_tag(tag)
        assert len(calls) == 2
        assert all(call.ended is None for call in calls)
        left = time.monotonic()
        if how == "drop":
            _drop(ws)
    # The slow handlers stream forever: the bounds here catch a hang, not a speed.
    calls = server.recorder.settled(tag, 2, timeout=30)
    for call in calls:
        assert call.exit in ("cancelled", "closed")
        assert call.ended is not None
        assert call.ended - left < 30
    # Nothing of the connection is left in the server's loop.
    assert wait_until(lambda: ws_mode_tasks(http)[0] <= baseline, timeout=30), (
        baseline,
        ws_mode_tasks(http),
    )
    assert ws_mode_tasks(http)[1] == []


@pytest.mark.anyio
async def test_async_sdk_leaving_mid_stream_cancels_the_handler(server: Server, tag: str) -> None:
    async with server.async_openai() as client, client.responses.connect() as conn:
        await conn.response.create(model="slow", input="Hi", metadata={"tag": tag})
        deltas = 0
        while deltas < 3:
            deltas += (await async_recv(conn)).type == "response.output_text.delta"
        left = time.monotonic()
    # The slow handler streams forever: the bounds here catch a hang, not a speed.
    calls = server.recorder.settled(tag, 1, timeout=30)
    assert calls[0].exit in ("cancelled", "closed")
    assert calls[0].ended is not None
    assert calls[0].ended - left < 30
