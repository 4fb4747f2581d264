"""``ws-mode bench --proxy``: the upstream and the proxy run in their own processes, every mode
is reported with its fields, the proxy's CPU is read per turn, ``--profile`` profiles the proxy
too, ``--check`` reports the proxy's goals, ``--link`` puts a relay in front of the upstream and
of the proxy; the turn "at 100 KB" is found in the history.

No test asserts a time or a ratio as an upper bound: the machine is shared and noisy.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from ws_mode.toolkit.bench import goals
from ws_mode.toolkit.bench.control import process_cpu
from ws_mode.toolkit.bench.proxy import HISTORY_MARK, history_mark
from ws_mode.toolkit.cli import main

LABELS = ("HTTP direct", "WS via proxy", "HTTP via proxy")
RTT = 0.08


def test_proxy_bench_reports_every_mode_profiles_the_proxy_and_checks_its_goals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("GOAL_PROXY_FIXED_MS", "GOAL_PROXY_MARK_MS", "GOAL_PROXY_LOOPBACK"):
        monkeypatch.setattr(goals, name, math.inf)  # met whatever the machine does
    measurements = tmp_path / "proxy.json"
    profiles = tmp_path / "profiles"
    argv = [
        *("bench", "--proxy", "--turns", "4", "--repeat", "1", "--warmup", "0"),
        *("--tokens-per-second", "0", "--json", str(measurements)),
        *("--profile", str(profiles), "--check", "--quiet"),
    ]
    status = main(argv)
    captured = capsys.readouterr()
    out = captured.out
    for label in LABELS:
        assert any(line.strip().startswith(label + "  ") for line in out.splitlines()), label
    assert "The proxy's own cost" in out
    # Four turns of 4 KiB outputs never reach 100 KB: the report says so.
    assert "no turn's full-history body reaches 100,000 bytes" in out

    data = json.loads(measurements.read_text())
    rows = data["summaries"]["zero-cost"]
    assert [row["row"]["label"] for row in rows] == list(LABELS)
    direct, socket, http = (row["row"] for row in rows)
    for row in rows:
        assert len(row["row"]["turn_curve"]) == 4
        assert all(seconds > 0 for seconds in row["row"]["turn_curve"])
        assert row["row"]["end_to_end"] > 0
        assert row["row"]["server_cpu"] > 0  # the upstream answered every mode
        assert row["proxy_peak_rss"] > 0
    # The socket sends only the new items; HTTP through the proxy the same bodies as direct.
    assert socket["bytes_sent"] < direct["bytes_sent"] == http["bytes_sent"]
    # The same upstream saw the same contexts: it parsed the same bytes in every mode.
    assert direct["handler_bytes"] == socket["handler_bytes"] == http["handler_bytes"]
    through = rows[1]
    if process_cpu(os.getpid()) is not None:
        assert len(through["proxy_turn_cpu"]) == 4
        assert all(cpu > 0 for cpu in through["proxy_turn_cpu"])
        assert through["proxy_cpu"] == pytest.approx(sum(through["proxy_turn_cpu"]), rel=0.5)
    history = data["history"]
    assert history == sorted(history)
    assert history[0] < history[-1]

    # --profile: the proxy's and the upstream's profiles, per mode.
    names = sorted(path.name for path in profiles.iterdir())
    assert "proxy-zero-cost-ws_proxy.pstats" in names
    assert "upstream-zero-cost-direct.pstats" in names
    # --check: the three goals of a loopback run; the 100 KB one is not measured on 4 turns.
    found = [line.strip() for line in out.splitlines() if line.strip().startswith("goal:")]
    assert len(found) == 3, out
    assert [goal["met"] for goal in data["goals"]] == [True, False, True]
    assert "loopback" in found[2]
    assert status == 1, captured.err
    assert "1 goal(s) not met: proxy CPU per turn at 100 KB" in captured.err


def test_history_mark_is_the_first_tool_turn_past_100_kb() -> None:
    step = HISTORY_MARK // 4
    history = [step * turn for turn in range(1, 10)]  # turn 4 reaches the mark
    window, turn = history_mark(history)
    assert (window, turn) == (slice(3, 6), 4)
    # Reached only at the last turn (the answer): the late window, and the turn said.
    window, turn = history_mark(history[:4])
    assert (window, turn) == (slice(2, 3), 4)
    assert history_mark([1.0] * 8) == (slice(4, 7), None)


@pytest.mark.slow  # four processes and two relays: about 5 s
def test_link_works_with_the_proxy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    measurements = tmp_path / "proxy.json"
    argv = [
        *("bench", "--proxy", "--turns", "2", "--repeat", "1", "--warmup", "0"),
        *("--tokens-per-second", "0", "--quiet", "--link", "rtt=80ms"),
        *("--json", str(measurements)),
    ]
    status = main(argv)
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "each through a relay modelling rtt 80 ms" in captured.out
    data = json.loads(measurements.read_text())
    for row in data["summaries"]["zero-cost"]:
        assert all(seconds >= RTT for seconds in row["row"]["turn_curve"]), row["row"]["label"]
