"""The project's goals (`ws_mode.toolkit.bench.goals`): ``ws-mode bench --check`` compares the
measurements with them and exits by them; a goal compares in its direction, and a NaN never
meets it.

No test asserts a time or a ratio: the limits are set out of reach or always met.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from ws_mode.toolkit.bench import goals
from ws_mode.toolkit.bench.goals import Goal
from ws_mode.toolkit.cli import main


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


def test_goals_compare_in_their_direction() -> None:
    assert Goal("at most", 0.2, 0.3, at_most=True).met
    assert not Goal("at most", 0.4, 0.3, at_most=True).met
    assert Goal("at least", 0.7, 0.67, at_most=False).met
    assert not Goal("nan", float("nan"), 1.0, at_most=True).met
