"""``ws-mode bench --proxy``: what ``ws-mode proxy`` costs, against HTTP straight to its upstream.

:func:`run_proxy_bench` starts the upstream (the reference server,
:mod:`ws_mode.toolkit.bench.server`, plain HTTP) and the proxy in front of it
(:mod:`ws_mode.toolkit.bench.proxy_server`, run the way ``ws-mode proxy`` runs it), each in its own
process, with ``--link`` one relay in front of each (:func:`~ws_mode.toolkit.bench.control.linked`:
the client is remote, the proxy sits next to its upstream). It runs the rollout in the
:data:`PROXY_MODES`, interleaved and repeated after a warm-up: HTTP with the full history straight
to the upstream, the socket through the proxy (which sends the upstream the full history each turn),
and HTTP through the proxy.

Besides the rollout's times it reads the proxy process's CPU time before and after every turn
(:func:`~ws_mode.toolkit.bench.control.process_cpu`, from outside: no request to the proxy between
turns) and its peak RSS; :class:`ProxyReport` holds the medians.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from ..measure import median, median_present
from .control import ServerControl, linked, measured_process, process_cpu, server_process
from .options import BenchError, BenchOptions, Mode, speed_key, speed_label
from .run import WINDOW, ModeSummary, Sample, rotated, summarize, windows
from .server import ServerSpec, mode_path

if TYPE_CHECKING:
    from ..rollout import RolloutResult

__all__ = [
    "HISTORY_MARK",
    "PROXY_MODES",
    "ProxyReport",
    "ProxySample",
    "ProxySummary",
    "run_proxy_bench",
]

PROXY_MODES: Final = (
    Mode("direct", "HTTP direct", "http"),
    Mode("ws_proxy", "WS via proxy", "socket"),
    Mode("http_proxy", "HTTP via proxy", "http"),
)
HISTORY_MARK: Final = 100_000
"""The history size (bytes of a full-history request body) the proxy's CPU is reported at."""


@dataclass
class ProxySample:
    """One rollout of one mode, what the upstream did (``sample``) and what the proxy did:
    its CPU time over the rollout and in each turn (empty when it cannot be read from
    outside), its peak RSS."""

    sample: Sample
    proxy_cpu: float
    proxy_turn_cpu: list[float]
    proxy_peak_rss: int | None


@dataclass
class ProxySummary:
    """One mode at one model speed: ``row`` the rollout's medians (the upstream as its
    server), and the proxy's: CPU per rollout, per turn (median curve), in the early window
    and at :data:`HISTORY_MARK`, peak RSS."""

    row: ModeSummary
    proxy_cpu: float
    proxy_turn_cpu: list[float]
    proxy_cpu_early: float | None
    proxy_cpu_mark: float | None
    proxy_peak_rss: float | None


@dataclass
class ProxyReport:
    """Everything one ``--proxy`` run measured. ``history`` is the full-history body of each
    turn (direct HTTP's), ``mark`` the turn indices "at 100 KB" stands for, ``mark_turn`` the
    first turn (from 1) whose body reaches :data:`HISTORY_MARK` (None if none does)."""

    options: BenchOptions
    link: str | None
    summaries: dict[float, list[ProxySummary]]
    history: list[float]
    mark: slice
    mark_turn: int | None
    samples: list[ProxySample]
    seconds: float
    profiles: list[str] = field(default_factory=list)

    def summary(self, speed: float, mode: str) -> ProxySummary:
        """The summary of ``mode`` at ``speed``."""
        return next(row for row in self.summaries[speed] if row.row.mode == mode)

    @property
    def mark_reached(self) -> bool:
        """Whether a tool-call turn's history reached :data:`HISTORY_MARK` (else "at 100 KB"
        stands for the late window)."""
        return self.mark_turn is not None and self.mark.start + 1 == self.mark_turn

    def added(self, speed: float, mode: str) -> tuple[float, float, float]:
        """What ``mode`` adds to each turn against direct HTTP: the median of the per-turn
        differences in the early window, the late window and at 100 KB."""
        direct = self.summary(speed, "direct").row.turn_curve
        other = self.summary(speed, mode).row.turn_curve
        difference = [b - a for a, b in zip(direct, other, strict=True)]
        early, late = windows(len(difference))
        return (median(difference[early]), median(difference[late]), median(difference[self.mark]))


def history_mark(history: Sequence[float]) -> tuple[slice, int | None]:
    """The turns "at 100 KB": from the first whose body reaches :data:`HISTORY_MARK`, up to
    :data:`~ws_mode.toolkit.bench.run.WINDOW` tool-call turns (the last turn, the answer, left out);
    the late window when no tool-call turn reaches it. And that first turn, from 1."""
    first = next((i for i, size in enumerate(history) if size >= HISTORY_MARK), None)
    last = len(history) - 1
    if first is None or first >= last:
        return windows(len(history))[1], None if first is None else first + 1
    return slice(first, min(first + WINDOW, last)), first + 1


def _turn_cpu(readings: Sequence[float | None]) -> list[float]:
    if any(reading is None for reading in readings):
        return []
    values = [float(reading or 0.0) for reading in readings]
    return [after - before for before, after in itertools.pairwise(values)]


class _Run:
    """One ``--proxy`` run's servers and clients."""

    def __init__(
        self,
        options: BenchOptions,
        urls: dict[str, str],
        upstream: ServerControl,
        proxy: ServerControl,
        proxy_pid: int,
    ) -> None:
        self.options = options
        self.urls = urls
        self.upstream = upstream
        self.proxy = proxy
        self.proxy_pid = proxy_pid

    def rollout(
        self, mode: Mode, speed_index: int, on_turn: Callable[[int, float], None] | None
    ) -> RolloutResult:
        """One rollout of ``mode`` at speed ``speed_index``."""
        from ..rollout import run_rollout

        base_url = self.urls["direct" if mode.key == "direct" else "proxy"]
        return run_rollout(
            mode.transport,
            base_url,
            turns=self.options.turns,
            tool_output_bytes=self.options.tool_output_bytes,
            path=mode_path(speed_index, "http"),
            on_turn=on_turn,
        )

    def measure(self, mode: Mode, speed_index: int, speed: float, repetition: int) -> ProxySample:
        """One measured rollout of ``mode``, with the upstream's and the proxy's counters."""
        before_upstream = self.upstream.reset()
        before_proxy = self.proxy.reset()
        name = f"{speed_key(speed)}-{mode.key}"
        self.upstream.start_profile(f"upstream-{name}")
        self.proxy.start_profile(f"proxy-{name}")
        readings = [process_cpu(self.proxy_pid)]
        try:
            result = self.rollout(
                mode,
                speed_index,
                lambda turn, seconds: readings.append(process_cpu(self.proxy_pid)),
            )
        finally:
            self.upstream.stop_profile()
            self.proxy.stop_profile()
        after_upstream = self.upstream.read()
        after_proxy = self.proxy.read()
        if result.turns != self.options.turns:
            raise BenchError(
                f"a {mode.label} rollout took {result.turns} turns instead of {self.options.turns}"
            )
        turn_cpu = _turn_cpu(readings)
        return ProxySample(
            sample=Sample(
                mode=mode.key,
                speed=speed,
                repetition=repetition,
                results=[result],
                handler=after_upstream["references"][speed_index],
                server_cpu=after_upstream["cpu_seconds"] - before_upstream["cpu_seconds"],
                peak_rss=after_upstream.get("peak_rss"),
            ),
            proxy_cpu=sum(turn_cpu)
            if turn_cpu
            else after_proxy["cpu_seconds"] - before_proxy["cpu_seconds"],
            proxy_turn_cpu=turn_cpu,
            proxy_peak_rss=after_proxy.get("peak_rss"),
        )


def _summarize(
    mode: Mode, speed: float, samples: Sequence[ProxySample], turns: int, mark: slice
) -> ProxySummary:
    row = summarize(mode, speed, [sample.sample for sample in samples], turns)
    curves = [sample.proxy_turn_cpu for sample in samples if sample.proxy_turn_cpu]
    curve = [median([c[index] for c in curves]) for index in range(turns)] if curves else []
    early = windows(turns)[0]
    return ProxySummary(
        row=row,
        proxy_cpu=median([sample.proxy_cpu for sample in samples]),
        proxy_turn_cpu=curve,
        proxy_cpu_early=median(curve[early]) if curve else None,
        proxy_cpu_mark=median(curve[mark]) if curve else None,
        proxy_peak_rss=median_present([sample.proxy_peak_rss for sample in samples]),
    )


def run_proxy_bench(
    options: BenchOptions, *, progress: Callable[[str], None] | None = None
) -> ProxyReport:
    """Start the upstream and the proxy (and the relays of ``--link``), run the
    :data:`PROXY_MODES` at every speed, stop them all; the measurements."""
    options.validate()
    say = progress or (lambda message: None)
    link = options.link_spec()
    spec = ServerSpec(
        tool_calls=options.turns - 1,
        speeds=options.speeds,
        time_to_first_token=options.time_to_first_token,
    )
    from ..rollout import RolloutError

    started = time.perf_counter()
    samples: list[ProxySample] = []
    profiles: list[str] = []
    with contextlib.ExitStack() as stack:
        upstream_url = stack.enter_context(server_process(spec))
        arguments = ["--upstream", upstream_url, "--speeds", str(len(options.speeds))]
        proxy = stack.enter_context(
            measured_process("ws_mode.toolkit.bench.proxy_server", arguments, "the proxy")
        )
        urls = {
            "direct": stack.enter_context(linked(link, upstream_url)),
            "proxy": stack.enter_context(linked(link, proxy.base_url)),
        }
        profile = options.profile is not None
        upstream = ServerControl(upstream_url, profile=profile)
        stack.callback(upstream.close)
        proxy_control = ServerControl(proxy.base_url, profile=profile)
        stack.callback(proxy_control.close)
        run = _Run(options, urls, upstream, proxy_control, proxy.pid)
        try:
            for index, speed in enumerate(options.speeds):
                label = speed_label(speed, options.time_to_first_token)
                say(f"{label}: warming up")
                for _ in range(options.warmup):
                    for mode in PROXY_MODES:
                        run.rollout(mode, index, None)
                for repetition in range(options.repeat):
                    say(f"{label}: repetition {repetition + 1}/{options.repeat}")
                    for mode in rotated(PROXY_MODES, repetition):
                        samples.append(run.measure(mode, index, speed, repetition))
            if profile:
                directory = str(Path(str(options.profile)).resolve())
                profiles = upstream.dump_profiles(directory) + proxy_control.dump_profiles(
                    directory
                )
        except RolloutError as exc:
            raise BenchError(str(exc)) from exc
    return _report(options, link.describe() if link else None, samples, started, profiles)


def _report(
    options: BenchOptions,
    link: str | None,
    samples: list[ProxySample],
    started: float,
    profiles: list[str],
) -> ProxyReport:
    direct = [s.sample.results[0] for s in samples if s.sample.mode == "direct"]
    history = [
        median([result.turn_bytes[index] for result in direct]) for index in range(options.turns)
    ]
    mark, mark_turn = history_mark(history)
    summaries: dict[float, list[ProxySummary]] = {}
    for speed in options.speeds:
        rows = [
            _summarize(
                mode,
                speed,
                [s for s in samples if s.sample.speed == speed and s.sample.mode == mode.key],
                options.turns,
                mark,
            )
            for mode in PROXY_MODES
        ]
        answers = {row.row.answer for row in rows}
        if len(answers) != 1:
            raise BenchError(
                "the upstream answered differently through the proxy, so it saw another "
                "context: " + " | ".join(sorted(answers))
            )
        summaries[speed] = rows
    return ProxyReport(
        options=options,
        link=link,
        summaries=summaries,
        history=history,
        mark=mark,
        mark_turn=mark_turn,
        samples=samples,
        seconds=time.perf_counter() - started,
        profiles=profiles,
    )
