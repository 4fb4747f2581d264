"""A store outage in the log: a real Redis stopped under a serving uvicorn, every continuation
failing to hydrate, logs one warning for the outage (the next failures at DEBUG, all counted),
and one line when Redis is back and the store answers again."""

from __future__ import annotations

import logging

import pytest

from tests.library.test_access_log import middleware, turn
from tests.redis_server import RedisServer
from tests.servers import serve
from tests.store_kit import ClosingStore, wait_for
from ws_mode.redis_store import RedisStore
from ws_mode.testing._client import connect

FAILED_READS = 8


def said(caplog: pytest.LogCaptureFixture, text: str, level: int) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "ws_mode._persistence"
        and record.levelno == level
        and text in record.getMessage()
    ]


def test_an_outage_is_one_warning_and_its_end_one_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="ws_mode._persistence")
    with RedisServer() as server:
        store = RedisStore(server.url, timeout=1, write_timeout=1)
        app = middleware(store=store, shared_store=True, start_degraded=True)
        with serve(ClosingStore(app, store)) as base:
            with connect(base) as sock:
                first = turn(sock)["response"]["id"]
            assert wait_for(lambda: app.stats.store_writes == 1)  # it landed
            server.stop()
            for _ in range(FAILED_READS):
                with connect(base) as sock:  # an empty cache: the parent must come from Redis
                    assert turn(sock, first)["error"]["code"] == "store_unavailable"
            server.restart()
            with connect(base) as sock:
                answered = turn(sock, first)  # the store answers (it kept nothing on disk)
                assert answered["error"]["code"] == "previous_response_not_found"
            failures = app.stats.store_failures
    warned = said(caplog, "failed to hydrate", logging.WARNING)
    assert len(warned) == 1
    assert "next failed reads are logged at DEBUG until it answers again" in warned[0]
    assert len(said(caplog, "failed to hydrate", logging.DEBUG)) == FAILED_READS - 1
    assert failures == FAILED_READS  # each one counted
    (back,) = said(caplog, "the store answers again", logging.WARNING)
    assert f"({FAILED_READS} failed read(s) in that time)" in back
