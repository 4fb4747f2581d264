"""An app whose module builds its Redis store from a malformed URL (the port is no number),
for tests/toolkit/cli/test_serve_app_errors.py."""

from __future__ import annotations

from fastapi import FastAPI

from ws_mode import WebSocketModeMiddleware
from ws_mode.redis_store import RedisStore

app = FastAPI()
app.add_middleware(
    WebSocketModeMiddleware,
    store=RedisStore("redis://:secret@localhost:notaport/0"),
    shared_store=True,
)
