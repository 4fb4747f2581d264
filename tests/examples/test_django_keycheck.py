"""Django's middleware runs on socket turns: a key check in `MIDDLEWARE` refuses a socket turn
with a wrong key (an `error` event with status 401) as it refuses the plain `POST`.

ws_mode wraps Django's whole ASGI application, and Django runs its middleware inside it, so
every turn meets `MIDDLEWARE` whatever its order."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from websockets.sync.client import connect

from tests.examples import django_env
from tests.examples.django_keycheck import KEY
from tests.servers import serve
from ws_mode import WebSocketModeMiddleware


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    django_env.setup()
    from django.conf import settings
    from django.core.handlers.asgi import ASGIHandler
    from django.test import override_settings

    checked = ["tests.examples.django_keycheck.KeyCheck", *settings.MIDDLEWARE]
    with override_settings(MIDDLEWARE=checked):
        django_app = ASGIHandler()  # loads the middleware now
    with serve(WebSocketModeMiddleware(django_app), lifetime=60) as url:
        yield url


def socket_turn(base_url: str, key: str) -> dict[str, object]:
    url = base_url.replace("http", "ws", 1) + "/v1/responses"
    with connect(url, additional_headers={"x-api-key": key}, open_timeout=10) as ws:
        ws.send(json.dumps({"type": "response.create", "model": "m", "input": "Hello"}))
        while True:
            event = json.loads(ws.recv(timeout=10))
            if event["type"] in ("response.completed", "error"):
                return event


def test_a_wrong_key_is_refused_over_http_and_over_the_socket(base_url: str) -> None:
    body = {"model": "m", "input": "Hello"}
    over_http = httpx.post(
        base_url + "/v1/responses", json=body, headers={"x-api-key": "wrong"}, timeout=10
    )
    assert over_http.status_code == 401
    refused = socket_turn(base_url, "wrong")
    assert refused["type"] == "error"
    assert refused["status"] == 401
    assert refused["error"] == {
        "type": "invalid_request_error",
        "code": "invalid_api_key",
        "message": "No.",
        "param": None,
    }


def test_the_right_key_gets_the_answer(base_url: str) -> None:
    assert socket_turn(base_url, KEY)["type"] == "response.completed"
