"""What a client is told and what the log keeps: a store that fails gives the client a generic
message (its code, its param, the id it sent) and the operator the detail; a value the client
sent reaches a log line escaped and bounded, and an error message quotes it bounded."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.types import Scope
from websockets.sync.client import ClientConnection, connect

from tests.redis_server import RedisServer
from tests.servers import serve
from ws_mode import WebSocketModeMiddleware
from ws_mode._logs import for_log
from ws_mode._protocol import MAX_ID_CHARS, QUOTED_ID_CHARS
from ws_mode.redis_store import RedisStore
from ws_mode.toolkit.reference import ReferenceConfig, create_app

#: A forged second log line, as long as an id may be (a longer one is refused on arrival).
FORGED_LINE = "resp_1\nERROR:    ws_mode: forged line\r\n"
FORGED_ID = FORGED_LINE + "x" * (MAX_ID_CHARS - len(FORGED_LINE))


def authenticate(scope: Scope) -> str:
    return "alice"


@pytest.fixture(scope="module")
def stopped_redis() -> RedisServer:
    """A real redis-server's address, with the server stopped: nothing answers there."""
    server = RedisServer().start()
    server.stop()
    return server


@pytest.fixture(scope="module")
def origin(stopped_redis: RedisServer) -> Iterator[str]:
    app = WebSocketModeMiddleware(
        create_app(ReferenceConfig(tool_calls=0)),
        store=RedisStore(stopped_redis.url, timeout=2.0),
        stateful_http=True,
        authenticate=authenticate,
        start_degraded=True,  # the store is down from the start, on purpose
    )
    with serve(app) as base_url:
        yield base_url


def _turn(origin: str, **fields: Any) -> dict[str, Any]:
    socket: ClientConnection
    with connect(
        origin.replace("http", "ws", 1) + "/v1/responses", max_size=None, open_timeout=10
    ) as socket:
        socket.send(json.dumps({"type": "response.create", "model": "m", "input": "hi", **fields}))
        while True:
            event: dict[str, Any] = json.loads(socket.recv(timeout=20))
            if event["type"] in ("error", "response.completed", "response.failed"):
                return event


def _failed_reads(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The lines of the store's failed reads: the first of an outage is a warning, the next
    ones DEBUG lines (the tests of this module share one stopped store)."""
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "ws_mode._persistence"
        and record.levelno in (logging.WARNING, logging.DEBUG)
        and record.getMessage().startswith("the store failed to")
    ]


def test_a_store_that_is_down_tells_the_client_nothing_about_it(
    origin: str, stopped_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    address = f"127.0.0.1:{stopped_redis.port}"
    with caplog.at_level(logging.DEBUG, logger="ws_mode"):
        event = _turn(origin, previous_response_id="resp_gone", stream_id="lane")
    error = event["error"]
    assert (event["status"], error["code"], error["param"]) == (
        503,
        "store_unavailable",
        "previous_response_id",
    )
    assert event["stream_id"] == "lane"
    assert "resp_gone" in error["message"]  # the id the client sent, to act on
    assert address not in error["message"]
    assert str(stopped_redis.port) not in error["message"]
    assert "Error" not in error["message"]
    assert "refused" not in error["message"].lower()
    # The operator's log has the detail.
    (line,) = _failed_reads(caplog)
    assert "'resp_gone'" in line
    assert address in line


def test_a_forged_id_gives_one_bounded_escaped_log_line_and_a_bounded_echo(
    origin: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="ws_mode"):
        event = _turn(origin, previous_response_id=FORGED_ID)
    assert event["error"]["code"] == "store_unavailable"
    assert len(event["error"]["message"]) < 1000  # not a megabyte back
    (line,) = _failed_reads(caplog)
    assert "\n" not in line
    assert "\r" not in line
    assert repr(FORGED_ID) in line  # escaped, as repr does
    assert len(line) < 2000


def test_stateful_get_with_a_forged_id_logs_it_escaped_and_answers_generically(
    origin: str, stopped_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    # %0A in a path is a newline in the ASGI scope's (decoded) path.
    # As long as an id may be (256 characters): a longer one is refused before the store is read.
    forged = "resp_1%0AERROR:%20forged" + "y" * 230
    with caplog.at_level(logging.DEBUG, logger="ws_mode"):
        answer = httpx.get(f"{origin}/v1/responses/{forged}", timeout=20)
        longer = httpx.get(f"{origin}/v1/responses/{forged}{'y' * 10}", timeout=20)
    assert longer.json()["error"]["code"] == "string_above_max_length"
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "store_unavailable"
    assert str(stopped_redis.port) not in answer.text
    (line,) = _failed_reads(caplog)
    assert "\n" not in line
    assert "'resp_1\\nERROR: forged" in line
    assert f"127.0.0.1:{stopped_redis.port}" in line
    assert len(line) < 2000


def test_an_unknown_id_is_quoted_bounded() -> None:
    app = WebSocketModeMiddleware(
        create_app(ReferenceConfig(tool_calls=0)), authenticate=authenticate
    )
    with serve(app) as base_url:
        event = _turn(base_url, previous_response_id=FORGED_ID)
    assert event["error"]["code"] == "previous_response_not_found"
    assert event["error"]["message"] == (
        f"Previous response with id '{FORGED_ID[:QUOTED_ID_CHARS]}...' not found."
    )


def test_for_log() -> None:
    assert for_log("resp_1") == "'resp_1'"
    assert for_log("a\nb\r\x1b[31m\u2028") == "'a\\nb\\r\\x1b[31m\\u2028'"
    assert for_log("x" * 10, limit=4) == "'xxxx'... (10 characters)"
    assert for_log(b"ab\ncd\xff", limit=4) == "'ab\\nc'... (6 bytes)"
    assert for_log(b"ok") == "'ok'"
    assert for_log(ConnectionError("Error 111 connecting to 127.0.0.1:1.")) == (
        "ConnectionError: Error 111 connecting to 127.0.0.1:1."
    )
    assert for_log(TimeoutError()) == "TimeoutError"

    class Odd:
        def __repr__(self) -> str:
            return "odd\nline"

    assert for_log(Odd()) == "odd\\nline"
    assert len(for_log("\x00" * 10_000)) < 10 * 200 + 40
