"""``ws-mode serve`` and ``ws-mode proxy`` ask their ``--store`` whether it works before they
serve: one line naming the problem and exit 1, or, with ``--start-degraded``, a loud warning
and a server; and the URL forms ``--store`` takes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis_server import RedisServer
from tests.servers import first_line, stop
from ws_mode.redis_store import RedisStore
from ws_mode.toolkit.cli import build_parser, main
from ws_mode.toolkit.cli.common import is_redis_url, store_from_argument
from ws_mode.toolkit.cli.serve import ServeSettings


@pytest.fixture(scope="module")
def stopped() -> RedisServer:
    gone = RedisServer().start()
    gone.stop()
    return gone


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


def test_serve_refuses_a_store_that_does_not_work(
    stopped: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--port", "0", "--store", stopped.url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ws-mode serve: error: the store does not work: RedisStoreError: ")
    assert f"redis://127.0.0.1:{stopped.port}/0 cannot be reached" in err
    assert "--start-degraded" in err


def test_serve_refuses_a_database_that_does_not_exist(
    server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    url = server.url.replace("/0", "/1").replace("redis://", "redis://:pass-word@")
    assert main(["serve", "--port", "0", "--store", url]) == 1
    err = capsys.readouterr().err
    assert "has no such database" in err
    assert "pass-word" not in err


def test_proxy_refuses_a_store_that_does_not_work(
    stopped: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--store", stopped.url, "--store-scope", "shared", "--port", "0"]
    assert main(["proxy", "--upstream", "http://127.0.0.1:9/v1", *flags]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ws-mode proxy: error: the store does not work: ")
    assert f"127.0.0.1:{stopped.port}" in err


def test_serve_starts_degraded_when_asked_and_says_so(stopped: RedisServer, tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "ws_mode.toolkit.cli", "serve", "--port", "0",
         "--store", stopped.url, "--start-degraded", "--log-level", "warning"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        said = first_line(process, "WARNING:  ws_mode._middleware: STARTING DEGRADED", 20)
        assert f"127.0.0.1:{stopped.port}" in said
        first_line(process, "ws-mode serve: WebSocket mode", 20)  # then it serves
    finally:
        stop(process)


def test_the_store_urls_serve_takes() -> None:
    for url in (
        "redis://127.0.0.1:6379/0",
        "rediss://:pw@redis.internal:6380/2",
        "unix:///run/redis.sock?db=1",
        "redis+cluster://10.0.0.1:7000,10.0.0.2:7000",
        "rediss+cluster://user:pw@[::1]:7000",
        "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster/3",
        "REDISS+SENTINEL://s:26379/main",
    ):
        assert is_redis_url(url), url
        assert main(["serve", "--store", url, "--help"]) == 0, url


def test_start_degraded_reaches_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = ServeSettings(store="memory", start_degraded=True)
    variables = settings.environment()
    assert variables["WS_MODE_SERVE_START_DEGRADED"] == "true"
    assert ServeSettings.from_environment(variables) == settings
    with pytest.raises(ValueError, match="WS_MODE_SERVE_START_DEGRADED"):
        ServeSettings.from_environment({"WS_MODE_SERVE_START_DEGRADED": "maybe"})
    assert settings.build().start_degraded


def test_serve_and_proxy_take_wait_replicas_from_the_store_url(
    server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """No flag of its own: `--store 'redis://...?wait_replicas=1'` gives the store that
    serve builds (in its process, and in each worker from the environment) and proxy builds;
    a bad value is a usage error that names it, without the password."""
    url = f"{server.url}?wait_replicas=1"
    settings = ServeSettings.from_arguments(build_parser().parse_args(["serve", "--store", url]))
    worker = ServeSettings.from_environment(settings.environment())
    proxy = build_parser().parse_args(
        ["proxy", "--upstream", "http://127.0.0.1:9/v1", "--store", url, "--store-scope", "shared"]
    )
    stores = [
        settings.build().settings.store,
        worker.build().settings.store,
        store_from_argument(proxy.store),  # what ws-mode proxy makes of --store
    ]
    try:
        assert [type(store) for store in stores] == [RedisStore] * 3
        assert [getattr(store, "wait_replicas", None) for store in stores] == [1, 1, 1]
    finally:
        for store in stores:
            if store is not None:
                asyncio.run(store.aclose())
    bad = server.url.replace("redis://", "redis://:s3cret@") + "?wait_replicas=-1"
    for command in (["serve"], ["proxy", "--upstream", "http://127.0.0.1:9/v1"]):
        assert main([*command, "--store", bad]) == 2
        err = capsys.readouterr().err
        assert "wait_replicas in a store URL is a whole number, 0 or more: got '-1'" in err
        assert "s3cret" not in err
