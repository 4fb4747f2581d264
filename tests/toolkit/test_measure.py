"""The tools' measurements and argument types (`ws_mode.toolkit.measure`, `ws_mode.toolkit.args`):
one median, one percentile, one RSS reader, the units the reports print, bounded numbers."""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys

import pytest

from ws_mode.toolkit.args import number, port
from ws_mode.toolkit.measure import (
    PeakSampler,
    format_bytes,
    format_seconds,
    median,
    median_present,
    memory,
    percentile,
    reset_peak_rss,
)


def test_medians() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0]) == 2.5
    assert math.isnan(median([]))
    assert median([], empty=0.0) == 0.0
    assert median(value for value in (5.0, 7.0, 6.0)) == 6.0
    assert median_present([None, 2.0, None, 4.0]) == 3.0
    assert median_present([None]) is None


def test_percentiles() -> None:
    values = [float(number) for number in range(1, 101)]
    assert percentile([], 0.5) == 0.0
    assert percentile([7.0], 0.99) == 7.0
    assert percentile(values, 0.5) == pytest.approx(50.5, abs=0.1)
    assert percentile(values, 0.99) == pytest.approx(99.0, abs=0.1)
    assert percentile(values, 1.0) == pytest.approx(100.0, abs=0.1)


def test_memory_of_this_process_and_of_a_child() -> None:
    own = memory()
    assert own.source == "/proc"
    assert own.rss is not None
    assert own.peak is not None
    assert 0 < own.rss <= own.peak
    assert memory(os.getpid()).source == "/proc"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        theirs = memory(child.pid)
        assert theirs.source == "/proc"
        assert theirs.rss is not None
        assert theirs.rss > 0
        sampler = PeakSampler(child.pid)
        sampler.start()  # /proc has VmHWM: nothing to sample
        sampler.stop()
        assert sampler.peak == 0
    finally:
        child.kill()
        child.wait(10)


def test_the_peak_starts_over_from_the_current_rss() -> None:
    ballast = bytearray(64 * 1024 * 1024)
    ballast[::4096] = b"x" * len(ballast[::4096])  # touch every page
    raised = memory().peak
    del ballast
    assert reset_peak_rss()
    after = memory()
    assert raised is not None
    assert after.peak is not None
    assert after.rss is not None
    assert after.peak < raised
    assert after.peak >= after.rss


def test_units() -> None:
    assert format_seconds(2.5) == "2.50 s"
    assert format_seconds(0.0123) == "12.3 ms"
    assert format_seconds(0.000123) == "123 µs"
    assert format_seconds(0.0000012) == "1.2 µs"
    assert format_seconds(-0.5) == "-500.0 ms"
    assert format_seconds(None) == format_seconds(math.nan) == "-"
    assert format_bytes(512) == "512 B"
    assert format_bytes(4096) == "4.0 KiB"
    assert format_bytes(3 * 1024 * 1024) == "3.00 MiB"
    assert format_bytes(None) == "-"


def test_number_arguments() -> None:
    at_least_two = number(int, 2)
    assert at_least_two("3") == 3
    for text, message in (
        ("1", "must be >= 2, got 1"),
        ("x", "expected an integer, got 'x'"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            at_least_two(text)
    positive = number(float, 0, strict=True)
    assert positive("0.5") == 0.5
    with pytest.raises(argparse.ArgumentTypeError, match="must be > 0"):
        positive("0")
    with pytest.raises(argparse.ArgumentTypeError, match="finite"):
        positive("inf")
    assert port("0") == 0
    assert port("65535") == 65535
    with pytest.raises(argparse.ArgumentTypeError, match="at most 65535"):
        port("65536")
