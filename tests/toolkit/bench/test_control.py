"""The measured processes (`ws_mode.toolkit.bench.control`): the benchmark server runs in its own
process from any directory, serves its stats and never outlives the block; one that cannot
start is reported; a process's CPU time is read from outside.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from ws_mode.toolkit.bench.control import process_cpu, server_process
from ws_mode.toolkit.bench.options import BenchError
from ws_mode.toolkit.bench.server import STATS_PATH, ServerSpec


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


def test_process_cpu_reads_a_process_from_outside() -> None:
    before = process_cpu(os.getpid())
    if before is None:
        pytest.skip("no process CPU-time clock here")
    sum(range(200_000))
    after = process_cpu(os.getpid())
    assert after is not None
    assert after > before
