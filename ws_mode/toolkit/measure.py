"""The tools' measurements: medians and percentiles, a process's RSS, and how both print.

One median (:func:`median`, :func:`median_present`), one percentile (:func:`percentile`), the
spread of repeated measurements (:class:`Spread`: least, median, most), one
RSS reader (:func:`memory`: current and peak, from ``/proc``, else psutil or ``getrusage``)
with :func:`reset_peak_rss` and a :class:`PeakSampler` for systems without ``/proc``, and the
units the reports print (:func:`format_seconds`, :func:`format_bytes`).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import re
import resource
import statistics
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "Memory",
    "PeakSampler",
    "Spread",
    "format_bytes",
    "format_seconds",
    "median",
    "median_present",
    "memory",
    "percentile",
    "reset_peak_rss",
]


def median(values: Iterable[float], *, empty: float = math.nan) -> float:
    """The median of ``values``; ``empty`` when there are none."""
    present = list(values)
    return statistics.median(present) if present else empty


@dataclass(frozen=True)
class Spread:
    """Repeated measurements of one thing: the least, the median and the most."""

    low: float
    median: float
    high: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        """The spread of ``values`` (NaN throughout when there are none)."""
        present = sorted(values)
        if not present:
            return cls(math.nan, math.nan, math.nan)
        return cls(present[0], statistics.median(present), present[-1])

    def overlaps(self, other: Spread) -> bool:
        """Whether the two ranges share a value: then neither is clearly above the other."""
        return self.low <= other.high and other.low <= self.high


def median_present(values: Iterable[float | None]) -> float | None:
    """The median of the values that are not None; None when there are none."""
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` (0 to 1) percentile of ``values``, in steps of 0.1%; 0 for none."""
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    cuts = statistics.quantiles(values, n=1000, method="inclusive")
    return cuts[min(len(cuts) - 1, max(0, round(fraction * 1000) - 1))]


# ----------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class Memory:
    """A process's resident memory in bytes: ``rss`` now and its ``peak`` (None when not
    known), and where the peak came from (``psutil``: only the RSS is known)."""

    rss: int | None
    peak: int | None
    source: Literal["/proc", "psutil", "getrusage", "unavailable"]


def memory(pid: int | None = None) -> Memory:
    """The RSS and peak RSS (VmRSS, VmHWM) of process ``pid`` (this one by default), from
    ``/proc``. Elsewhere the RSS comes from psutil when it is installed, and the peak, for this
    process only, from ``getrusage``; ``source`` says where the peak came from."""
    own = pid is None or pid == os.getpid()
    try:
        text = Path(f"/proc/{'self' if own else pid}/status").read_text()
    except OSError:
        text = ""
    found = {
        name: int(match.group(1)) * 1024
        for name in ("VmRSS", "VmHWM")
        if (match := re.search(rf"^{name}:\s+(\d+)\s+kB", text, re.MULTILINE))
    }
    if "VmRSS" in found and "VmHWM" in found:
        return Memory(found["VmRSS"], found["VmHWM"], "/proc")
    psutil = _psutil()
    rss = None if psutil is None else int(psutil.Process(pid).memory_info().rss)
    if own:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return Memory(rss, peak if sys.platform == "darwin" else peak * 1024, "getrusage")
    return Memory(rss, None, "unavailable" if rss is None else "psutil")


def reset_peak_rss() -> bool:
    """Start this process's peak RSS over from its current RSS (Linux >= 4.0); False when
    that is not supported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _psutil() -> Any:
    try:
        return importlib.import_module("psutil")
    except ImportError:
        return None


class PeakSampler:
    """Samples a process's RSS with psutil every 50 ms, for systems without ``/proc``'s
    VmHWM; a no-op where ``/proc`` has it, or without psutil. ``peak`` is the largest seen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if Path(f"/proc/{self.pid}/status").exists():
            return  # VmHWM is exact
        psutil = _psutil()
        if psutil is None:
            return
        process = psutil.Process(self.pid)

        def sample() -> None:
            while not self._stop.wait(0.05):
                with contextlib.suppress(Exception):
                    self.peak = max(self.peak, int(process.memory_info().rss))

        self._thread = threading.Thread(target=sample, name="rss-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)


# ----------------------------------------------------------------------------- units


def format_seconds(value: float | None) -> str:
    """A duration in s, ms or µs; ``-`` when missing."""
    if value is None or math.isnan(value):
        return "-"
    if value < 0:
        return "-" + format_seconds(-value)
    if value >= 1.0:
        return f"{value:.2f} s"
    if value >= 0.001:
        return f"{value * 1000:.1f} ms"
    if value >= 0.00001:
        return f"{value * 1_000_000:.0f} µs"
    return f"{value * 1_000_000:.1f} µs"


def format_bytes(value: float | None) -> str:
    """A size in B, KiB or MiB; ``-`` when missing."""
    if value is None or math.isnan(value):
        return "-"
    if value >= 1024 * 1024:
        return f"{value / (1024 * 1024):.2f} MiB"
    if value >= 1024:
        return f"{value / 1024:.1f} KiB"
    return f"{value:.0f} B"
