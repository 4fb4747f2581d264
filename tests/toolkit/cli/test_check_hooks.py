"""``ws-mode check URL`` against a server whose own hook raises (the reference server behind the
middleware, under uvicorn): the check names the hook and sends the reader to the server log,
where a missing middleware was advised before (the middleware is there: it answered)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from starlette.types import Scope

from tests.toolkit.cli.checks import FAST, flat, row, run
from ws_mode import WebSocketModeMiddleware
from ws_mode.testing._loopback import ServerThread, ws_max_size
from ws_mode.toolkit.reference import ReferenceConfig, create_app

KiB = 1024
MISSING_MIDDLEWARE = "put ws_mode's WebSocketModeMiddleware in front"


@contextmanager
def served(**options: Any) -> Iterator[str]:
    """The reference server behind a middleware with `options`, under uvicorn."""
    app = WebSocketModeMiddleware(create_app(ReferenceConfig()), **options)
    server = ServerThread(app, ws_max_size=ws_max_size(), lifetime=120, name="check-hooks")
    with server as base_url:
        yield base_url


def always_raises(items: list[dict[str, Any]]) -> list[int]:
    raise ValueError("this tokenizer is broken")


def refuses_long_input(items: list[dict[str, Any]]) -> list[int]:
    """A tokenizer that raises on input over 64 KiB, as the user's did over 1 MB."""
    if len(json.dumps(items)) > 64 * KiB:
        raise ValueError("input over 64 KiB")
    return [1] * len(items)


def test_a_renderer_that_raises_is_named_not_a_missing_middleware(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with served(renderer=always_raises) as base_url:
        status, out, rows, _ = run(capsys, base_url, *FAST)
    assert status == 1, out
    assert rows["handshake"] == "ok"
    for name in ("warm-up", "chained conversation", "lanes", "error envelope"):
        assert rows[name] == "FAILED", out
    assert "renderer failed on this request" in row(out, "warm-up")
    hints = flat(out)
    assert "your renderer raised: see the server log" in hints
    assert MISSING_MIDDLEWARE not in hints


def test_a_renderer_that_raises_on_large_input_fails_the_largest_message_check(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    results = tmp_path / "check.json"
    with served(renderer=refuses_long_input) as base_url:
        status, out, rows, _ = run(
            capsys, base_url, "--idle", "0", "--min-probe-bytes", "16KiB",
            "--max-probe-bytes", "256KiB", "--json", str(results),
        )  # fmt: skip
    assert status == 1, out
    assert rows["warm-up"] == rows["chained conversation"] == "ok"
    assert rows["largest message"] == "FAILED"
    assert "renderer failed on this request" in row(out, "largest message")
    hints = flat(out)
    assert "your renderer raised: see the server log" in hints
    assert MISSING_MIDDLEWARE not in hints
    check = next(
        each
        for each in json.loads(results.read_text())["checks"]
        if each["name"] == "largest message"
    )
    assert check["data"]["failure"] == "hook"
    assert {probe["hook"] for probe in check["data"]["probes"] if not probe["ok"]} == {"renderer"}


def test_an_authenticate_hook_that_raises_is_named_at_the_handshake(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def authenticate(scope: Scope) -> str:
        raise ConnectionError("the auth service is down")

    with served(authenticate=authenticate) as base_url:
        status, out, rows, _ = run(capsys, base_url, *FAST)
    assert status == 1, out
    assert rows["handshake"] == "FAILED"
    assert "HTTP 500: the application's authenticate raised" in row(out, "handshake")
    hints = flat(out)
    assert "your authenticate raised: see the server log" in hints
    assert "the proxy's upstream address" not in hints
