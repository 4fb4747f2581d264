"""An app with middleware of its own inside ws_mode: GZip and `@app.middleware("http")`."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.client_tls import CLIENT_TLS
from tests.integration.apps import create_app
from tests.integration.clients import Server, completed_response, create
from tests.servers import SERVERS, serve

GZIP = {"Accept-Encoding": "gzip"}


@pytest.fixture(scope="module", params=SERVERS)
def stacked(request: pytest.FixtureRequest) -> Iterator[Server]:
    app = create_app(inner_middleware=True)
    with serve(app.asgi, request.param) as base_url:
        yield Server(name=request.param, base_url=base_url, recorder=app.recorder)


def test_gzip_is_active_over_plain_http(stacked: Server, tag: str) -> None:
    body = {"model": "json", "input": "Hi", "metadata": {"tag": tag}}
    answer = httpx.post(
        stacked.base_url + "/v1/responses", json=body, headers=GZIP, timeout=5, verify=CLIENT_TLS
    )
    assert answer.headers["content-encoding"] == "gzip"
    assert answer.headers["x-inner"] == "1"


def test_json_turn_is_not_compressed_inside(stacked: Server, tag: str) -> None:
    """The handshake's Accept-Encoding never reaches the app, so GZip leaves turns alone."""
    with stacked.raw(headers=GZIP) as ws:
        ws.send(create(tag, "json", input="Hi"))
        response = completed_response(ws.until_terminal())
        ws.send(create(tag, input="More.", previous_response_id=response["id"], meta={"k": "0"}))
        completed_response(ws.until_terminal())
    assert "/v1/responses" in stacked.recorder.middleware_seen


def test_turns_stream_incrementally_through_the_app_middleware(stacked: Server, tag: str) -> None:
    with stacked.raw(headers=GZIP) as ws:
        started = time.monotonic()
        ws.send(create(tag, input="Hi", meta={"k": "0", "deltas": "4", "delay": "0.1"}))
        first = ws.recv()
        first_at = time.monotonic()
        events = [first, *ws.until_terminal()]
        total = time.monotonic() - started
    assert events[0]["type"] == "response.created"
    assert completed_response(events)
    assert total > 0.8  # ten events 100 ms apart
    # Not buffered until the end: the first event reached the client before the handler's
    # stream ended (an ordering, which a loaded machine cannot turn around).
    [call] = stacked.recorder.settled(tag, 1, timeout=30)
    assert call.ended is not None
    assert first_at < call.ended


def test_leaving_mid_stream_cancels_the_handler_through_the_app_middleware(
    stacked: Server, tag: str
) -> None:
    with stacked.raw() as ws:
        ws.send(create(tag, "slow", input="Hi"))
        while ws.recv()["type"] != "response.output_text.delta":
            pass
        left = time.monotonic()
    # The slow handler streams forever: the bounds catch a hang, not a speed.
    [call] = stacked.recorder.settled(tag, 1, timeout=30)
    assert call.exit in ("cancelled", "closed")
    assert call.ended is not None
    assert call.ended - left < 30


@pytest.mark.parametrize("model", ["raise-before", "raise-during"])
def test_handler_exception_through_the_app_middleware(
    stacked: Server, tag: str, model: str
) -> None:
    with stacked.raw() as ws:
        ws.send(create(tag, model, input="Hi", stream_id="m"))
        events = ws.until_terminal()
        error = events[-1]
        assert error["type"] == "error"
        assert error["status"] == 500
        assert error["error"]["type"] == "server_error"
        assert error["stream_id"] == "m"
        ws.send(create(tag, input="Again.", meta={"k": "0"}, stream_id="m"))
        completed_response(ws.until_terminal())
