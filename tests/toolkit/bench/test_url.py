"""``ws-mode bench --url``: against a server of the user's on loopback (the middleware in front
of the reference handler), HTTP with the full history against WebSocket mode, interleaved, on
a conversation with tool calls; credentials from ``--api-key``, ``OPENAI_API_KEY`` or
``--header``; wrong credentials (401) and a server that cannot be reached are reported in
words (refused upgrades, the mode, the answers and the spread: test_url_truth.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.types import Scope

from ws_mode import WebSocketModeMiddleware
from ws_mode._auth import AuthenticationFailed, bearer_token
from ws_mode.testing._loopback import ServerThread, bind_loopback, origin
from ws_mode.toolkit.bench.url import api_base
from ws_mode.toolkit.cli import main
from ws_mode.toolkit.reference import ReferenceConfig, create_app

KEY = "sk-test-key"


async def _authenticate(scope: Scope) -> str:
    if bearer_token(scope) != KEY:
        raise AuthenticationFailed()
    return "user"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    app = WebSocketModeMiddleware(create_app(ReferenceConfig(tool_calls=2)))
    with ServerThread(app, lifetime=120) as base_url:
        yield base_url


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["bench", *argv, "--quiet"])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_url_compares_http_and_the_socket_on_a_conversation(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measurements = tmp_path / "url.json"
    status, out, err = _run(
        capsys,
        *("--url", server + "/v1", "--model", "any-model", "--turns", "7"),
        *("--repeat", "1", "--warmup", "0", "--json", str(measurements)),
    )
    assert status == 0, err
    assert f"ws-mode bench --url {server}:" in out
    assert f"ws://{server.removeprefix('http://')}/v1/responses" in out
    assert "WebSocket mode (always) took" in out
    data = json.loads(measurements.read_text())
    http, socket = data["summaries"]
    assert [http["label"], socket["label"]] == ["HTTP (full history)", "WebSocket mode (always)"]
    for row in (http, socket):
        assert len(row["turn_curve"]) == 7  # the conversation went on past the answers
        assert row["end_to_end"] > 0
        # Two tool calls per user message: 7 calls are 2 + answer, 2 + answer, and 1 more,
        # which the conversation ends on without answering it.
        assert row["tool_calls"] == 4
    assert socket["bytes_sent"] < http["bytes_sent"]
    assert data["ratio"] > 0


def test_url_sends_the_api_key_and_keeps_it_out_of_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = WebSocketModeMiddleware(
        create_app(ReferenceConfig(tool_calls=1)), authenticate=_authenticate
    )
    measurements = tmp_path / "url.json"
    with ServerThread(app, lifetime=60) as base_url:
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        status, _, err = _run(capsys, "--url", base_url, "--model", "m", "--turns", "2")
        assert status == 1
        assert "the credentials were refused" in err
        assert "401" in err
        assert "--api-key" in err
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        argv = ("--url", base_url, "--model", "m", "--turns", "2", "--repeat", "1")
        status, _, err = _run(capsys, *argv, "--json", str(measurements))
        assert status == 0, err
        monkeypatch.delenv("OPENAI_API_KEY")
        header = f"Authorization: Bearer {KEY}"
        status, _, err = _run(capsys, *argv, "--header", header, "--header", "X-Trace: 1")
        assert status == 0, err
    text = measurements.read_text()
    assert KEY not in text
    assert json.loads(text)["options"]["api_key"] == "***"


def test_url_that_cannot_be_reached_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    listener = bind_loopback()
    base_url = origin(listener)
    listener.close()  # nothing listens there any more
    status, _, err = _run(capsys, "--url", base_url, "--model", "m")
    assert status == 1
    assert f"cannot reach 127.0.0.1:{base_url.rpartition(':')[2]}" in err


def test_api_base_takes_an_origin_or_an_sdk_base_url() -> None:
    assert api_base("http://h:1") == "http://h:1"
    assert api_base("http://h:1/v1/") == "http://h:1"
    assert api_base("http://h:1/api/v1/responses") == "http://h:1/api"
