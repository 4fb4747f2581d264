"""What an operator reads: the library configures no logging; the command line shows ws_mode's
lines with their level and logger until the application configures logging; uvicorn's
spurious error after a refusal is gone where uvicorn is started on purpose (or the documented
filter is added); a handler that answers garbage leaves a line."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.servers import serve
from ws_mode import WebSocketModeMiddleware
from ws_mode._logs import RefusalLineFilter
from ws_mode.server import Server
from ws_mode.testing._loopback import bind_loopback, origin

UVICORN_LINE = "ASGI callable returned without completing handshake."


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_the_library_configures_no_logging() -> None:
    # In a fresh process: making middlewares (and importing ws_mode) adds no handler and no
    # filter to any logger; a warning goes to Python's last resort, a bare message.
    result = _run(
        """
        import logging
        def configured():
            loggers = [logging.getLogger(), *(logging.getLogger(name)
                       for name in sorted(logging.root.manager.loggerDict))]
            return {each.name: (list(each.handlers), list(each.filters)) for each in loggers}
        logging.getLogger("uvicorn.error")  # exists before, as under uvicorn
        before = configured()
        from starlette.applications import Starlette
        from ws_mode import WebSocketModeMiddleware
        import ws_mode.server, ws_mode.fastapi  # everything the library's users import
        WebSocketModeMiddleware(Starlette())
        WebSocketModeMiddleware(Starlette(), enabled=False)
        after = configured()
        changed = {name: value for name, value in after.items()
                   if value != before.get(name, ([], []))}
        print(changed)
        logging.getLogger("ws_mode._handler_call").warning("bare")
        """
    )
    assert result.stdout.strip() == "{}"
    assert result.stderr.splitlines() == ["bare"]


def test_the_command_lines_output_shows_level_and_logger_until_logging_is_configured() -> None:
    result = _run(
        """
        import logging
        from ws_mode import _logs as logs
        logs.show_on_stderr()
        logs.show_on_stderr()  # once per process
        logging.getLogger("ws_mode._handler_call").warning("first")
        logging.getLogger("ws_mode._handler_call").info("not shown: below WARNING")
        logging.basicConfig(format="configured %(name)s %(message)s")
        logging.getLogger("ws_mode._connection").warning("second")
        """
    )
    assert result.stderr.splitlines() == [
        "WARNING:  ws_mode._handler_call: first",
        "configured ws_mode._connection second",  # once: the application's handler only
    ]


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _refused_upgrade_lines(server: str, *, documented_filter: bool) -> list[tuple[int, str]]:
    """What `uvicorn.error` logged around one upgrade the middleware refused (426), with
    uvicorn run as `server` ("uvicorn": the tools' plain `uvicorn.Server`; "ws_mode": the
    library's `ws_mode.server.Server`), with or without the filter added by hand."""
    app = WebSocketModeMiddleware(Starlette(), enabled=False)
    collect = _Collect()
    uvicorn_error = logging.getLogger("uvicorn.error")
    saved = list(uvicorn_error.filters)
    for each in saved:
        uvicorn_error.removeFilter(each)  # whatever an earlier test in this process added
    if documented_filter:
        uvicorn_error.addFilter(RefusalLineFilter())
    running = serve(app, lifespan="off") if server == "uvicorn" else _library_server(app)
    try:
        with running as base_url:
            uvicorn_error.addHandler(collect)  # after uvicorn configured its loggers
            try:
                with pytest.raises(InvalidStatus) as refused:
                    connect(base_url.replace("http", "ws", 1) + "/v1/responses", open_timeout=10)
                assert refused.value.response.status_code == 426
                time.sleep(0.5)  # uvicorn logs its line when the app has returned
            finally:
                uvicorn_error.removeHandler(collect)
    finally:
        for each in list(uvicorn_error.filters):
            uvicorn_error.removeFilter(each)
        for each in saved:
            uvicorn_error.addFilter(each)
    return [(record.levelno, record.getMessage()) for record in collect.records]


@contextlib.contextmanager
def _library_server(app: WebSocketModeMiddleware) -> Iterator[str]:
    """`ws_mode.server.Server` on a loopback socket, in a thread."""
    sock = bind_loopback()
    # gc_threshold=None: the collector is the test worker's, left as it is.
    server = Server(uvicorn.Config(app, log_level="warning", lifespan="off"), gc_threshold=None)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive()
            time.sleep(0.01)
        yield origin(sock)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def test_uvicorns_error_after_a_refusal_is_dropped_by_the_library_server() -> None:
    lines = _refused_upgrade_lines("ws_mode", documented_filter=False)
    assert not [line for line in lines if line[0] >= logging.ERROR], lines


def test_uvicorns_error_after_a_refusal_is_dropped_by_the_documented_filter() -> None:
    # Without it (uvicorn run by hand, the middleware alone), uvicorn's line is there: the
    # library leaves other libraries' loggers alone.
    unfiltered = _refused_upgrade_lines("uvicorn", documented_filter=False)
    assert (logging.ERROR, UVICORN_LINE) in unfiltered
    lines = _refused_upgrade_lines("uvicorn", documented_filter=True)
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
    (record,) = [r for r in caplog.records if r.name == "ws_mode._handler_call"]
    assert record.levelno == logging.WARNING
    assert "text/plain" in record.getMessage()
    assert "hello" in record.getMessage()
