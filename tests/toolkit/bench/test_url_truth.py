"""``ws-mode bench --url`` says what it measured and what it cannot conclude, against real
servers on loopback: a refused upgrade in ``ws-mode check``'s words (a stateless app without
the middleware: 403, 404 and 405 under uvicorn; 426 with the middleware switched off); the mode
each socket's handshake names (the README's app in each mode, both modes at two paths in one
run, ``unknown`` when the server does not say); the socket's answers held to HTTP's (a
mismatch fails the run, a model that is not deterministic is only noted); a model that calls no
tool; the spread of the repetitions, and the warning when it is too wide to conclude (the
summary function fed made-up samples, not timed).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from examples.fastapi_app import answer, create
from ws_mode import Usage, WebSocketModeMiddleware
from ws_mode._settings import FullContext
from ws_mode.testing._loopback import ServerThread
from ws_mode.toolkit.agent import RolloutResult
from ws_mode.toolkit.bench.options import BenchOptions
from ws_mode.toolkit.bench.url import (
    HTTP_MODE,
    UNKNOWN_MODE,
    UrlMode,
    UrlReport,
    _handshake,
    cautions,
    format_url_report,
    summarize,
)
from ws_mode.toolkit.check.results import HINTS
from ws_mode.toolkit.cli import main
from ws_mode.toolkit.measure import Spread
from ws_mode.toolkit.reference import ReferenceConfig, create_app

CACHE_AWARE_PATH = "/cache-aware/v1/responses"


def readme_app(full_context: FullContext | None) -> FastAPI:
    """The README's app (examples/fastapi_app.py), its middleware in ``full_context`` mode, or
    without the middleware (None): a stateless handler that calls no tool."""
    app = FastAPI()
    if full_context is not None:
        app.add_middleware(WebSocketModeMiddleware, full_context=full_context)
    app.post("/v1/responses")(create)
    return app


def words(text: str) -> str:
    return " ".join(text.split())


def bench(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> tuple[int, str, str]:
    status = main(["bench", "--url", url, "--model", "m", "--quiet", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


QUICK = ("--turns", "3", "--repeat", "2", "--warmup", "1")


@pytest.mark.parametrize(
    ("full_context", "options", "suffix", "kind", "detail"),
    [
        (None, {}, "", "forbidden", "HTTP 403: the upgrade was refused"),
        (None, {"ws": "none"}, "/nothing/v1", "not_found", "HTTP 404: nothing answers"),
        (None, {"ws": "none"}, "", "stripped", "HTTP 405 instead of 101"),
        ("off", {}, "", "disabled", "HTTP 426: WebSocket mode is switched off"),
    ],
)
def test_a_refused_upgrade_is_explained_as_check_explains_it(
    capsys: pytest.CaptureFixture[str],
    full_context: str | None,
    options: dict[str, Any],
    suffix: str,
    kind: str,
    detail: str,
) -> None:
    if full_context == "off":
        app: Any = WebSocketModeMiddleware(readme_app(None), enabled=False)
    else:
        app = readme_app(None)
    with ServerThread(app, lifetime=60, options=options) as base_url:
        status, out, err = bench(capsys, base_url + suffix, "--turns", "2")
        assert main(["check", base_url + suffix]) == 1
        checked = capsys.readouterr().out
    assert status == 1
    assert out == ""
    hint = words(HINTS[kind])
    assert detail in err
    assert detail in checked
    assert hint in words(err)
    assert hint in words(checked)
    assert "pass --api-key" not in err  # it said so of every 403 before


@pytest.mark.parametrize("full_context", ["always", "on_miss"])
def test_the_readme_app_in_each_mode_is_named_and_its_answers_held_to_https(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, full_context: FullContext
) -> None:
    measurements = tmp_path / "url.json"
    with ServerThread(readme_app(full_context), lifetime=120) as base_url:
        status, out, err = bench(capsys, base_url, *QUICK, "--json", str(measurements))
    text = words(out)
    assert f"WebSocket mode ({full_context})" in out
    assert f"(x-ws-mode-full-context): /v1/responses: {full_context}." in text
    other = "on_miss" if full_context == "always" else "always"
    assert f"To measure {other} too in the same run" in text
    data = json.loads(measurements.read_text())
    assert [row["full_context"] for row in data["summaries"]] == [None, full_context]
    # The README's handler answers; it never calls a tool.
    assert "The model made no tool call: the rollout needs a model that calls the tool" in text
    assert "these figures measure single turns" in text
    if full_context == "always":
        assert status == 0, err
        assert "Answers: the socket's were HTTP's in every run" in out
        assert data["mismatches"] == []
    else:
        # Not cache-aware: on a cache hit it counts the new items only, which HTTP never does.
        assert status == 1
        assert "the socket's answers differ from HTTP's" in err
        assert "MISMATCH: WebSocket mode (on_miss) at /v1/responses" in out
        assert "I have seen 3 item(s)." in out  # HTTP's second turn
        assert "I have seen 1 item(s)." in out  # the socket's
        assert "full_context='on_miss'" in out
        assert len(data["mismatches"]) == 1


def test_a_model_that_is_not_deterministic_is_noted_not_failed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    app = FastAPI()
    app.add_middleware(WebSocketModeMiddleware)

    @app.post("/v1/responses")
    async def random(request: Request) -> Response:
        return answer(await request.json(), f"A roll of the dice: {uuid.uuid4().hex}.")

    with ServerThread(app, lifetime=120) as base_url:
        status, out, err = bench(capsys, base_url, *QUICK)
    assert status == 0, err
    assert "Answers not compared for WebSocket mode (always) at /v1/responses" in words(out)
    assert "MISMATCH" not in out


@pytest.fixture(scope="module")
def both_modes() -> Iterator[str]:
    """The reference server (a tool call per user message, cache-aware) with one middleware
    per mode: drop-in at /v1/responses, cache-aware at CACHE_AWARE_PATH."""
    drop_in = WebSocketModeMiddleware(create_app(ReferenceConfig(tool_calls=1)))
    app = WebSocketModeMiddleware(
        drop_in, path=CACHE_AWARE_PATH, handler_path="/v1/responses", full_context="on_miss"
    )
    with ServerThread(app, lifetime=120) as base_url:
        yield base_url


def test_both_modes_at_two_paths_in_one_run_each_named_with_its_spread(
    both_modes: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    measurements = tmp_path / "url.json"
    status, out, err = bench(
        capsys,
        both_modes,
        *("--turns", "5", "--repeat", "3", "--warmup", "0", "--json", str(measurements)),
        *("--socket-path", "/v1/responses", "--socket-path", CACHE_AWARE_PATH),
    )
    assert status == 0, err
    text = words(out)
    assert f"/v1/responses: always; {CACHE_AWARE_PATH}: on_miss." in text
    assert "To measure" not in text
    header = next(line for line in out.splitlines() if "end-to-end" in line)
    assert "range" in header.split()
    rows = {line.split("  ")[1].strip(): line for line in out.splitlines() if "  WebSocket" in line}
    assert set(rows) == {"WebSocket mode (always)", "WebSocket mode (on_miss)"}
    data = json.loads(measurements.read_text())
    assert [row["full_context"] for row in data["summaries"]] == [None, "always", "on_miss"]
    assert [row["path"] for row in data["summaries"]][1:] == ["/v1/responses", CACHE_AWARE_PATH]
    for row in data["summaries"]:
        spread = row["spread"]
        assert spread["low"] <= spread["median"] == row["end_to_end"] <= spread["high"]
        assert row["tool_calls"] > 0
    assert "made no tool call" not in out
    assert data["mismatches"] == []
    assert data["notes"] == []
    # The reference server reports usage, and no prompt cache: every share read, all 0.
    assert "cached" in header.split()
    for row in data["summaries"]:
        assert (row["cached"], row["cached_first"]) == (0.0, 0.0)
    assert all("0.00 (first 0.00)" in line for line in rows.values())


def test_a_socket_whose_answer_names_no_mode_is_unknown() -> None:
    async def accept(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.close()

    app = Starlette(routes=[WebSocketRoute("/v1/responses", accept)])
    with ServerThread(app, lifetime=60) as base_url:
        assert _handshake(base_url, "/v1/responses", {}) == UNKNOWN_MODE
    with ServerThread(readme_app("on_miss"), lifetime=60) as base_url:
        assert _handshake(base_url, "/v1/responses", {}) == "on_miss"


def _results(*totals: float, tool_calls: int = 2) -> list[RolloutResult]:
    return [
        RolloutResult(
            mode="http",
            turn_seconds=[total / 2, total / 2],
            turn_bytes=[100, 100],
            total_seconds=total,
            tool_calls=tool_calls,
        )
        for total in totals
    ]


SOCKET = UrlMode("socket", "socket", full_context="always")


def test_the_summary_shows_the_spread_and_warns_when_the_ranges_overlap() -> None:
    http = summarize(HTTP_MODE, _results(1.2, 1.0, 1.1), 2)
    assert http.spread == Spread(1.0, 1.1, 1.2)
    assert http.end_to_end == 1.1
    apart = summarize(SOCKET, _results(0.5, 0.7, 0.6), 2)
    assert cautions([http, apart], 3) == []
    # One loaded run: the median says 2.54x slower, the ranges say nothing can be told.
    loaded = summarize(SOCKET, _results(2.794, 3.0, 0.9), 2)
    [warning] = cautions([http, loaded], 3)
    assert "ranges of HTTP (1.00 s-1.20 s) and WebSocket mode (always) (900.0 ms-3.00 s)" in (
        warning
    )
    assert "overlap" in warning
    assert "--repeat" in warning
    [single] = cautions([http, apart], 1)
    assert "one repetition" in single
    silent = summarize(SOCKET, _results(0.5, 0.7, 0.6, tool_calls=0), 2)
    quiet_http = summarize(HTTP_MODE, _results(1.2, 1.0, 1.1, tool_calls=0), 2)
    [no_tools] = cautions([quiet_http, silent], 3)
    assert "no tool call" in no_tools
    report = UrlReport(
        options=BenchOptions(url="http://h:1", model="m", turns=2, repeat=3),
        base="http://h:1",
        link=None,
        summaries=[http, loaded],
        seconds=1.0,
    )
    text = words("\n".join(format_url_report(report)))
    assert "WebSocket mode (always) took 2.54 of HTTP's time" in text
    assert "no difference that these repetitions can tell from noise" in text
    assert "slower" not in text
    assert "900.0 ms-3.00 s" in text


def test_the_prompt_cache_share_is_the_continuations_apart_from_the_first_turn() -> None:
    def cached(*usages: Usage | None) -> RolloutResult:
        return RolloutResult(mode="socket", turn_seconds=[0.1] * len(usages),
                             turn_bytes=[1] * len(usages), total_seconds=0.1 * len(usages),
                             tool_calls=2, usages=list(usages))  # fmt: skip

    runs = [
        cached(Usage(100, 0), Usage(200, 150), Usage(300, 250)),  # 400 of 500 read: 0.8
        cached(Usage(100, 0), None, Usage(300, 270)),  # a turn that reported none: 0.9
    ]
    assert runs[0].cache_share(continuations=True) == pytest.approx(0.8)
    assert runs[0].cache_share(continuations=False) == 0.0
    row = summarize(SOCKET, runs, 3)
    assert row.cached == pytest.approx(0.85)
    assert row.cached_first == 0.0
    silent = summarize(SOCKET, [cached(None, None)], 2)
    assert (silent.cached, silent.cached_first) == (None, None)
    report = UrlReport(
        options=BenchOptions(url="http://h:1", model="m", turns=3, repeat=2),
        base="http://h:1", link=None, summaries=[silent, row], seconds=1.0,
    )  # fmt: skip
    lines = format_url_report(report)
    assert any("0.85 (first 0.00)" in line for line in lines)
    assert "cached: the share of the continuations' input tokens" in words("\n".join(lines))
