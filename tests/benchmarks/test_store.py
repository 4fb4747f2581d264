"""The store benchmark (`python -m benchmarks.store`): a small run against a real
redis-server reports every measurement, positive ratios, and the store's counters equal to
what the run did; it leaves no keys behind, and refuses to report when Redis is not there.

No test asserts a time or a ratio's size: the machine is shared and the numbers are noisy.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import pytest
import redis

from benchmarks.store import StoreBenchOptions, StoreBenchReport, main, run
from tests.redis_server import RedisServer, free_port

SMALL = {"turns": 3, "repeat": 2, "chain_turns": 4, "sockets": 6, "socket_turns": 2}


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


def small_flags(url: str) -> list[str]:
    flags = ["--redis", url, "--tool-output-bytes", "512"]
    for name, value in SMALL.items():
        flags += ["--" + name.replace("_", "-"), str(value)]
    return flags


def check(report: StoreBenchReport, options: StoreBenchOptions) -> None:
    for values in (report.turn, report.rollout, report.cpu_per_turn, report.turns_per_second):
        assert set(values) == {"off", "on"}
        assert all(value > 0 and math.isfinite(value) for value in values.values()), values
    assert report.cached_turn > 0
    assert report.hydrated_turn > 0
    ratios = report.ratios()
    assert set(ratios) == {"turn", "rollout", "cpu_per_turn", "turns_per_second", "hydration"}
    assert all(value > 0 and math.isfinite(value) for value in ratios.values()), ratios
    # Every socket of every throughput run ran all its turns, in both modes.
    per_mode = options.sockets * options.socket_turns * options.repeat
    assert report.concurrent_turns == {"off": per_mode, "on": per_mode}
    # The store wrote each response of the store side: the rollouts (a warm-up and the
    # repetitions), the long conversation and its continuations (a warm-up pair and the
    # repetitions), the throughput runs; it hydrated once per new socket continuing the
    # conversation; nothing failed, and the side without a store never touched it.
    pairs = options.repeat + 1
    writes = pairs * options.turns + options.chain_turns + 2 * pairs + per_mode
    assert report.expected == {
        "store_writes": writes, "store_hydrations": pairs, "store_failures": 0,
    }  # fmt: skip
    # A write that overtook its parent's past the wait for it writes the conversation again:
    # more writes than responses is allowed, fewer is a loss.
    assert report.store["store_writes"] >= writes
    assert report.store["store_hydrations"] == pairs
    assert report.store["store_failures"] == 0
    assert report.store_off == {"store_writes": 0, "store_hydrations": 0, "store_failures": 0}
    assert report.ok


def test_a_small_run_reports_every_measurement_and_leaves_no_keys(
    redis_server: RedisServer,
) -> None:
    options = StoreBenchOptions(redis_url=redis_server.url, tool_output_bytes=512, **SMALL)
    report = run(options)
    check(report, options)
    text = report.text()
    for section in ("Per turn:", "Hydration:", "Throughput:", "Store counters"):
        assert section in text
    assert "goal" not in text.lower()  # measurements and ratios only
    assert json.loads(report.to_json())["ratios"] == report.ratios()
    client = redis.Redis.from_url(redis_server.url)
    try:
        assert report.prefix
        assert client.keys(report.prefix + ":*") == []
    finally:
        client.close()


def test_the_command_prints_the_report(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*small_flags(redis_server.url), "--full-context", "always", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["options"]["full_context"] == "always"
    assert printed["store"]["store_writes"] >= printed["expected"]["store_writes"]
    assert printed["store"]["store_failures"] == 0
    assert all(value > 0 for value in printed["ratios"].values())


def test_without_redis_it_refuses_to_report(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    assert main(small_flags(url)) == 2
    assert "store_unavailable" in capsys.readouterr().err
    assert main([*small_flags(url), "--turns", "1"]) == 2
    assert "turns must be >= 2" in capsys.readouterr().err


def test_the_encryption_run_prints_the_cost_per_stored_turn_and_leaves_no_keys(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--encryption`: the encrypted and the plain store measured in one interleaved run, per
    stored turn (write, hydration, CPU, bytes in Redis), with their ratios."""
    flags = ["--redis", redis_server.url, "--encryption", "--turns", "3", "--repeat", "2"]
    assert main([*flags, "--tool-output-bytes", "256", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert set(shown["ratios"]) == {"write", "hydration", "cpu", "record_bytes"}
    assert all(value > 0 and math.isfinite(value) for value in shown["ratios"].values())
    assert shown["ratios"]["record_bytes"] > 1  # the nonce, the tag, the key's id
    assert main(flags) == 0
    text = capsys.readouterr().out
    assert "per stored turn" in text
    assert "ratio" in text
    client = redis.Redis.from_url(redis_server.url)
    try:
        assert client.keys("ws_mode_bench_*") == []
    finally:
        client.close()
