"""One ``ws-mode bench`` run: the server in its own process, the rollouts, their medians.

:func:`run_bench` starts the benchmark server (:mod:`ws_mode.toolkit.bench.server`, through
:func:`server_process`), with ``--link`` a relay in front of it for the clients
(:func:`~ws_mode.toolkit.bench.control.linked`), runs every mode
(:data:`~ws_mode.toolkit.bench.options.MODES`) at every model speed, interleaved and repeated after
a warm-up, and the forwarding microbenchmark (:mod:`ws_mode.toolkit.bench.forward`, straight to the
server); :func:`summarize` turns each mode's samples into the medians
of a :class:`ModeSummary`; the result is a :class:`BenchReport`. The clients are the tools'
(:mod:`ws_mode.toolkit.rollout`, :mod:`ws_mode.toolkit.http_client`). Needs the ``cli`` extra.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ..measure import median, median_present
from .control import ServerControl, linked, server_process
from .forward import ForwardError, ForwardResult, forwarding_cost_in_process, run_forward
from .options import MODES, BenchError, BenchOptions, Mode, speed_key, speed_label
from .server import ServerSpec, mode_path

if TYPE_CHECKING:
    from ..rollout import RolloutResult

__all__ = [
    "BenchReport",
    "ModeSummary",
    "Sample",
    "ServerControl",
    "rotated",
    "run_bench",
    "server_process",
    "summarize",
    "windows",
]

WINDOW: Final = 3
"""Turns in the early and late windows (fewer on short rollouts)."""


# ----------------------------------------------------------------------------- rollouts


@dataclass
class Sample:
    """One mode's batch of concurrent rollouts in one repetition, and what the server did."""

    mode: str
    speed: float
    repetition: int
    results: list[RolloutResult]
    handler: dict[str, Any]
    server_cpu: float
    peak_rss: int | None


def _run_batch(
    base_url: str, mode: Mode, speed_index: int, options: BenchOptions, pool: ThreadPoolExecutor
) -> list[RolloutResult]:
    """``options.concurrency`` rollouts of ``mode`` at once; their results."""
    from ..rollout import run_rollout

    path = mode_path(speed_index, mode.key)

    def one() -> RolloutResult:
        return run_rollout(
            mode.transport,
            base_url,
            turns=options.turns,
            tool_output_bytes=options.tool_output_bytes,
            path=path,
        )

    if options.concurrency == 1:
        return [one()]
    barrier = threading.Barrier(options.concurrency)

    def together() -> RolloutResult:
        barrier.wait()
        return one()

    futures = [pool.submit(together) for _ in range(options.concurrency)]
    return [future.result() for future in futures]


def _measure(
    base_url: str,
    mode: Mode,
    speed_index: int,
    speed: float,
    repetition: int,
    options: BenchOptions,
    control: ServerControl,
    pool: ThreadPoolExecutor,
) -> Sample:
    before = control.reset()
    control.start_profile(f"{speed_key(speed)}-{mode.key}")
    try:
        results = _run_batch(base_url, mode, speed_index, options, pool)
    finally:
        control.stop_profile()
    after = control.read()
    for result in results:
        if result.turns != options.turns:
            raise BenchError(
                f"a {mode.label} rollout took {result.turns} turns instead of {options.turns}"
            )
    return Sample(
        mode=mode.key,
        speed=speed,
        repetition=repetition,
        results=results,
        handler=after["references"][speed_index],
        server_cpu=after["cpu_seconds"] - before["cpu_seconds"],
        peak_rss=after.get("peak_rss"),
    )


# ----------------------------------------------------------------------------- summaries


def windows(turns: int) -> tuple[slice, slice]:
    """The early and late windows of a rollout's turn indices.

    The first turn (a fresh conversation; HTTP also connects in it) and the last (the model's
    answer instead of a tool call) are left out, so both windows hold like turns: a tool call
    continuing the previous response. Each holds up to 3 turns.
    """
    if turns < 4:
        return slice(0, turns), slice(0, turns)
    middle = turns - 2
    width = min(WINDOW, max(1, middle // 2))
    return slice(1, 1 + width), slice(turns - 1 - width, turns - 1)


@dataclass
class ModeSummary:
    """One mode at one model speed: the medians over the repetitions, per rollout.

    Attributes:
        end_to_end: a rollout's wall time, connecting included.
        turn_curve: each turn's median wall time, from sending to the terminal event.
        early, late: medians of the early and late windows (see :func:`windows`).
        bytes_sent: what the client sent over the rollout.
        handler_bytes: request body bytes the handler parsed.
        handler_cpu: the handler's own CPU time (ReferenceStats.cpu_seconds).
        tokens_rendered: tokens the handler rendered (ReferenceStats.tokens_rendered).
        items_seen: context items the handler looked at.
        resumed: requests the handler answered from the cached Turn.
        server_cpu: the server process's CPU time (middleware, uvicorn, handler).
        peak_rss: the server process's peak RSS while the mode ran (all its rollouts).
    """

    mode: str
    label: str
    speed: float
    end_to_end: float
    turn_curve: list[float]
    early: float
    late: float
    bytes_sent: float
    handler_bytes: float
    handler_cpu: float | None
    tokens_rendered: float | None
    items_seen: float | None
    resumed: float | None
    server_cpu: float
    peak_rss: float | None
    answer: str

    @property
    def growth(self) -> float:
        """late / early."""
        return self.late / self.early if self.early else math.nan


def _per_rollout(samples: Sequence[Sample], name: str, rollouts: int) -> float | None:
    values = [sample.handler.get(name) for sample in samples]
    return median_present([None if value is None else value / rollouts for value in values])


def summarize(mode: Mode, speed: float, samples: Sequence[Sample], turns: int) -> ModeSummary:
    """The medians of one mode's samples at one speed."""
    results = [result for sample in samples for result in sample.results]
    rollouts = len(samples[0].results)
    curve = [median([result.turn_seconds[index] for result in results]) for index in range(turns)]
    early_window, late_window = windows(turns)
    answers = {result.answer for result in results}
    if len(answers) != 1:
        raise BenchError(f"the {mode.label} rollouts got different answers: {sorted(answers)}")
    return ModeSummary(
        mode=mode.key,
        label=mode.label,
        speed=speed,
        end_to_end=median(
            [median([result.total_seconds for result in sample.results]) for sample in samples]
        ),
        turn_curve=curve,
        early=median(curve[early_window]),
        late=median(curve[late_window]),
        bytes_sent=median([result.bytes_sent for result in results]),
        handler_bytes=_per_rollout(samples, "bytes_parsed", rollouts) or 0.0,
        handler_cpu=_per_rollout(samples, "cpu_seconds", rollouts),
        tokens_rendered=_per_rollout(samples, "tokens_rendered", rollouts),
        items_seen=_per_rollout(samples, "items_seen", rollouts),
        resumed=_per_rollout(samples, "resumed", rollouts),
        server_cpu=median([sample.server_cpu / rollouts for sample in samples]),
        peak_rss=median_present([sample.peak_rss for sample in samples]),
        answer=answers.pop(),
    )


# ----------------------------------------------------------------------------- the run


@dataclass
class BenchReport:
    """Everything one benchmark run measured."""

    options: BenchOptions
    summaries: dict[float, list[ModeSummary]]
    forward: ForwardResult | None
    samples: list[Sample]
    seconds: float
    profiles: list[str] = field(default_factory=list)

    def summary(self, speed: float, mode: str) -> ModeSummary:
        """The summary of ``mode`` at ``speed``."""
        return next(row for row in self.summaries[speed] if row.mode == mode)


def rotated(modes: Sequence[Mode], repetition: int) -> list[Mode]:
    """``modes`` in the order of ``repetition``: rotated by one each repetition."""
    shift = repetition % len(modes)
    return [*modes[shift:], *modes[:shift]]


def run_bench(
    options: BenchOptions, *, progress: Callable[[str], None] | None = None
) -> BenchReport:
    """Start the benchmark server, run every mode at every speed and the forwarding
    microbenchmark, and stop the server; the measurements."""
    options.validate()
    say = progress or (lambda message: None)
    spec = ServerSpec(
        tool_calls=options.turns - 1,
        speeds=options.speeds,
        time_to_first_token=options.time_to_first_token,
        forward_events=options.forward_events,
        forward_batch=options.forward_batch,
    )
    from ..rollout import RolloutError

    started = time.perf_counter()
    samples: list[Sample] = []
    forward: ForwardResult | None = None
    profiles: list[str] = []
    with (
        server_process(spec) as base_url,
        linked(options.link_spec(), base_url) as client_url,
        ThreadPoolExecutor(max_workers=max(1, options.concurrency)) as pool,
    ):
        control = ServerControl(base_url, profile=options.profile is not None)
        try:
            for speed_index, speed in enumerate(options.speeds):
                say(f"{speed_label(speed, options.time_to_first_token)}: warming up")
                for _ in range(options.warmup):
                    for mode in MODES:
                        _run_batch(client_url, mode, speed_index, options, pool)
                for repetition in range(options.repeat):
                    say(
                        f"{speed_label(speed, options.time_to_first_token)}: "
                        f"repetition {repetition + 1}/{options.repeat}"
                    )
                    for mode in rotated(MODES, repetition):
                        samples.append(
                            _measure(
                                client_url,
                                mode,
                                speed_index,
                                speed,
                                repetition,
                                options,
                                control,
                                pool,
                            )
                        )
                if speed == 0 and options.forward_events:
                    say(f"event forwarding: {options.forward_events} events")
                    forward = run_forward(
                        base_url,
                        events=options.forward_events,
                        batch=options.forward_batch,
                        repeat=options.repeat,
                        control=control,
                        warmup=options.warmup > 0,
                    )
                    forward.in_process_cpu = forwarding_cost_in_process(
                        options.forward_events, batch=options.forward_batch, repeat=options.repeat
                    )
            if options.profile is not None:
                profiles = control.dump_profiles(str(Path(options.profile).resolve()))
        except (RolloutError, ForwardError) as exc:
            raise BenchError(str(exc)) from exc
        finally:
            control.close()
    summaries: dict[float, list[ModeSummary]] = {}
    for speed in options.speeds:
        rows = []
        for mode in MODES:
            chosen = [s for s in samples if s.speed == speed and s.mode == mode.key]
            rows.append(summarize(mode, speed, chosen, options.turns))
        answers = {row.answer for row in rows}
        if len(answers) != 1:
            raise BenchError(
                "the modes got different answers, so the model saw different contexts: "
                + " | ".join(sorted(answers))
            )
        summaries[speed] = rows
    return BenchReport(
        options=options,
        summaries=summaries,
        forward=forward,
        samples=samples,
        seconds=time.perf_counter() - started,
        profiles=profiles,
    )
