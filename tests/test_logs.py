"""What an operator reads: ws_mode's lines carry their level and logger until the application
configures logging, uvicorn's spurious error after a refusal is gone, and a handler that
answers garbage leaves a line."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import time

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from ws_mode import WebSocketModeMiddleware

from .servers import serve


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_lines_show_level_and_logger_until_logging_is_configured() -> None:
    result = _run(
        """
        import logging
        from starlette.applications import Starlette
        from ws_mode import WebSocketModeMiddleware
        WebSocketModeMiddleware(Starlette())
        logging.getLogger("ws_mode.handler_call").warning("first")
        logging.getLogger("ws_mode.handler_call").info("not shown: below WARNING")
        logging.basicConfig(format="configured %(name)s %(message)s")
        logging.getLogger("ws_mode.connection").warning("second")
        """
    )
    assert result.stderr.splitlines() == [
        "WARNING:  ws_mode.handler_call: first",
        "configured ws_mode.connection second",  # once: the application's handler only
    ]


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_uvicorns_error_after_a_refusal_is_dropped() -> None:
    app = WebSocketModeMiddleware(Starlette(), enabled=False)
    collect = _Collect()
    uvicorn_error = logging.getLogger("uvicorn.error")
    with serve(app) as base_url:
        uvicorn_error.addHandler(collect)  # after uvicorn configured its loggers
        try:
            with pytest.raises(InvalidStatus) as refused:
                connect(base_url.replace("http", "ws", 1) + "/v1/responses", open_timeout=10)
            assert refused.value.response.status_code == 426
            time.sleep(0.5)  # uvicorn logs its line when the app has returned
        finally:
            uvicorn_error.removeHandler(collect)
    lines = [(record.levelno, record.getMessage()) for record in collect.records]
    assert not [line for line in lines if line[0] >= logging.ERROR], lines


def test_a_handler_answering_plain_text_leaves_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    async def handler(request: Request) -> PlainTextResponse:
        return PlainTextResponse("hello")

    app = WebSocketModeMiddleware(
        Starlette(routes=[Route("/v1/responses", handler, methods=["POST"])])
    )
    with (
        caplog.at_level(logging.WARNING, logger="ws_mode"),
        serve(app) as base_url,
        connect(base_url.replace("http", "ws", 1) + "/v1/responses") as socket,
    ):
        socket.send('{"type": "response.create", "model": "m", "input": "hi"}')
        assert '"server_error"' in str(socket.recv(timeout=10))
    (record,) = [r for r in caplog.records if r.name == "ws_mode.handler_call"]
    assert record.levelno == logging.WARNING
    assert "text/plain" in record.getMessage()
    assert "hello" in record.getMessage()
