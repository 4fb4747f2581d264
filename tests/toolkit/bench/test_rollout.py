"""``ws-mode bench``'s rollout comparison (`ws_mode.toolkit.bench.rollout`): a short run completes
and reports every mode (the goals only with ``--check``: see test_goals.py), with ``--link``
every mode's client goes through the relay, so no turn can be faster than the link's round trip
(a lower bound that follows from the design), and the report says which link it modelled; the
windows leave out the first and last turns; usage errors are refused.

No test asserts a time or a ratio as an upper bound: the machine is shared and noisy.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from ws_mode.toolkit.bench.rollout import windows
from ws_mode.toolkit.cli import main

MODES = ("HTTP", "WS drop-in", "WS cache-aware")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RTT = 0.08


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
    assert "ws_mode's own CPU per socket turn" in out
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
    assert data["forward"]["in_process_cpu_per_turn"] > 0
    assert data["forward"]["in_process_cache_aware_cpu_per_turn"] > 0

    if not has_matplotlib:
        pytest.skip("matplotlib is not installed: the plot is not checked")
    assert picture.read_bytes().startswith(PNG_MAGIC)


def test_plot_without_matplotlib_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert main(["bench", "--plot", str(tmp_path / "x.png"), "--quiet"]) == 1
    assert "--plot needs matplotlib" in capsys.readouterr().err


def test_windows_leave_out_the_first_and_last_turns() -> None:
    assert windows(25) == (slice(1, 4), slice(21, 24))
    assert windows(6) == (slice(1, 3), slice(3, 5))
    assert windows(4) == (slice(1, 2), slice(2, 3))
    assert windows(2) == (slice(0, 2), slice(0, 2))


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--turns", "1"]) == 2
    assert "--turns" in capsys.readouterr().err
    assert main(["bench", "--concurrency", "0"]) == 2


def test_link_makes_every_turn_of_every_mode_last_a_round_trip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measurements = tmp_path / "bench.json"
    argv = [
        *("bench", "--turns", "3", "--repeat", "1", "--warmup", "0"),
        *("--tokens-per-second", "0", "--forward-events", "0", "--quiet"),
        *("--link", "rtt=80ms,up=10mbit", "--json", str(measurements)),
    ]
    status = main(argv)
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "through a relay modelling rtt 80 ms, up 10 Mbit/s, down unlimited" in captured.out
    data = json.loads(measurements.read_text())
    assert data["link"] == "rtt 80 ms, up 10 Mbit/s, down unlimited"
    rows = data["summaries"]["zero-cost"]
    assert len(rows) == 3
    for row in rows:
        # A request and its answer cross the relay both ways: at least one round trip.
        assert all(seconds >= RTT for seconds in row["turn_curve"]), row["label"]
        assert row["end_to_end"] >= RTT * 3
