"""The load script (`python -m benchmarks.load`): short loads in the normal suite, the
big ones (1,000 sockets against HTTP; 300 with large tool outputs) with `--run-slow`. On both sides
(the sockets, and the same conversations over plain HTTP) every turn must be right and nothing
may fail; the server's peak RSS under the sockets must stay under the bound the cache limits
give (`benchmarks.load.options.rss_bound`). No timing is asserted: the ratios are only
reported."""

from __future__ import annotations

import asyncio
import copy
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.load import chains as load_chains
from benchmarks.load.chains import reference_chains
from benchmarks.load.client import Load, Probe, history_bodies, run_side
from benchmarks.load.options import (
    CACHE_OVERHEAD_FACTOR,
    PER_CONNECTION_BYTES,
    SLACK_BYTES,
    LoadError,
    LoadOptions,
    rss_bound,
)
from benchmarks.load.report import RATIOS, LoadReport, SideReport
from benchmarks.load.run import build_parser, options_from, run, server_process
from ws_mode import _cache as cache
from ws_mode.toolkit.http_client import HttpClient


def check(report: LoadReport, options: LoadOptions) -> None:
    expected = options.turns * sum(options.lanes_of(i) for i in range(options.connections))
    sides = [report.websocket] if report.http is None else [report.websocket, report.http]
    for side in sides:
        # Every turn of every conversation ran, was right, and nothing failed.
        assert side.errors == {}, report.text()
        assert side.rounds == options.rounds
        assert side.turns == side.turns_expected == expected * options.rounds
        assert side.conversations == options.conversations
        assert side.turns_per_second > 0
        assert 0 < side.latency_p50_ms <= side.latency_p99_ms <= side.latency_max_ms
        assert side.server_cpu_ms_per_turn > 0
        assert side.rss_peak >= side.rss_start > 0
        assert side.ok
    # All sockets were open at once; each HTTP conversation kept its one connection alive.
    assert report.websocket.connections == options.connections * options.rounds
    assert report.websocket.server_connections == options.connections
    if report.http is not None:
        assert report.http.connections == options.conversations * options.rounds
        assert report.http.server_connections == options.conversations
    # The middleware saw the same: every socket turn, a cache hit for every continuation, no
    # error; the HTTP turns never reached it.
    stats = report.server_stats
    assert stats["turns"] == expected * options.rounds
    assert stats["cache_hits"] == (expected - expected // options.turns) * options.rounds
    assert stats["cache_misses"] == 0
    assert stats["errors"] == {}
    assert report.websocket.rss_peak <= report.rss_bound, report.text()
    assert report.ok


@pytest.mark.parametrize(("full_context", "rounds"), [("always", 1), ("on_miss", 2)])
def test_a_short_load_runs_both_sides_right(full_context: str, rounds: int) -> None:
    # Two rounds: sockets, HTTP, then HTTP, sockets; each side adds its rounds up. The
    # machinery only: ten sockets of four lanes (the figures come from --run-slow's runs).
    options = LoadOptions(
        connections=10, turns=4, lanes=4, tool_output_bytes=512, duration=90,
        full_context=full_context, rounds=rounds,
    )  # fmt: skip
    report = run(options)
    check(report, options)
    assert report.http is not None
    assert set(report.ratios()) == {name for name, _attribute in RATIOS}
    document = json.loads(report.to_json())
    assert document["ok"] is True
    for side in ("websocket", "http"):
        for name in ("turns_per_second", "latency_p99_ms", "server_cpu_ms_per_turn", "rss_peak"):
            assert document[side][name] > 0
    assert document["ratios"]["turns_per_second"] == pytest.approx(
        report.websocket.turns_per_second / report.http.turns_per_second
    )
    text = report.text()
    assert "WS/HTTP" in text
    assert "server CPU/turn ms" in text


def test_the_sockets_alone() -> None:
    options = LoadOptions(
        connections=10, turns=3, lanes=3, tool_output_bytes=64, http=False, compression=False
    )
    report = run(options)
    check(report, options)
    assert report.http is None
    assert report.ratios() == {}
    assert "WS/HTTP" not in report.text()


@pytest.mark.slow
def test_a_thousand_sockets_against_http() -> None:
    options = LoadOptions(connections=1000, turns=3, lanes=4, tool_output_bytes=1024, duration=600)
    report = run(options)
    print(report.text())
    check(report, options)


@pytest.mark.slow
def test_three_hundred_sockets_with_large_tool_outputs() -> None:
    options = LoadOptions(
        connections=300, turns=10, lanes=4, tool_output_bytes=8192, duration=300,
        full_context="on_miss", http=False,
    )  # fmt: skip
    report = run(options)
    print(report.text())
    check(report, options)


def test_the_command_line_reports_and_exits_zero(tmp_path: Path) -> None:
    # Run from an unrelated directory: the command and its server need only the package.
    result = subprocess.run(
        [
            *(
                sys.executable,
                "-m",
                "benchmarks.load",
                "--connections",
                "8",
                "--turns",
                "3",
            ),
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
    for side in ("websocket", "http"):
        assert report[side]["turns"] == 3 * (8 // 2 * (1 + 2))
        assert report[side]["errors"] == {}
    assert report["ratios"]["latency_p99"] > 0


@pytest.mark.parametrize("transport", ["websocket", "http"])
def test_a_wrong_turn_is_an_error_on_either_side(transport: str) -> None:
    options = LoadOptions(connections=2, turns=2, lanes=1, tool_output_bytes=64)

    async def one_side(base_url: str, pid: int) -> SideReport:
        chains = await asyncio.to_thread(reference_chains, base_url, options)
        wrong = copy.deepcopy(chains)
        for chain in wrong:  # the final answers as the checks expect them: not what comes
            chain.outputs[-1] = [{"type": "message", "role": "assistant", "content": []}]
        with HttpClient(base_url) as http:
            deadline = time.monotonic() + 60
            load = Load(
                base_url, pid, options, wrong, history_bodies(chains), deadline, Probe(http)
            )
            side = SideReport(transport)
            await run_side(load, side)
        side.finish()
        return side

    with server_process(options) as server:
        side = asyncio.run(one_side(server.base_url, server.pid))
    assert side.errors == {"wrong_output": 2}
    assert side.turns == 2  # the first turns were right
    assert side.turns_expected == 4
    assert not side.ok


def test_a_file_limit_too_low_is_refused_before_the_run() -> None:
    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.load",
            "--connections",
            "200",
            "--lanes",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=low_limit,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "holds 364 open files at once but the limit is 200" in result.stderr


def test_the_command_line_refuses_unbounded_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.load", "--connections", "100000"],
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
    with pytest.raises(LoadError):
        LoadOptions(rounds=0)


def test_the_bound_grows_with_sockets_and_cache_not_with_turns() -> None:
    base = rss_bound(50 << 20, 0, 0)
    assert base == (50 << 20) + SLACK_BYTES
    assert rss_bound(50 << 20, 10, 0) - base == 10 * PER_CONNECTION_BYTES
    assert rss_bound(50 << 20, 0, 1 << 20) - base == int(CACHE_OVERHEAD_FACTOR * (1 << 20))


def test_the_expected_cache_bytes_use_the_caches_own_node_overhead() -> None:
    assert load_chains.NODE_OVERHEAD is cache.NODE_OVERHEAD


def test_long_sets_the_longer_histories_chains() -> None:
    arguments = build_parser().parse_args(["--long", "--turns", "3", "--connections", "20"])
    options = options_from(arguments)
    assert (options.turns, options.tool_output_bytes, options.lanes) == (25, 4096, 1)
    assert options.connections == 20
    plain = options_from(build_parser().parse_args(["--turns", "3"]))
    assert (plain.turns, plain.tool_output_bytes, plain.lanes) == (3, 1024, 4)
