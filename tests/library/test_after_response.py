"""Work after a response (`ws_mode._after_response.AfterResponses`) gets
`Limits.after_response_grace_seconds` once its connection closed, then is cancelled."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import threading
from typing import Any

import pytest
from websockets.asyncio.client import connect

from tests.library.handler_call_kit import body, sse, start
from tests.servers import serve
from ws_mode import Limits, WebSocketModeMiddleware
from ws_mode._after_response import AfterResponses


async def _no_app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("no turn runs here")


@pytest.mark.anyio
async def test_work_after_a_response_gets_after_response_grace_seconds_once_the_socket_closed() -> (
    None
):
    middleware = WebSocketModeMiddleware(_no_app, limits=Limits(after_response_grace_seconds=0.3))
    after = AfterResponses(middleware.settings)
    quick = asyncio.create_task(asyncio.sleep(0.05))
    stuck = asyncio.create_task(asyncio.Event().wait())  # a hook that never returns
    after.track(quick)
    after.track(stuck)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(after.finish(), 10)  # 10 s: a hang, not a speed
    elapsed = loop.time() - started
    assert quick.done()
    assert not quick.cancelled()  # finished within the grace
    assert stuck.cancelled()  # cut at its end
    assert 0.3 <= elapsed < 4  # the bound set, not the 5 s default


def test_a_handler_running_on_is_cancelled_when_the_server_cancels_its_connection() -> None:
    """A handler still running after its terminal event, its connection cancelled by the
    server (hypercorn's `graceful_timeout` passed at shutdown) while it waited out the grace:
    the handler is cancelled, not left pending on the server's loop (hypercorn closes its loop
    without cancelling what still runs: "Task was destroyed but it is pending!")."""
    running_on = threading.Event()
    cancelled = threading.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        response = {"id": "resp_1", "object": "response", "status": "completed", "output": []}
        await send(start())
        await send(body(sse("response.created", response={**response, "status": "in_progress"})))
        await send(body(sse("response.completed", response=response)))
        running_on.set()
        try:
            await asyncio.Event().wait()  # work after the response that never ends
        except asyncio.CancelledError:
            cancelled.set()
            raise

    destroyed: list[str] = []

    class Destroyed(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "destroyed but it is pending" in record.getMessage():
                destroyed.append(record.getMessage())

    # A grace far longer than the server's shutdown timeout: the connection is cancelled in it.
    middleware = WebSocketModeMiddleware(app, limits=Limits(after_response_grace_seconds=600))
    catcher = Destroyed()
    logging.getLogger("asyncio").addHandler(catcher)
    try:
        with serve(middleware, "hypercorn", graceful_timeout=0.1) as base_url:

            async def one_turn() -> None:
                async with connect(base_url.replace("http", "ws", 1) + "/v1/responses") as ws:
                    await ws.send(json.dumps({"type": "response.create", "model": "m"}))
                    while json.loads(await ws.recv())["type"] != "response.completed":
                        pass

            asyncio.run(one_turn())
            assert running_on.wait(10)
        gc.collect()
    finally:
        logging.getLogger("asyncio").removeHandler(catcher)
    assert destroyed == []
    assert cancelled.is_set()  # ended by a cancellation, not thrown away with the loop


@pytest.mark.anyio
async def test_a_cancelled_connection_gives_its_work_no_grace() -> None:
    """The connection's task cancelled (its server's shutdown timeout), its `finish` cancels
    the work at once, however long the grace."""
    middleware = WebSocketModeMiddleware(_no_app, limits=Limits(after_response_grace_seconds=600))
    after = AfterResponses(middleware.settings)
    stuck = asyncio.create_task(asyncio.Event().wait())
    after.track(stuck)

    async def connection() -> None:
        try:
            await asyncio.Event().wait()
        finally:  # as `Connection._serve` ends, cancelled or not
            await after.finish()

    serving = asyncio.create_task(connection())
    await asyncio.sleep(0)
    serving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(serving, 10)  # 10 s: a hang, not a speed (the grace is 600 s)
    assert stuck.cancelled()
