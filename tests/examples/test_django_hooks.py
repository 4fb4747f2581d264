"""A plain-function `authenticate` hook that queries Django's ORM, on the example project under
a real server: it works, and runs where Django requires sync code to (one thread,
thread-sensitive), while outside Django sync hooks run at once (tests/library/test_hooks.py)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from websockets.sync.client import connect

from tests.examples import django_env
from tests.servers import serve
from ws_mode import WebSocketModeMiddleware
from ws_mode._hooks import django_configured


def test_a_sync_orm_hook_runs_thread_sensitive_under_django() -> None:
    django_env.setup()
    from django.contrib.auth import get_user_model
    from django.core.asgi import get_asgi_application

    users = get_user_model().objects
    users.filter(username="hook-user").delete()
    users.create_user("hook-user", password="not-used")
    calls: list[tuple[int, bool]] = []

    def authenticate(scope: Any) -> str:
        found = users.filter(username="hook-user").exists()  # the ORM, from a sync hook
        calls.append((threading.get_ident(), found))
        time.sleep(0.05)  # long enough for the handshakes to overlap
        return "hook-user"

    assert django_configured()
    app = WebSocketModeMiddleware(get_asgi_application(), authenticate=authenticate)

    def handshake(url: str) -> None:
        with connect(url, open_timeout=30) as socket:
            socket.send('{"type": "response.create", "model": "m", "input": "hi"}')
            while '"response.completed"' not in str(socket.recv(timeout=30)):
                pass

    with serve(app, lifetime=60) as base_url, ThreadPoolExecutor(4) as clients:
        list(clients.map(handshake, [base_url.replace("http", "ws", 1) + "/v1/responses"] * 4))
    assert len(calls) == 4
    assert all(found for _, found in calls)
    assert len({thread for thread, _ in calls}) == 1  # Django's one thread for sync code
