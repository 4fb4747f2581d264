"""``ws-mode bench``: a short run completes and reports every mode (the goals only with
``--check``, whose exit status follows them); the forwarding microbenchmark measures positive
rates; the server process never outlives the benchmark.

No test asserts a time or a ratio: the machine is shared and the numbers are noisy.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import httpx
import pytest

from ws_mode.toolkit.bench import goals
from ws_mode.toolkit.bench.forward import forward_frames, forwarding_cost_in_process, run_forward
from ws_mode.toolkit.bench.goals import Goal
from ws_mode.toolkit.bench.options import BenchError
from ws_mode.toolkit.bench.run import server_process, windows
from ws_mode.toolkit.bench.server import STATS_PATH, ServerSpec
from ws_mode.toolkit.cli import main

MODES = ("HTTP", "WS drop-in", "WS cache-aware")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _rows(section: str, label: str) -> list[str]:
    return [line for line in section.splitlines() if line.strip().startswith(label + "  ")]


def test_short_bench_run_reports_every_mode_and_no_goal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    picture = tmp_path / "turns.png"
    measurements = tmp_path / "bench.json"
    argv = [
        "bench",
        "--turns",
        "4",
        "--repeat",
        "1",
        "--tokens-per-second",
        "4000",
        "--forward-events",
        "300",
        "--json",
        str(measurements),
        "--quiet",
    ]
    if has_matplotlib:
        argv += ["--plot", str(picture)]
    status = main(argv)
    captured = capsys.readouterr()
    assert status == 0, captured.err
    out = captured.out
    assert "4 turns (3 tool calls" in out
    zero, _, rest = out.partition("model at 4000 tokens/s")
    assert "model at zero cost" in zero
    for section, tables in ((zero, 3), (rest, 2)):
        for label in MODES:
            # A timing row and a work row per mode and speed, and where the time went at zero cost.
            assert len(_rows(section, label)) == tables, (label, section)
    assert "bare Starlette WebSocket" in out
    assert "through the middleware" in out
    assert "ws_mode's own CPU per event" in out
    # Measurements and ratios only: the project's goals wait for --check.
    assert "goal" not in out.lower(), out

    data = json.loads(measurements.read_text())
    assert set(data["summaries"]) == {"zero-cost", "4000tps"}
    for rows in data["summaries"].values():
        assert [row["label"] for row in rows] == list(MODES)
        for row in rows:
            assert len(row["turn_curve"]) == 4
            assert row["end_to_end"] > 0
    # The client sends only the new items over the socket, the whole history over HTTP.
    http, drop_in, cache_aware = data["summaries"]["zero-cost"]
    assert drop_in["bytes_sent"] == cache_aware["bytes_sent"] < http["bytes_sent"]
    assert cache_aware["handler_bytes"] < drop_in["handler_bytes"]
    assert "goals" not in data

    if not has_matplotlib:
        pytest.skip("matplotlib is not installed: the plot is not checked")
    assert picture.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize("reachable", [True, False])
def test_check_compares_with_the_goals_and_exits_by_them(
    reachable: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    # Limits every measurement meets, or none can: the exit status follows the goals.
    for name in (
        *("GOAL_CACHE_AWARE", "GOAL_FLAT", "GOAL_DROP_IN"),
        *("GOAL_FORWARD_OWN_US", "GOAL_FORWARD_CPU"),
    ):  # all at most
        monkeypatch.setattr(goals, name, math.inf if reachable else -math.inf)
    measurements = tmp_path / "bench.json"
    argv = [
        *("bench", "--turns", "3", "--repeat", "1", "--warmup", "0"),
        *("--tokens-per-second", "0", "--forward-events", "50", "--quiet"),
        *("--json", str(measurements), "--check"),
    ]
    status = main(argv)
    captured = capsys.readouterr()
    assert status == (0 if reachable else 1), captured.err
    lines = [line.strip() for line in captured.out.splitlines()]
    found = [line for line in lines if line.startswith("goal:")]
    assert len(found) == 5, captured.out
    for line in found:
        verdict = re.search(r": -?\d+\.\d\d - (met|NOT MET)", line)
        assert verdict is not None, line
        assert (verdict.group(1) == "met") == reachable, line
    for text in (
        *("cache-aware end-to-end", "late / early", "drop-in end-to-end"),
        *("ws_mode's own CPU per event", "server CPU per event / the bare"),
    ):
        assert any(text in line for line in found), text
    data = json.loads(measurements.read_text())
    assert [goal["met"] for goal in data["goals"]] == [reachable] * 5
    if reachable:
        assert "not met" not in captured.err
    else:
        assert "ws-mode bench: 5 goal(s) not met" in captured.err


def test_plot_without_matplotlib_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert main(["bench", "--plot", str(tmp_path / "x.png"), "--quiet"]) == 1
    assert "--plot needs matplotlib" in capsys.readouterr().err


def test_forwarding_microbenchmark_measures_positive_rates() -> None:
    spec = ServerSpec(tool_calls=1, forward_events=200)
    with server_process(spec) as base_url:
        result = run_forward(base_url, events=200, repeat=2)
    assert len(result.bare_rates) == len(result.middleware_rates) == 2
    assert result.bare_rate > 0
    assert result.middleware_rate > 0
    assert result.ratio > 0


def test_forwarding_cost_in_process_is_positive() -> None:
    costs = forwarding_cost_in_process(200, repeat=2)
    assert len(costs) == 2
    assert all(cost > 0 for cost in costs)


def test_server_process_serves_stats_and_is_stopped() -> None:
    with server_process(ServerSpec(tool_calls=1, speeds=(0.0, 100.0))) as base_url:
        stats = httpx.get(base_url + STATS_PATH).json()
        assert len(stats["references"]) == 2
        assert stats["cpu_seconds"] > 0
        reset = httpx.post(base_url + STATS_PATH).json()
        assert reset["references"][0]["requests"] == 0
    with pytest.raises(httpx.TransportError):
        httpx.get(base_url + STATS_PATH, timeout=2.0)


def test_server_process_needs_no_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The child is `python -m ws_mode.toolkit.bench.server` from wherever the bench runs.
    monkeypatch.chdir(tmp_path)
    with server_process(ServerSpec(tool_calls=1)) as base_url:
        assert base_url.startswith("http://127.0.0.1:")
        assert httpx.get(base_url + STATS_PATH).json()["cpu_seconds"] > 0


def test_server_that_cannot_start_is_reported() -> None:
    with pytest.raises(BenchError, match="exited"), server_process(ServerSpec(), python="false"):
        pass


def test_windows_leave_out_the_first_and_last_turns() -> None:
    assert windows(25) == (slice(1, 4), slice(21, 24))
    assert windows(6) == (slice(1, 3), slice(3, 5))
    assert windows(4) == (slice(1, 2), slice(2, 3))
    assert windows(2) == (slice(0, 2), slice(0, 2))


def test_goals_compare_in_their_direction() -> None:
    assert Goal("at most", 0.2, 0.3, at_most=True).met
    assert not Goal("at most", 0.4, 0.3, at_most=True).met
    assert Goal("at least", 0.7, 0.67, at_most=False).met
    assert not Goal("nan", float("nan"), 1.0, at_most=True).met


def test_forward_frames_frame_one_response() -> None:
    frames = [json.loads(frame) for frame in forward_frames(3)]
    assert [frame["type"] for frame in frames] == [
        "response.created",
        *["response.output_text.delta"] * 3,
        "response.completed",
    ]
    assert [frame["sequence_number"] for frame in frames] == [0, 1, 2, 3, 4]


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--turns", "1"]) == 2
    assert "--turns" in capsys.readouterr().err
    assert main(["bench", "--concurrency", "0"]) == 2
