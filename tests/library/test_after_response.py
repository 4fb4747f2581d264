"""Work after a response (`ws_mode._after_response.AfterResponses`) gets
`Limits.after_response_grace_seconds` once its connection closed, then is cancelled."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

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
