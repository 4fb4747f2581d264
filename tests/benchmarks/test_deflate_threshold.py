"""`python -m benchmarks.deflate_threshold`: a real chain's frames, every way."""

from __future__ import annotations

import pytest

from benchmarks.deflate_threshold import READERS, main, measure, measure_reading, record_chain


def test_a_higher_threshold_compresses_fewer_messages_and_sends_more_bytes() -> None:
    messages = record_chain("always", turns=3, tool_output_bytes=256)
    assert len(messages) > 20
    rows = {row.name: row for row in measure(messages, [0, 512, 1 << 30], repeat=1)}
    everything, some, nothing = (rows[f"direct, threshold {t}"] for t in (0, 512, 1 << 30))
    # measure() also checks that a websockets client reads every framing back.
    assert everything.compressed == rows["websockets, deflate"].compressed == len(messages)
    assert everything.wire_bytes == rows["websockets, deflate"].wire_bytes
    assert 0 < some.compressed < len(messages)
    assert nothing.compressed == 0
    assert nothing.wire_bytes == rows["direct, no deflate"].wire_bytes
    assert everything.wire_bytes < some.wire_bytes < nothing.wire_bytes


def test_both_readers_inflate_a_clients_frames_back_to_its_messages() -> None:
    messages = record_chain("always", turns=2, tool_output_bytes=256)
    # measure_reading() checks that each reader reads the messages back.
    rows = measure_reading(messages, repeat=1)
    assert [row.name for row in rows] == list(READERS)
    assert all(row.frames == len(messages) for row in rows)


def test_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--turns", "2", "--repeat", "1", "--thresholds", "0", "512"]) == 0
    out = capsys.readouterr().out
    assert "direct, threshold 512" in out
    assert "websockets, deflate" in out
    assert "ws_mode, inflate in steps" in out
