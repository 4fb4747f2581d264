"""The README's app (examples/fastapi_app.py) with a memory budget the tests choose and the
RSS harness's `/stats`: what tests/library/test_memory_servers.py serves under the README's
own uvicorn command line.

The budget is `Limits.max_memory_bytes` from the variable `WS_MODE_TEST_BUDGET` (bytes; the
default budget without it); the handler is the README's. `GET /stats` answers the process's
RSS (`rss`) beside the middleware's `stats.snapshot()`.
"""

from __future__ import annotations

import os
from typing import Any

from fastapi import FastAPI

from examples.fastapi_app import create
from tests.rss_server import rss
from ws_mode import Limits, WebSocketModeMiddleware, find_middlewares

#: The variable that sets the budget, in bytes.
BUDGET_VARIABLE = "WS_MODE_TEST_BUDGET"

app = FastAPI()
budget = int(os.environ.get(BUDGET_VARIABLE, Limits().max_memory_bytes))
app.add_middleware(WebSocketModeMiddleware, limits=Limits(max_memory_bytes=budget))
app.post("/v1/responses")(create)


@app.get("/stats")
async def stats() -> dict[str, Any]:
    """The process's RSS and what the middleware counted."""
    [middleware] = find_middlewares(app)
    return {"rss": rss(), **middleware.stats.snapshot()}
