"""The load script (`python -m ws_mode.bench.load`): a short load in the normal suite, the big
one (300 sockets) with `--run-slow`. Every turn must be right, nothing may fail, and the
server's peak RSS must stay under the bound the cache limits give
(`ws_mode.bench.load_options.rss_bound`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ws_mode import cache
from ws_mode.bench import load_clients
from ws_mode.bench.load import run
from ws_mode.bench.load_options import (
    CACHE_OVERHEAD_FACTOR,
    PER_CONNECTION_BYTES,
    SLACK_BYTES,
    LoadError,
    LoadOptions,
    LoadReport,
    rss_bound,
)


def check(report: LoadReport, options: LoadOptions) -> None:
    assert report.errors == {}, report.text()
    assert report.connections == options.connections
    assert report.connections_open_peak == options.connections  # all open at once
    expected = options.turns * sum(options.lanes_of(i) for i in range(options.connections))
    assert report.turns == report.turns_expected == expected
    assert report.turns_per_second > 0
    assert 0 < report.latency_p50_ms <= report.latency_p99_ms <= report.latency_max_ms
    # The middleware saw the same: every turn, a cache hit for every continuation, no error.
    stats = report.server_stats
    if stats:
        assert stats["turns"] == expected
        assert stats["cache_hits"] == expected - expected // options.turns
        assert stats["cache_misses"] == 0
        assert stats["errors"] == {}
    assert report.rss_at_rest > 0
    assert report.rss_at_rest <= report.rss_peak <= report.rss_bound, report.text()
    assert report.ok


@pytest.mark.parametrize("full_context", ["always", "on_miss"])
def test_a_short_load_is_right_and_bounded(full_context: str) -> None:
    options = LoadOptions(
        connections=50, turns=5, lanes=4, tool_output_bytes=512, duration=90,
        full_context=full_context,
    )  # fmt: skip
    check(run(options), options)


@pytest.mark.slow
def test_three_hundred_sockets() -> None:
    options = LoadOptions(connections=300, turns=5, lanes=4, tool_output_bytes=1024, duration=300)
    report = run(options)
    print(report.text())
    check(report, options)


@pytest.mark.slow
def test_three_hundred_sockets_with_large_tool_outputs() -> None:
    options = LoadOptions(
        connections=300, turns=10, lanes=4, tool_output_bytes=8192, duration=300,
        full_context="on_miss",
    )  # fmt: skip
    report = run(options)
    print(report.text())
    check(report, options)


def test_the_command_line_reports_and_exits_zero(tmp_path: Path) -> None:
    # Run from an unrelated directory: the command and its server need only the package.
    result = subprocess.run(
        [
            *(sys.executable, "-m", "ws_mode.bench.load", "--connections", "8", "--turns", "3"),
            *("--lanes", "2", "--tool-output-bytes", "64", "--duration", "60", "--json"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert report["turns"] == 3 * (8 // 2 * (1 + 2))
    assert report["errors"] == {}


def test_the_command_line_refuses_unbounded_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ws_mode.bench.load", "--connections", "100000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "connections must be between" in result.stderr
    with pytest.raises(LoadError):
        LoadOptions(duration=0)
    with pytest.raises(LoadError):
        LoadOptions(full_context="sometimes")


def test_the_bound_grows_with_sockets_and_cache_not_with_turns() -> None:
    base = rss_bound(50 << 20, 0, 0)
    assert base == (50 << 20) + SLACK_BYTES
    assert rss_bound(50 << 20, 10, 0) - base == 10 * PER_CONNECTION_BYTES
    assert rss_bound(50 << 20, 0, 1 << 20) - base == int(CACHE_OVERHEAD_FACTOR * (1 << 20))


def test_the_expected_cache_bytes_use_the_caches_own_node_overhead() -> None:
    assert load_clients.NODE_OVERHEAD is cache.NODE_OVERHEAD
