"""``ws-mode check URL`` against real servers on loopback: ``ws-mode serve`` itself (every check
passes), the same server behind a WebSocket reverse proxy with a small frame limit (the
ceiling found and reported), uvicorn with its default frame limit (found as a close 1009,
without a traceback), WebSocket mode switched off (426), a proxy that strips ``Upgrade``,
refused credentials, a Redis store that went down (not a missing middleware), and sockets
dropped when idle: by a proxy that counts data frames only, by a TCP tunnel that counts every
byte (server pings slower than its timeout, pings off, pings fast enough) and by ws_mode.

Besides its table on stdout, the command says on stderr what it waits for; no run may print a
traceback there or log one (websockets' loggers included)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send
from websockets.datastructures import Headers
from websockets.exceptions import InvalidStatus
from websockets.http11 import Response

from tests.redis_server import RedisServer
from tests.servers import ServeProcess, ws_mode_serve
from tests.toolkit.cli.checks import FAST, flat, row, run
from ws_mode import WebSocketModeMiddleware
from ws_mode._auth import AuthenticationFailed, bearer_token
from ws_mode._limits import Limits
from ws_mode.redis_store import RedisStore
from ws_mode.testing._client import AsyncSocket, SocketClosed, connect_async
from ws_mode.testing._loopback import ServerThread, ws_max_size
from ws_mode.toolkit.check import CheckOptions, Target, find_ceiling
from ws_mode.toolkit.check.basic import describe_refusal, prompt_cache
from ws_mode.toolkit.check.results import HINTS
from ws_mode.toolkit.cli import main
from ws_mode.toolkit.cli.check import parse_size, target_of
from ws_mode.toolkit.cli.common import CommandError
from ws_mode.toolkit.cli.serve import build_app
from ws_mode.toolkit.http_client import HttpClient, HttpStatusError

KiB = 1024
MiB = 1024 * KiB
#: uvicorn's own default frame limit (16 MiB), as a server started without --ws-max-size has.
UVICORN_WS_MAX_SIZE: int = inspect.signature(uvicorn.Config).parameters["ws_max_size"].default


class Relay:
    """A WebSocket reverse proxy as an ASGI app: each socket opens one to ``upstream`` (its
    refusal passed back with its status) and frames are relayed both ways. Served by
    :class:`ServerThread`, whose ``ws_max_size`` is its frame limit (close 1009 past it, as
    a proxy's). ``idle`` closes a socket on which nothing moved for that long (1001), like
    nginx's ``proxy_read_timeout``; ``strip_upgrade`` passes the upgrade on as a plain GET,
    like nginx without ``proxy_set_header Upgrade``."""

    def __init__(self, upstream: str, *, idle: float | None = None, strip_upgrade: bool = False):
        self.upstream = upstream
        self.idle = idle
        self.strip_upgrade = strip_upgrade

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "websocket"
        await receive()  # websocket.connect
        headers = {
            name.decode(): value.decode()
            for name, value in scope["headers"]
            if name in (b"authorization",)
        }
        if self.strip_upgrade:
            status, body = await asyncio.to_thread(self._plain_get, scope["path"], headers)
            await _deny(send, status, body)
            return
        try:
            upstream = await connect_async(
                self.upstream, scope["path"], headers=headers, compression=False
            )
        except InvalidStatus as exc:
            await _deny(send, exc.response.status_code, exc.response.body or b"")
            return
        await send({"type": "websocket.accept"})
        async with upstream:
            await self._relay(upstream, receive, send)

    def _plain_get(self, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        with HttpClient(self.upstream, headers=headers) as client:
            try:
                client.get_json(path)
            except HttpStatusError as exc:
                return exc.status, json.dumps(exc.envelope).encode()
        return 200, b"{}"

    async def _relay(self, upstream: AsyncSocket, receive: Receive, send: Send) -> None:
        moved = asyncio.Event()  # a frame went through, either way

        async def inward() -> None:
            while (message := await receive())["type"] == "websocket.receive":
                moved.set()
                await upstream.send(message["text"])

        async def outward() -> None:
            with contextlib.suppress(SocketClosed):
                while True:
                    frame = await upstream.receive_frame()
                    moved.set()
                    await send({"type": "websocket.send", "text": frame})
            await send({"type": "websocket.close", "code": 1011})

        async def watchdog() -> None:
            with contextlib.suppress(TimeoutError):
                while True:
                    moved.clear()
                    await asyncio.wait_for(moved.wait(), self.idle)
            await send({"type": "websocket.close", "code": 1001, "reason": "idle timeout"})

        tasks = [asyncio.create_task(inward()), asyncio.create_task(outward())]
        if self.idle is not None:
            tasks.append(asyncio.create_task(watchdog()))
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _deny(send: Send, status: int, body: bytes) -> None:
    """Refuse the upgrade with ``status`` and ``body`` (the denial response extension)."""
    start = {"type": "websocket.http.response.start", "status": status, "headers": []}
    await send(start)
    await send({"type": "websocket.http.response.body", "body": body})


@contextlib.contextmanager
def relay(upstream: str, *, limit: int | None = None, **options: Any) -> Iterator[str]:
    """Serve a :class:`Relay` to ``upstream`` on loopback with the frame limit ``limit``."""
    server = ServerThread(
        Relay(upstream, **options),
        ws_max_size=limit or ws_max_size(),
        lifespan="off",
        lifetime=120,
        name="check-relay",
    )
    with server as base_url:
        yield base_url


class IdleTunnel:
    """A TCP proxy on loopback that closes a connection on which no byte moved either way for
    ``idle`` seconds, as nginx's ``proxy_read_timeout`` and ``proxy_send_timeout`` close an
    upgraded connection: WebSocket pings and pongs are bytes, so they reset its timer (unlike
    :class:`Relay`'s, which sees only data frames). Runs in a thread, for ``lifetime`` seconds
    at most."""

    def __init__(self, upstream: str, idle: float, lifetime: float = 120.0) -> None:
        host, _, port = upstream.removeprefix("http://").rpartition(":")
        self.upstream = (host, int(port))
        self.idle = idle
        self.lifetime = lifetime
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> str:
        ready = threading.Event()
        address: list[str] = []

        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            self._stopped = asyncio.Event()
            server = await asyncio.start_server(self._tunnel, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            address.append(f"http://127.0.0.1:{port}")
            ready.set()
            async with server:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopped.wait(), self.lifetime)

        self._thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
        self._thread.start()
        assert ready.wait(10), "the tunnel did not start"
        return address[0]

    def __exit__(self, *exc_info: object) -> None:
        if self._loop is not None and self._stopped is not None:
            with contextlib.suppress(RuntimeError):  # its loop ended by itself
                self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(10)

    async def _tunnel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
        moved = asyncio.Event()  # a byte went through, either way

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            while data := await source.read(65536):
                moved.set()
                sink.write(data)
                await sink.drain()

        async def watchdog() -> None:
            with contextlib.suppress(TimeoutError):
                while True:
                    moved.clear()
                    await asyncio.wait_for(moved.wait(), self.idle)

        tasks = [
            asyncio.create_task(pump(reader, upstream_writer)),
            asyncio.create_task(pump(upstream_reader, writer)),
            asyncio.create_task(watchdog()),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for each in (writer, upstream_writer):
            each.close()  # a plain close, no WebSocket close frame: the client sees 1006


@contextlib.contextmanager
def served(app: Any, **options: Any) -> Iterator[str]:
    """Serve ``app`` (a ws_mode app) on loopback as ``ws-mode serve`` would; ``options`` go
    to uvicorn (``ws_ping_interval``, ...)."""
    server = ServerThread(
        app, ws_max_size=ws_max_size(), lifetime=120, name="check-app", options=options
    )
    with server as url:
        yield url


@pytest.fixture(autouse=True)
def no_logged_tracebacks(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Fails a test if anything logged a traceback meanwhile, websockets' loggers included
    (pytest's handler takes the records that would otherwise reach stderr)."""
    caplog.set_level(logging.WARNING)
    yield
    logged = [record for record in caplog.records if record.exc_info]
    assert not logged, [(record.name, record.getMessage()) for record in logged]


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """``ws-mode serve`` in a child process, for the whole module."""
    with ws_mode_serve(cwd=tmp_path_factory.mktemp("serve")) as process:
        yield process


def test_every_check_passes_against_ws_mode_serve(
    serve: ServeProcess, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    results = tmp_path / "check.json"
    status, out, rows, _ = run(
        capsys, serve.origin + "/v1", "--idle", "1", "--max-probe-bytes", "256KiB",
        "--json", str(results),
    )  # fmt: skip
    assert status == 0, out
    assert rows == dict.fromkeys(rows, "ok"), out
    assert len(rows) == 8
    assert "8 ok, 0 failed, 0 skipped" in flat(out)
    assert "every size up to 262144 B got through" in row(out, "largest message")
    written = json.loads(results.read_text())
    assert written["ok"] is True
    assert written["url"] == serve.origin.replace("http", "ws") + "/v1/responses"
    checks = {check["name"]: check for check in written["checks"]}
    chain = checks["chained conversation"]["data"]["responses"]
    assert len(chain) == 2
    assert chain[0] != chain[1]
    # The reference server reports usage, and keeps no prompt cache: 0 of each turn's input.
    assert checks["chained conversation"]["data"]["prompt_cache"] == {
        "continuation": 0.0, "first": 0.0}  # fmt: skip
    assert "prompt cache: the continuation read 0.00 of its input tokens" in flat(out)
    probes = checks["largest message"]["data"]["probes"]
    assert [probe["size"] for probe in probes] == [64 * KiB, 128 * KiB, 256 * KiB]
    assert all(probe["ok"] for probe in probes)


def test_a_proxys_frame_limit_is_found(
    serve: ServeProcess, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    results = tmp_path / "check.json"
    with relay(serve.origin, limit=256 * KiB) as proxied:
        status, out, rows, _ = run(
            capsys, proxied, "--idle", "0", "--max-probe-bytes", "1MiB", "--json", str(results)
        )
    assert status == 1, out
    # Everything but the size gets through the proxy.
    assert rows.pop("largest message") == "FAILED"
    assert rows.pop("idle socket") == "skipped"
    assert set(rows.values()) == {"ok"}, out
    assert "256.0 KiB (262144 B) gets through" in row(out, "largest message")
    assert "close 1009 (message too big)" in row(out, "largest message")
    assert "uvicorn --ws-max-size" in flat(out)  # the hint
    probe = json.loads(results.read_text())["checks"][6]["data"]
    assert probe["ceiling_bytes"] == 256 * KiB
    assert probe["failure"] == "1009"
    assert 256 * KiB < probe["failed_bytes"] <= 256 * KiB + 256 * KiB // 64


def test_a_limit_that_is_no_power_of_two_is_bracketed(serve: ServeProcess) -> None:
    limit = 200_000
    with relay(serve.origin, limit=limit) as proxied:
        options = CheckOptions(timeout=10, min_probe_bytes=64 * KiB, max_probe_bytes=1024 * KiB)
        passed, failed, probes = find_ceiling(Target(proxied, "/v1/responses"), options)
    assert passed is not None
    assert failed is not None
    assert passed <= limit < failed.size
    assert failed.size - passed <= max(1024, passed // 64)
    assert failed.failure == "1009"
    assert all(probe.ok == (probe.size <= limit) for probe in probes)


def test_ws_modes_own_limit_passes(capsys: pytest.CaptureFixture[str]) -> None:
    """Past ``max_message_bytes`` ws_mode answers an error and keeps the socket: no failure."""
    app = build_app(limits=Limits(max_message_bytes=100_000))
    with served(app) as base_url:
        status, out, rows, _ = run(capsys, base_url, "--idle", "0", "--max-probe-bytes", "512KiB")
    assert status == 0, out
    line = row(out, "largest message")
    assert rows["largest message"] == "ok"
    found = re.search(r"\((\d+) B\); past it ws_mode answers message_too_large", line)
    assert found, line
    assert 100_000 - 100_000 // 64 <= int(found.group(1)) <= 100_000


def test_websocket_mode_switched_off_is_reported(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    app = build_app()
    app.enabled = False
    results = tmp_path / "check.json"
    with served(app) as base_url:
        status, out, rows, _ = run(capsys, base_url, "--json", str(results))
    assert status == 1
    assert rows["handshake"] == "FAILED"
    assert "HTTP 426: WebSocket mode is switched off" in row(out, "handshake")
    assert "enabled" in flat(out)  # the hint
    del rows["handshake"]
    assert set(rows.values()) == {"skipped"}
    assert len(rows) == 7
    written = json.loads(results.read_text())
    assert written["ok"] is False
    assert written["checks"][0]["data"] == {"status": 426, "code": "websocket_mode_disabled"}


def test_a_draining_server_is_reported_as_shutting_down(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A draining middleware answers 503 `server_shutting_down`, named as such (not as a
    failing upstream); the hint says clients retry."""
    app = build_app()
    results = tmp_path / "check.json"
    with served(app) as base_url:
        asyncio.run(app.drain(0))  # no socket is open: it only starts refusing
        status, out, rows, _ = run(capsys, base_url, "--json", str(results))
    assert status == 1
    assert rows["handshake"] == "FAILED"
    assert "HTTP 503: the server is shutting down" in row(out, "handshake")
    assert "clients retry" in flat(out)  # the hint
    written = json.loads(results.read_text())
    assert written["checks"][0]["data"] == {"status": 503, "code": "server_shutting_down"}


def test_a_server_out_of_memory_budget_is_named() -> None:
    """The other 503 an upgrade gets from ws_mode (the answer tests/library/test_memory_budget.py
    provokes): named with its own hint."""
    body = b'{"error":{"type":"server_error","code":"server_is_overloaded","message":"full"}}'
    refusal = InvalidStatus(Response(503, "Service Unavailable", Headers(), body))
    detail, kind, data = describe_refusal(refusal)
    assert kind == "memory"
    assert detail.startswith("HTTP 503: the server's memory budget is used")
    assert "Limits.max_memory_bytes" in HINTS[kind]
    assert data == {"status": 503, "code": "server_is_overloaded"}


def test_a_proxy_that_strips_upgrade_is_named(
    serve: ServeProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    with relay(serve.origin, strip_upgrade=True) as proxied:
        status, out, rows, _ = run(capsys, proxied, *FAST)
    assert status == 1
    assert rows["handshake"] == "FAILED"
    assert "instead of 101 Switching Protocols" in row(out, "handshake")
    assert "proxy_set_header Upgrade $http_upgrade" in flat(out)


def test_credentials(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def authenticate(scope: Scope) -> str:
        if bearer_token(scope) != "secret":
            raise AuthenticationFailed()
        return "tester"

    from ws_mode.toolkit.reference import ReferenceConfig, create_app

    app = WebSocketModeMiddleware(create_app(ReferenceConfig()), authenticate=authenticate)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with served(app) as base_url:
        status, out, rows, _ = run(capsys, base_url, *FAST)
        assert status == 1
        assert rows["handshake"] == "FAILED"
        assert "HTTP 401: the credentials were refused" in row(out, "handshake")
        assert "--api-key" in flat(out)
        status, out, _, _ = run(capsys, base_url, *FAST, "--api-key", "secret")
        assert status == 0, out
        monkeypatch.setenv("OPENAI_API_KEY", "secret")
        status, out, _, _ = run(capsys, base_url, *FAST)
        assert status == 0, out


def test_a_proxy_that_drops_idle_sockets_fails_the_idle_check(
    serve: ServeProcess, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    results = tmp_path / "check.json"
    with relay(serve.origin, idle=1.0) as proxied:
        status, out, rows, err = run(
            capsys, proxied, "--idle", "30", "--max-probe-bytes", "0", "--json", str(results)
        )
    assert status == 1
    assert rows["idle socket"] == "FAILED"
    assert rows["chained conversation"] == "ok"
    line = row(out, "idle socket")
    assert "close 1001" in line
    # The relay sees data frames only: pings from the client did not keep a socket open either.
    assert "a socket on which the client pinged every" in line
    hint = flat(out)
    assert "counts only data frames" in hint
    assert "proxy_read_timeout" in hint
    assert "AWS ALB" in hint
    assert "idle socket: waiting 30 s on a socket with nothing sent" in err
    idle = json.loads(results.read_text())["checks"][7]["data"]
    assert idle["closed_after"] >= 0.9  # the proxy waits 1 s without a frame
    assert idle["close_code"] == 1001
    assert idle["server_pings"] == []
    assert idle["ping_timing"]["closed_after"] >= 0.9
    assert idle["ping_timing"]["pings"] == []


def test_ws_modes_own_idle_limit_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    app = build_app(limits=Limits(max_idle_seconds=1))
    with served(app) as base_url:
        status, out, rows, _ = run(capsys, base_url, "--idle", "30", "--max-probe-bytes", "0")
    assert status == 1
    assert rows["idle socket"] == "FAILED"
    assert "websocket_idle_timeout" in row(out, "idle socket")
    assert "Limits.max_idle_seconds" in flat(out)


def test_server_pings_slower_than_a_proxys_idle_timeout_are_named_with_both_numbers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    results = tmp_path / "check.json"
    with (
        served(build_app(), ws_ping_interval=3.0) as base_url,
        IdleTunnel(base_url, idle=1.0) as proxied,
    ):
        status, out, rows, err = run(
            capsys, proxied, "--idle", "10", "--max-probe-bytes", "0", "--json", str(results)
        )
    assert status == 1, out
    assert rows["idle socket"] == "FAILED"
    idle = json.loads(results.read_text())["checks"][7]["data"]
    closed_after, first_ping = idle["closed_after"], idle["ping_timing"]["pings"][0]
    assert 1.0 <= closed_after < first_ping  # the tunnel's 1 s, then uvicorn's 3 s
    assert idle["server_pings"] == []  # none came before the close
    line = row(out, "idle socket")
    assert f"closed after {closed_after:.1f} s of 10 s idle (close 1006)" in line
    assert f"the server's first ping comes {first_ping:.1f} s after a socket opens" in line
    hint = flat(out)
    assert f"its first ping comes after {first_ping:.1f} s" in hint
    assert f"a hop closes a socket idle for {closed_after:.1f} s" in hint
    assert f"Set the server's ping interval below {closed_after:.1f} s" in hint
    assert "keep server pings on" not in hint
    assert "idle socket: waiting 10 s on a socket with nothing sent, not even pings" in err
    assert f"idle socket: closed after {closed_after:.1f} s with no ping from the server" in err
    assert "timing the server's pings" in err


def test_server_pings_off_behind_a_proxys_idle_timeout(capsys: pytest.CaptureFixture[str]) -> None:
    with (
        served(build_app(), ws_ping_interval=None) as base_url,
        IdleTunnel(base_url, idle=1.0) as proxied,
    ):
        status, out, rows, _ = run(capsys, proxied, "--idle", "3", "--max-probe-bytes", "0")
    assert status == 1, out
    assert rows["idle socket"] == "FAILED"
    assert "no ping from the server in 3 s" in row(out, "idle socket")
    hint = flat(out)
    assert "the server sent no ping in 3 s" in hint
    assert "turn them on with an interval below 1." in hint


def test_server_pings_faster_than_a_proxys_idle_timeout_keep_the_socket(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with (
        served(build_app(), ws_ping_interval=0.5) as base_url,
        IdleTunnel(base_url, idle=2.0) as proxied,
    ):
        status, out, rows, _ = run(capsys, proxied, "--idle", "4", "--max-probe-bytes", "0")
    assert status == 0, out
    assert rows["idle socket"] == "ok"
    assert re.search(r"\(\d+ pings from the server, every \d+\.\d s\)", row(out, "idle socket"))


def test_uvicorns_default_frame_limit_is_found_without_a_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The probes past uvicorn's 16 MiB each close with 1009 while the message is still being
    sent; every one is reported as such (not as a dropped connection), and nothing logs the
    race websockets' blocking client loses there (``EOFError: stream ended``)."""
    results = tmp_path / "check.json"
    server = ServerThread(
        build_app(), ws_max_size=UVICORN_WS_MAX_SIZE, lifetime=120, name="check-uvicorn"
    )
    with server as base_url:
        status, out, rows, err = run(
            capsys, base_url, "--idle", "0", "--min-probe-bytes", "8MiB",
            "--max-probe-bytes", "32MiB", "--json", str(results),
        )  # fmt: skip
    assert status == 1, out
    assert rows["largest message"] == "FAILED"
    assert "16.00 MiB (16777216 B) gets through" in row(out, "largest message")
    assert "close 1009 (message too big)" in row(out, "largest message")
    assert "16.00 MiB is the default limit of uvicorn (--ws-max-size)" in flat(out)
    probes = json.loads(results.read_text())["checks"][6]["data"]["probes"]
    assert [probe["failure"] for probe in probes if not probe["ok"]] == ["1009"] * 7
    assert "EOFError" not in err
    assert "largest message: 32.00 MiB (33554432 B): close 1009 (message too big)" in err


def test_a_store_that_fails_is_told_apart_from_a_missing_middleware(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    results = tmp_path / "check.json"
    with RedisServer() as redis_server:
        app = build_app(store=RedisStore(redis_server.url, timeout=1.0))
        with served(app) as base_url:
            redis_server.stop()  # Redis goes down under a running server
            status, out, rows, _ = run(capsys, base_url, *FAST, "--json", str(results))
    assert status == 1, out
    assert rows["handshake"] == rows["chained conversation"] == rows["lanes"] == "ok"
    assert rows["previous_response_not_found"] == "FAILED"
    assert "got store_unavailable (503)" in row(out, "previous_response_not_found")
    hint = flat(out)
    assert "its middleware is in front; what failed is its response store" in hint
    assert "Check the store" in hint
    assert "put ws_mode's WebSocketModeMiddleware in front" not in hint
    check = json.loads(results.read_text())["checks"][3]
    assert check["data"] == {"code": "store_unavailable"}


def test_progress_goes_to_stderr_unless_quiet(
    serve: ServeProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _, err = run(capsys, serve.origin, "--idle", "0.5", "--max-probe-bytes", "64KiB")
    assert status == 0, out
    assert err.startswith(f"ws-mode check: checking {serve.origin.replace('http', 'ws')}")
    assert "  handshake: ok\n" in err
    assert "  largest message: 64.0 KiB (65536 B): got through\n" in err
    assert "  idle socket: waiting 0.5 s on a socket with nothing sent" in err
    assert "8 ok, 0 failed" in out  # the table is on stdout, and only there
    assert "8 ok" not in err
    status, out, _, err = run(capsys, serve.origin, *FAST, "--quiet")
    assert status == 0, out
    assert err == ""
    assert "6 ok, 0 failed, 2 skipped" in out


def test_nothing_listening(capsys: pytest.CaptureFixture[str]) -> None:
    with served(build_app()) as base_url:
        pass  # the port is free again
    status, out, rows, _ = run(capsys, base_url, *FAST)
    assert status == 1
    assert rows["handshake"] == "FAILED"
    assert "could not connect" in row(out, "handshake")


def test_urls_and_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    responses = "/v1/responses"
    assert target_of("http://h:8000") == ("http://h:8000", responses)
    assert target_of("https://h/v1/") == ("https://h", responses)
    assert target_of("https://h/api/v1") == ("https://h/api", responses)
    assert target_of("ws://h:8000/v1/responses") == ("http://h:8000", responses)
    assert target_of("wss://h/api/v1/responses") == ("https://h/api", responses)
    assert target_of("wss://h") == ("https://h", responses)
    assert target_of("ws://h/socket") == ("http://h", "/socket")
    with pytest.raises(CommandError):
        target_of("ftp://h")
    assert parse_size("65536") == 65536
    assert parse_size("64KiB") == parse_size("64k") == 64 * KiB
    assert parse_size("1.5MiB") == 3 * 512 * KiB
    assert main(["check", "http://h", "--max-probe-bytes", "lots"]) == 2
    assert "expected a size" in capsys.readouterr().err
    assert main(["check", "http://h", "--header", "no colon", *FAST]) == 1
    assert "--header must be 'Name: value'" in capsys.readouterr().err


def test_the_prompt_cache_share_is_read_from_the_turns_usage() -> None:
    def usage(input_tokens: int, cached: int | None) -> dict[str, Any]:
        details = {"cached_tokens": cached}
        return {"usage": {"input_tokens": input_tokens, "input_tokens_details": details}}

    said, data = prompt_cache(usage(40, 0), usage(100, 80)) or ("", {})
    assert data == {"continuation": 0.8, "first": 0.0}
    assert said == (
        "prompt cache: the continuation read 0.80 of its input tokens from it (the first turn 0.00)"
    )
    assert prompt_cache(usage(40, 0), {"usage": None}) is None  # nothing reported: not said
    assert prompt_cache({}, usage(100, None)) == (
        "prompt cache: the continuation read 0.00 of its input tokens from it",
        {"continuation": 0.0, "first": None},
    )
