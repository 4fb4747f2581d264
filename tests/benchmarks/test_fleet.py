"""The fleet benchmark (`python -m benchmarks.fleet`), run from the clone at tiny sizes: two
replicas behind vllm-router, the ideal arm (`ws-mode proxy` to one replica) and the gateway app
under the middleware with the key on and off, a move and a roll each. It reports every arm and
group, and with the key every group's continuations find what one replica would have cached
(routing by the key does not depend on timing). Skipped only where vllm-router cannot be found.

No test asserts a time: the machine is shared and the numbers are noisy.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ws_mode.toolkit.fleet import router_binary

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(router_binary("vllm-router") is None, reason="vllm-router is not installed")
def test_a_tiny_run_reports_every_arm_and_the_key_reaches_the_ideal(tmp_path: Path) -> None:
    output = tmp_path / "fleet.json"
    tiny = ["--replicas", "2", "--conversations", "3", "--turns", "3", "--move-at", "2"]
    command = [sys.executable, "-m", "benchmarks.fleet", *tiny]
    command += ["--routers", "vllm-router", "--fronts", "app", "--json", str(output)]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "| one replica | stay |" in run.stdout
    figures = json.loads(output.read_text())
    arms = {row["arm"] for row in figures["rows"]}
    assert arms == {"one replica", "vllm-router, app, key on", "vllm-router, app, key off"}
    assert {row["group"] for row in figures["rows"]} == {"stay", "move", "roll"}
    for row in figures["rows"]:
        assert row["prefill_tokens"] > 0
        assert row["ttft_p50"] > 0
        if row["arm"] == "one replica":
            assert row["cached_share"] > 0.5, row
    assert len(figures["ratios"]) == 3
    for ratio in figures["ratios"]:
        # Every continuation, after a move to another process or a roll too, reached the
        # replica holding its conversation.
        assert ratio["of_ideal"] >= 0.95, ratio
