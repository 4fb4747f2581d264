"""``ws-mode check URL`` against real servers on loopback: ``ws-mode serve`` itself (every check
passes), the same server behind a WebSocket reverse proxy with a small frame limit (the
ceiling found and reported), WebSocket mode switched off (426), a proxy that strips
``Upgrade``, refused credentials, and sockets dropped when idle (by a proxy, by ws_mode)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.types import Receive, Scope, Send
from websockets.exceptions import InvalidStatus

from tests.servers import ServeProcess, ws_mode_serve
from ws_mode import WebSocketModeMiddleware
from ws_mode._auth import AuthenticationFailed, bearer_token
from ws_mode._limits import Limits
from ws_mode.testing._client import AsyncSocket, SocketClosed, connect_async
from ws_mode.testing._loopback import ServerThread, ws_max_size
from ws_mode.toolkit.check import CheckOptions, Target, find_ceiling
from ws_mode.toolkit.cli import main
from ws_mode.toolkit.cli.check import parse_size, target_of
from ws_mode.toolkit.cli.common import CommandError
from ws_mode.toolkit.cli.serve import build_app
from ws_mode.toolkit.http_client import HttpClient, HttpStatusError

KiB = 1024
#: Flags that keep a run short: no idle wait, small probes.
FAST = ("--idle", "0", "--max-probe-bytes", "0", "--timeout", "10")


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


@contextlib.contextmanager
def served(app: Any) -> Iterator[str]:
    """Serve ``app`` (a ws_mode app) on loopback as ``ws-mode serve`` would."""
    with ServerThread(app, ws_max_size=ws_max_size(), lifetime=120, name="check-app") as url:
        yield url


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """``ws-mode serve`` in a child process, for the whole module."""
    with ws_mode_serve(cwd=tmp_path_factory.mktemp("serve")) as process:
        yield process


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, dict[str, str]]:
    """``ws-mode check ARGS``: its exit status, its output, and each row's result."""
    status = main(["check", *args])
    out = capsys.readouterr().out
    rows = {}
    for line in out.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) >= 2 and cells[1] in ("ok", "FAILED", "skipped"):
            rows[cells[0]] = cells[1]
    return status, out, rows


def flat(out: str) -> str:
    """The output with its line breaks (the wrapped hints') made spaces."""
    return " ".join(out.split())


def row(out: str, name: str) -> str:
    """The table line of the check ``name``."""
    return next(line for line in out.splitlines() if line.strip().startswith(name + "  "))


def test_every_check_passes_against_ws_mode_serve(
    serve: ServeProcess, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    results = tmp_path / "check.json"
    status, out, rows = run(
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
    probes = checks["largest message"]["data"]["probes"]
    assert [probe["size"] for probe in probes] == [64 * KiB, 128 * KiB, 256 * KiB]
    assert all(probe["ok"] for probe in probes)


def test_a_proxys_frame_limit_is_found(
    serve: ServeProcess, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    results = tmp_path / "check.json"
    with relay(serve.origin, limit=256 * KiB) as proxied:
        status, out, rows = run(
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
        status, out, rows = run(capsys, base_url, "--idle", "0", "--max-probe-bytes", "512KiB")
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
        status, out, rows = run(capsys, base_url, "--json", str(results))
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


def test_a_proxy_that_strips_upgrade_is_named(
    serve: ServeProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    with relay(serve.origin, strip_upgrade=True) as proxied:
        status, out, rows = run(capsys, proxied, *FAST)
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
        status, out, rows = run(capsys, base_url, *FAST)
        assert status == 1
        assert rows["handshake"] == "FAILED"
        assert "HTTP 401: the credentials were refused" in row(out, "handshake")
        assert "--api-key" in flat(out)
        status, out, _ = run(capsys, base_url, *FAST, "--api-key", "secret")
        assert status == 0, out
        monkeypatch.setenv("OPENAI_API_KEY", "secret")
        status, out, _ = run(capsys, base_url, *FAST)
        assert status == 0, out


def test_a_proxy_that_drops_idle_sockets_fails_the_idle_check(
    serve: ServeProcess, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    results = tmp_path / "check.json"
    with relay(serve.origin, idle=1.0) as proxied:
        status, out, rows = run(
            capsys, proxied, "--idle", "30", "--max-probe-bytes", "0", "--json", str(results)
        )
    assert status == 1
    assert rows["idle socket"] == "FAILED"
    assert rows["chained conversation"] == "ok"
    assert "close 1001" in row(out, "idle socket")
    assert "proxy_read_timeout" in flat(out)
    assert "AWS ALB" in flat(out)
    idle = json.loads(results.read_text())["checks"][7]["data"]
    assert idle["closed_after"] >= 0.9  # the proxy waits 1 s without a frame
    assert idle["close_code"] == 1001


def test_ws_modes_own_idle_limit_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    app = build_app(limits=Limits(max_idle_seconds=1))
    with served(app) as base_url:
        status, out, rows = run(capsys, base_url, "--idle", "30", "--max-probe-bytes", "0")
    assert status == 1
    assert rows["idle socket"] == "FAILED"
    assert "websocket_idle_timeout" in row(out, "idle socket")
    assert "Limits.max_idle_seconds" in flat(out)


def test_nothing_listening(capsys: pytest.CaptureFixture[str]) -> None:
    with served(build_app()) as base_url:
        pass  # the port is free again
    status, out, rows = run(capsys, base_url, *FAST)
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
