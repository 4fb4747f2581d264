"""The access log (`ws_mode.access`, INFO): a line per turn and one per closed connection, in
uvicorn's style, for a real client on a real server (uvicorn): a conversation, a client that
leaves mid-turn, a connection closed at its lifetime limit, a store that is down (a real
Redis, stopped; its failures logged with their cause and address, never the password); and
the `ws-mode` command's display of it, until the application configures logging."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import logging.handlers
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from websockets.asyncio.client import connect as websockets_connect

from tests.logfmt import AccessLine, read
from tests.nginx import needs_nginx, nginx
from tests.redis_server import RedisServer
from tests.servers import serve
from ws_mode import Limits, WebSocketModeMiddleware
from ws_mode import _access_log as access_log
from ws_mode._access_log import ACCESS_LOGGER
from ws_mode._records import ConnectionRecord, TurnRecord
from ws_mode.redis_store import RedisStore
from ws_mode.testing._client import SyncSocket, connect

WAIT = 10.0
TURN_LINE = AccessLine(
    "response.create /v1/responses",
    (
        "conn",
        "lane",
        "id",
        "previous",
        "cache",
        "in",
        "out",
        "tokens_in",
        "tokens_out",
        "cached",
        "code",
    ),
    outcome="status",
    duration="ms",
    unit="ms",
)
CONNECTION_LINE = AccessLine(
    "WebSocket /v1/responses",
    ("conn", "by", "turns", "refused", "in", "out", "reason"),
    outcome="close",
    duration="seconds",
    unit="s",
)


def answer(model: Any) -> dict[str, Any]:
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "status": "completed",
        "model": model,
        "output": [
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "hi", "annotations": []}],
            }
        ],
    }


async def create(request: Request) -> JSONResponse:
    body = await request.json()
    metadata = body.get("metadata") or {}
    delay = float(metadata.get("delay", 0))
    if delay:
        await asyncio.sleep(delay)
    answered = answer(body.get("model"))
    if "usage" in metadata:  # `input/cached/output/reasoning`, as the handler reports them
        used, cached, produced, reasoned = map(int, metadata["usage"].split("/"))
        answered["usage"] = {
            "input_tokens": used,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": produced,
            "output_tokens_details": {"reasoning_tokens": reasoned},
            "total_tokens": used + produced,
        }
        answered["model"] = "m-2026-01-01"  # the handler's word for the model
    if "id_chars" in metadata:  # an id of the handler's own scheme, however long
        answered["id"] = "resp_" + "x" * int(metadata["id_chars"])
    return JSONResponse(answered)


def middleware(**options: Any) -> WebSocketModeMiddleware:
    app = Starlette(routes=[Route("/v1/responses", create, methods=["POST"])])
    return WebSocketModeMiddleware(app, **options)


def turn(sock: SyncSocket, previous: str | None = None, **fields: Any) -> dict[str, Any]:
    """One turn; its terminal event."""
    event: dict[str, Any] = {"type": "response.create", "model": "m", "input": "hi", **fields}
    if previous is not None:
        event["previous_response_id"] = previous
    sock.send(event)
    return sock.receive_turn(timeout=WAIT)[-1]


@pytest.fixture
def access(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    return caplog


def lines(
    caplog: pytest.LogCaptureFixture,
    *,
    connections: int = 1,
    connection_line: AccessLine = CONNECTION_LINE,
) -> tuple[list[logging.LogRecord], list[logging.LogRecord]]:
    """The access log's turn and connection records, once `connections` connections closed
    (the server writes a connection's line after the client saw its socket close); a drain's
    lines are neither."""
    deadline = time.monotonic() + WAIT
    while True:
        records = [
            r for r in caplog.records if r.name == ACCESS_LOGGER and "drain" not in r.__dict__
        ]
        closed = [r for r in records if connection_line.fullmatch(r.getMessage())]
        if len(closed) >= connections or time.monotonic() > deadline:
            turns = [r for r in records if r not in closed]
            return turns, closed
        time.sleep(0.02)


def parsed(record: logging.LogRecord, kind: AccessLine) -> dict[str, str]:
    """The line's values as a strict logfmt reader reads them (unquoted, unescaped)."""
    values = kind.fullmatch(record.getMessage())
    assert values is not None, record.getMessage()
    assert record.levelno == logging.INFO
    return values


def test_a_conversation_leaves_a_line_per_turn_and_one_for_the_connection(
    access: pytest.LogCaptureFixture,
) -> None:
    with serve(middleware()) as base, connect(base) as sock:
        first = turn(sock)["response"]["id"]
        used = {"usage": "1830/1024/96/64"}
        second = turn(sock, first, stream_id="lane-a", metadata=used)["response"]["id"]
        sock.close()
        turns, (closed,) = lines(access)
    one, two = (parsed(record, TURN_LINE) for record in turns)
    connection = parsed(closed, CONNECTION_LINE)
    assert one["conn"] == two["conn"] == connection["conn"]
    assert one["client"] == two["client"] == connection["client"]
    assert (one["status"], one["id"], one["previous"], one["cache"], one["lane"]) == (
        "completed",
        first,
        "-",
        "-",
        "-",
    )
    assert (two["status"], two["id"], two["previous"], two["cache"], two["lane"]) == (
        "completed",
        second,
        first,
        "hit",
        "lane-a",
    )
    assert one["code"] == two["code"] == "-"
    # The tokens the response's usage reported; none reported, none written.
    assert (one["tokens_in"], one["tokens_out"]) == ("-", "-")
    assert (two["tokens_in"], two["tokens_out"]) == ("1830", "96")
    # The share of the input read from the prompt cache: 1024 of 1830.
    assert (one["cached"], two["cached"]) == ("-", "0.56")
    assert all(int(line["bytes_in"]) > 0 and int(line["bytes_out"]) > 0 for line in (one, two))
    assert (connection["close"], connection["by"], connection["turns"]) == ("1000", "client", "2")
    assert connection["refused"] == "0"
    assert connection["reason"] == "-"
    assert int(connection["bytes_in"]) == int(one["bytes_in"]) + int(two["bytes_in"])
    assert int(connection["bytes_out"]) == int(one["bytes_out"]) + int(two["bytes_out"])
    # The values also ride on the records, for a structured formatter.
    record = turns[1]
    assert record.__dict__["response_id"] == second
    assert record.__dict__["previous_response_id"] == first
    assert record.__dict__["status"] == "completed"
    assert record.__dict__["cache"] == "hit"
    assert record.__dict__["prompt_cache_ratio"] == 1024 / 1830
    assert record.__dict__["connection_id"] == connection["conn"]
    assert record.__dict__["model"] == "m-2026-01-01"  # the response's, not the request's
    tokens = ("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_tokens")
    assert [record.__dict__[name] for name in tokens] == [1830, 1024, 96, 64]
    assert [turns[0].__dict__[name] for name in (*tokens, "model")] == [None] * 4 + ["m"]
    assert closed.__dict__["close_code"] == 1000
    assert closed.__dict__["turns"] == 2


def test_a_failed_turn_says_its_code_and_a_client_value_cannot_forge_a_line(
    access: pytest.LogCaptureFixture,
) -> None:
    with serve(middleware()) as base, connect(base) as sock:
        refused = turn(sock, "resp_x\nINFO: forged")
        assert refused["type"] == "error"
        sock.close()
        (failed,), _ = lines(access)
    line = parsed(failed, TURN_LINE)
    assert "\n" not in failed.getMessage()
    # Quoted and escaped as logfmt does: one line, one field, read back as the client sent it.
    assert line["previous"] == "resp_x\nINFO: forged"
    assert 'previous="resp_x\\nINFO: forged"' in failed.getMessage()
    assert (line["status"], line["code"], line["cache"]) == (
        "failed",
        "previous_response_not_found",
        "miss",
    )
    assert line["id"] == "-"


#: The lines with any client field (one token), for a client address a proxy header gave.
ANY_CLIENT_TURN_LINE = dataclasses.replace(TURN_LINE, client=r"(?s).*")
ANY_CLIENT_CONNECTION_LINE = dataclasses.replace(CONNECTION_LINE, client=r"(?s).*")


def record_size(record: logging.LogRecord) -> int:
    """The characters a record holds, its message's arguments and attributes included."""
    return len(repr(record.__dict__))


def test_a_forwarded_address_cannot_forge_a_field_and_records_hold_bounded_values(
    access: pytest.LogCaptureFixture,
) -> None:
    # Behind a trusted proxy (uvicorn trusts 127.0.0.1's X-Forwarded-For by default) the
    # client's address is what that header said, a space and a fake field included.
    forwarded = "10.0.0.9 conn=forged" + "x" * 4000
    app = middleware()
    with (
        serve(app, proxy_headers=True, forwarded_allow_ips="127.0.0.1") as base,
        connect(base, headers={"X-Forwarded-For": forwarded}) as sock,
    ):
        answered = turn(sock, metadata={"id_chars": "100000"})  # the handler's own long id
        assert answered["type"] == "response.completed"
        sock.close()
        (record,), (closed,) = lines(access, connection_line=ANY_CLIENT_CONNECTION_LINE)
    line = parsed(record, ANY_CLIENT_TURN_LINE)
    connection = parsed(closed, ANY_CLIENT_CONNECTION_LINE)
    for message, fields in ((record.getMessage(), line), (closed.getMessage(), connection)):
        # The address is one value, quoted: a logfmt reader finds one conn, the real one.
        assert [key for key, _ in read(message)].count("conn") == 1
        # uvicorn's proxy-headers handling gives no port (0): none is written.
        assert fields["client"] == forwarded[:256] + "... (4020 characters)"
        assert fields["conn"] == connection["conn"]
        assert len(message) < 1000
    assert line["id"].startswith("resp_xxx")
    assert line["id"].endswith("(100005 characters)")
    # The records carry the values cut as the line cuts them, not what the client (or the
    # handler) sent: a record held by a buffering handler holds no megabytes.
    assert record.__dict__["client_addr"] == forwarded[:256] + "... (4020 characters)"
    assert closed.__dict__["client_addr"] == record.__dict__["client_addr"]
    assert record.__dict__["response_id"] == answered["response"]["id"][:256] + (
        "... (100005 characters)"
    )
    assert record_size(record) < 5000
    assert record_size(closed) < 5000


@needs_nginx
def test_a_socket_behind_nginx_logs_its_client_without_a_port_it_does_not_know(
    access: pytest.LogCaptureFixture,
) -> None:
    """Behind the documented nginx, uvicorn honours its X-Forwarded-For (127.0.0.1 is
    trusted by default): the scope's client is the forwarded address with port 0, which is
    no port. Written as such, not as `127.0.0.1:0`."""
    with serve(middleware()) as upstream, nginx(upstream) as proxied:
        with connect(proxied) as sock:
            assert turn(sock)["type"] == "response.completed"
        (record,), (closed,) = lines(access, connection_line=ANY_CLIENT_CONNECTION_LINE)
    assert parsed(record, ANY_CLIENT_TURN_LINE)["client"] == "127.0.0.1"
    assert parsed(closed, ANY_CLIENT_CONNECTION_LINE)["client"] == "127.0.0.1"
    assert record.__dict__["client_addr"] == "127.0.0.1"


def test_an_id_longer_than_any_issued_is_refused_on_arrival_and_never_logged(
    access: pytest.LogCaptureFixture,
) -> None:
    with serve(middleware()) as base, connect(base) as sock:
        first = turn(sock)["response"]["id"]
        refused = turn(sock, "resp_" + "x" * 1_000_000, stream_id="lane-a")
        assert refused["status"] == 400
        assert refused["stream_id"] == "lane-a"
        assert (refused["error"]["code"], refused["error"]["param"]) == (
            "string_above_max_length",
            "previous_response_id",
        )
        assert "maximum length 256" in refused["error"]["message"]
        assert len(refused["error"]["message"]) < 200
        # The connection goes on.
        assert turn(sock, first)["type"] == "response.completed"
        sock.close()
        turns, (closed,) = lines(access)
    # The refused create has its line (failed, with the refusal's code), without the id.
    assert [parsed(record, TURN_LINE)["previous"] for record in turns] == ["-", "-", first]
    assert parsed(turns[1], TURN_LINE)["code"] == "string_above_max_length"
    assert all(record_size(record) < 5000 for record in [*turns, closed])


def test_a_client_that_leaves_mid_turn_leaves_an_abandoned_turn(
    access: pytest.LogCaptureFixture,
) -> None:
    with serve(middleware()) as base:
        with connect(base) as sock:
            sock.send(
                {
                    "type": "response.create",
                    "model": "m",
                    "input": "hi",
                    "metadata": {"delay": "5"},
                }
            )
            time.sleep(0.3)  # the turn is running
        turns, (closed,) = lines(access)
    (abandoned,) = (parsed(record, TURN_LINE) for record in turns)
    assert (abandoned["status"], abandoned["id"], abandoned["code"]) == ("abandoned", "-", "-")
    connection = parsed(closed, CONNECTION_LINE)
    assert (connection["close"], connection["by"], connection["turns"]) == ("1000", "client", "1")


def test_a_connection_closed_at_its_lifetime_limit_says_so(
    access: pytest.LogCaptureFixture,
) -> None:
    app = middleware(limits=Limits(max_connection_seconds=0.5))
    with serve(app) as base, connect(base) as sock:
        turn(sock)
        ended = sock.receive(timeout=WAIT)
        assert ended["error"]["code"] == "websocket_connection_limit_reached"
        turns, (closed,) = lines(access)
    assert len(turns) == 1
    connection = parsed(closed, CONNECTION_LINE)
    assert (connection["close"], connection["by"]) == ("1001", "server")
    assert connection["reason"] == "connection lifetime limit reached"
    assert float(connection["seconds"]) >= 0.5


def test_access_log_false_writes_no_line(access: pytest.LogCaptureFixture) -> None:
    with serve(middleware(access_log=False)) as base, connect(base) as sock:
        turn(sock)
    time.sleep(0.3)
    assert [r for r in access.records if r.name == ACCESS_LOGGER] == []


def test_access_log_must_be_a_bool() -> None:
    from ws_mode import ConfigError

    with pytest.raises(ConfigError, match="access_log"):
        WebSocketModeMiddleware(Starlette(), access_log="yes")  # type: ignore[arg-type]


@pytest.fixture
def stopped_redis() -> RedisServer:
    """A Redis that ran and was stopped: its port refuses connections."""
    server = RedisServer().start()
    server.stop()
    return server


def store_warnings(caplog: pytest.LogCaptureFixture, seen: Callable[[str], bool]) -> list[str]:
    deadline = time.monotonic() + WAIT
    while True:
        found = [
            r.getMessage()
            for r in caplog.records
            if r.name == "ws_mode._persistence" and r.levelno == logging.WARNING
        ]
        if any(seen(message) for message in found) or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def test_a_store_that_is_down_is_logged_with_cause_and_address_never_the_password(
    access: pytest.LogCaptureFixture, stopped_redis: RedisServer
) -> None:
    password = "s3cret-password"
    port = stopped_redis.port
    store = RedisStore(f"redis://:{password}@127.0.0.1:{port}/0", timeout=1, write_timeout=1)
    with serve(middleware(store=store, shared_store=True, start_degraded=True)) as base:
        with connect(base) as sock:
            first = turn(sock)  # answered; its write fails in the background
            assert first["type"] == "response.completed"
            written = store_warnings(access, lambda message: "failed to keep" in message)
        with connect(base) as sock:  # its cache is empty: the parent must come from the store
            down = turn(sock, first["response"]["id"])
            assert down["error"]["code"] == "store_unavailable"
            warnings = store_warnings(access, lambda message: "failed to hydrate" in message)
        turns, _ = lines(access, connections=2)
    address = f"redis://127.0.0.1:{port}/0"
    keep = next(message for message in written if "failed to keep" in message)
    assert keep.startswith(f"the store failed to keep '{first['response']['id']}': ")
    hydrate = next(message for message in warnings if "failed to hydrate" in message)
    assert hydrate.startswith(f"the store failed to hydrate '{first['response']['id']}': ")
    for line in (keep, hydrate):  # the cause and where, once
        assert "ConnectionError" in line
        assert "Connection refused" in line
        assert line.count(address) == 1
    every = "\n".join(record.getMessage() for record in access.records)
    assert password not in every
    failed = parsed(turns[-1], TURN_LINE)
    assert (failed["status"], failed["code"], failed["cache"]) == (
        "failed",
        "store_unavailable",
        "miss",
    )


def test_a_store_that_does_not_answer_is_logged_as_a_timeout_with_its_bound(
    access: pytest.LogCaptureFixture,
) -> None:
    with RedisServer() as server:
        port = server.port
        store = RedisStore(server.url, timeout=0.5, write_timeout=0.5)
        server.freeze()  # accepts connections, never answers
        try:
            with (
                serve(middleware(store=store, shared_store=True, start_degraded=True)) as base,
                connect(base) as sock,
            ):
                turn(sock)
                found = store_warnings(access, lambda message: "failed to keep" in message)
        finally:
            server.thaw()
    keep = next(message for message in found if "failed to keep" in message)
    # RedisStore's own bound (write_timeout, 0.5 s) passed before the middleware's, and its
    # error says so and where.
    assert ": TimeoutError: " in keep
    assert "0.5 s" in keep
    assert keep.count(f"redis://127.0.0.1:{port}/0") == 1


def test_the_command_line_shows_the_access_log_until_logging_is_configured() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import logging
                from ws_mode import _access_log
                _access_log.show_access_log()
                _access_log.show_access_log()  # once per process
                access = logging.getLogger("ws_mode.access")
                access.info('127.0.0.1:1 - "WebSocket /v1/responses" 1000 shown')
                logging.basicConfig(format="root: %(message)s", level=logging.INFO)
                access.info("by the root handler")
                """
            ),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.splitlines() == [
        'INFO:     127.0.0.1:1 - "WebSocket /v1/responses" 1000 shown'
    ]
    assert result.stderr.splitlines() == ["root: by the root handler"]


def test_a_socket_the_servers_restart_closes_is_closed_by_the_server(
    access: pytest.LogCaptureFixture,
) -> None:
    """uvicorn's shutdown closes open sockets with 1012 (service restart): its close, not the
    client's, though the app hears it as a disconnect."""
    with serve(middleware()) as base:
        sock = connect(base)
        turn(sock)
    sock.close()
    _, (closed,) = lines(access)
    connection = parsed(closed, CONNECTION_LINE)
    assert (connection["close"], connection["by"]) == ("1012", "server")


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"stream_id": "not a stream id!"}, "invalid_stream_id"),
        ({"stream_id": "s1", "store": "yes"}, "invalid_type"),
        ({"input": 5}, "invalid_type"),
    ],
)
def test_a_create_refused_before_it_runs_leaves_a_failed_line(
    access: pytest.LogCaptureFixture, fields: dict[str, Any], code: str
) -> None:
    with serve(middleware()) as base, connect(base) as sock:
        assert turn(sock, **fields)["error"]["code"] == code
        sock.close()
        turns, (closed,) = lines(access)
    (refused,) = (parsed(record, TURN_LINE) for record in turns)
    assert (refused["status"], refused["code"], refused["id"]) == ("failed", code, "-")
    assert int(refused["bytes_in"]) > 0
    assert int(refused["bytes_out"]) > 0
    # Counted apart: no turn ran.
    connection = parsed(closed, CONNECTION_LINE)
    assert (connection["turns"], connection["refused"]) == ("0", "1")


def test_a_close_reason_cannot_forge_fields(access: pytest.LogCaptureFixture) -> None:
    """The client's close reason, with spaces and `=`: a logfmt reader reads one `reason`, and
    the connection's own `by`, `turns` and `conn`."""
    forged = 'x by=server turns=9999 conn=deadbeef "q'

    async def close_with_a_reason(url: str) -> None:
        async with websockets_connect(url) as socket:
            await socket.close(code=1000, reason=forged)

    with serve(middleware()) as base:
        asyncio.run(close_with_a_reason(base.replace("http", "ws") + "/v1/responses"))
        _, (closed,) = lines(access)
    connection = parsed(closed, CONNECTION_LINE)
    assert connection["reason"] == forged
    assert (connection["by"], connection["turns"]) == ("client", "0")
    assert connection["conn"] != "deadbeef"
    assert [key for key, _ in read(closed.getMessage())].count("by") == 1


#: What a hostile client (or handler) may put in a value: any text, spaces, quotes, `=`,
#: backslashes, newlines and escape sequences included.
hostile = st.text(
    st.characters(codec=None, exclude_categories=()) | st.sampled_from(" =\"\\\n='-"),
    max_size=300,
)


def logged(value: str) -> str:
    """What a line's value reads back as: the value cut as every value is."""
    return value if len(value) <= 256 else f"{value[:256]}... ({len(value)} characters)"


@settings(max_examples=300, deadline=None)
@given(client=hostile, lane=hostile, previous=hostile, code=hostile, reason=hostile)
def test_no_value_forges_a_field_of_a_line(
    client: str, lane: str, previous: str, code: str, reason: str
) -> None:
    connection = ConnectionRecord(id="c0ffee00", client=client, path="/v1/responses", started=0)
    connection.closed(1000, reason, "client")
    record = TurnRecord(connection, lane, previous, 5, 0.0)
    record.failed(code)
    captured = logging.handlers.BufferingHandler(10)
    logger = logging.getLogger(ACCESS_LOGGER)
    logger.addHandler(captured)
    saved, logger.level = logger.level, logging.INFO
    try:
        access_log.turn_line(record)
        access_log.connection_line(connection)
    finally:
        logger.removeHandler(captured)
        logger.setLevel(saved)
    turn_record, connection_record = captured.buffer
    for message in (turn_record.getMessage(), connection_record.getMessage()):
        assert "\n" not in message
        assert "\r" not in message
    line = parsed(turn_record, ANY_CLIENT_TURN_LINE)
    closed = parsed(connection_record, ANY_CLIENT_CONNECTION_LINE)
    assert line["client"] == closed["client"] == logged(client)
    assert (line["lane"], line["previous"], line["code"]) == tuple(
        map(logged, (lane, previous, code or "response_failed"))
    )
    assert line["conn"] == closed["conn"] == "c0ffee00"
    assert closed["reason"] == (logged(reason) if reason else "-")
    assert (closed["by"], closed["turns"], closed["refused"]) == ("client", "0", "0")
