"""The default ``ws-mode bench`` comparison: an agent rollout over HTTP, WebSocket mode drop-in
and WebSocket mode cache-aware against the reference server, run, summarized and reported.

:func:`run_bench` starts the benchmark server (:mod:`ws_mode.toolkit.bench.server`, through
:func:`~ws_mode.toolkit.bench.control.server_process`), with ``--link`` a relay in front of it
for the clients (:func:`~ws_mode.toolkit.bench.control.linked`), runs every mode
(:data:`~ws_mode.toolkit.bench.options.MODES`) at every model speed, interleaved and repeated
after a warm-up, and the forwarding microbenchmark (:mod:`ws_mode.toolkit.bench.forward`,
straight to the server) with its per-turn counterpart (:mod:`ws_mode.toolkit.bench.turns`,
in-process); :func:`summarize` turns each mode's samples into the medians of a
:class:`ModeSummary`; the result is a :class:`BenchReport`. The clients are the tools'
(:mod:`ws_mode.toolkit.rollout`, :mod:`ws_mode.toolkit.http_client`).

:func:`format_report` prints the report as text (the project's goals only with ``--check``,
:mod:`ws_mode.toolkit.bench.goals`), :func:`plot` draws the per-turn latency (matplotlib,
imported there), :func:`report_json` is the JSON ``--json`` writes and :func:`save` writes both
files the options ask for. The other comparisons build on this one's method and tables
(:func:`windows`, :func:`rotated`, :func:`summarize`, :func:`table`, :func:`format_ratio`):
``--proxy`` (:mod:`ws_mode.toolkit.bench.proxy`) and ``--url`` (:mod:`ws_mode.toolkit.bench.url`).
Needs the ``cli`` extra.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from ..measure import format_bytes, format_seconds, median, median_present
from .control import ServerControl, linked, server_process
from .forward import ForwardError, ForwardResult, forwarding_cost_in_process, run_forward
from .goals import goal_lines, measured_goals, percent
from .options import MODES, BenchError, BenchOptions, Mode, speed_key, speed_label
from .server import ServerSpec, mode_path
from .turns import TURN_EVENTS, TurnBenchError, turn_cost_in_process

if TYPE_CHECKING:
    from ..rollout import RolloutResult

__all__ = [
    "TURN_COST_TURNS",
    "WINDOW",
    "BenchReport",
    "ModeSummary",
    "Sample",
    "format_ratio",
    "format_report",
    "link_line",
    "plot",
    "report_json",
    "rotated",
    "run_bench",
    "save",
    "summarize",
    "table",
    "windows",
]

WINDOW: Final = 3
"""Turns in the early and late windows (fewer on short rollouts)."""
TURN_COST_TURNS: Final = 1000
"""Turns per repetition of the per-turn microbenchmark (:mod:`ws_mode.toolkit.bench.turns`)."""


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


_Rotated = TypeVar("_Rotated")


def rotated(modes: Sequence[_Rotated], repetition: int) -> list[_Rotated]:
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
                    forward.in_process_objects_cpu = forwarding_cost_in_process(
                        options.forward_events, repeat=options.repeat, objects=True
                    )
                    say("ws_mode's own CPU per turn, in-process")
                    forward.in_process_turn_cpu = turn_cost_in_process(
                        TURN_COST_TURNS, repeat=options.repeat
                    )
                    forward.in_process_cache_aware_turn_cpu = turn_cost_in_process(
                        TURN_COST_TURNS, repeat=options.repeat, full_context="on_miss"
                    )
            if options.profile is not None:
                profiles = control.dump_profiles(str(Path(options.profile).resolve()))
        except (RolloutError, ForwardError, TurnBenchError) as exc:
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


# ----------------------------------------------------------------------------- the report as JSON


def report_json(report: BenchReport) -> dict[str, Any]:
    """The report as plain JSON: options, per-mode summaries, forwarding; with
    ``options.check``, the goals."""
    forward = report.forward
    data: dict[str, Any] = {
        "options": report.options.public(),
        "link": link_line(report.options),
        "seconds": report.seconds,
        "summaries": {
            speed_key(speed): [{**asdict(row), "growth": row.growth} for row in rows]
            for speed, rows in report.summaries.items()
        },
        "forward": None
        if forward is None
        else {
            **asdict(forward),
            "bare_rate": forward.bare_rate,
            "middleware_rate": forward.middleware_rate,
            "ratio": forward.ratio,
            "cpu_ratio": forward.cpu_ratio,
            "in_process_cpu_per_event": forward.in_process_cpu_per_event,
            "objects_rate": forward.objects_rate,
            "objects_cpu_ratio": forward.objects_cpu_ratio,
            "in_process_objects_cpu_per_event": forward.in_process_objects_cpu_per_event,
            "in_process_cpu_per_turn": forward.in_process_cpu_per_turn,
            "in_process_cache_aware_cpu_per_turn": forward.in_process_cache_aware_cpu_per_turn,
        },
    }
    if report.options.check:
        data["goals"] = [{**asdict(goal), "met": goal.met} for goal in measured_goals(report)]
    return data


def link_line(options: BenchOptions) -> str | None:
    """The link the run modelled, for people (None without ``--link``)."""
    spec = options.link_spec()
    return None if spec is None else spec.describe()


def save(report: BenchReport) -> None:
    """Write what the options ask for: the plot (``plot``), the JSON (``json``)."""
    options = report.options
    if options.plot is not None:
        plot(report, options.plot)
    if options.json is not None:
        Path(options.json).write_text(json.dumps(report_json(report), indent=2) + "\n")


# ----------------------------------------------------------------------------- the report as text


def _count(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:,.0f}"


def format_ratio(value: float | None, reference: float | None, digits: int = 2) -> str:
    """``value / reference`` with ``digits`` decimals; ``-`` when either is missing."""
    if value is None or reference is None or not reference or math.isnan(value):
        return "-"
    return f"{value / reference:.{digits}f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """A table as lines: the first column left-aligned, the others right-aligned."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        return (indent + "  ".join([first, *rest])).rstrip()

    return [line(headers), indent + "-" * (sum(widths) + 2 * (len(widths) - 1)), *map(line, rows)]


def _speed_tables(rows: Sequence[ModeSummary]) -> list[str]:
    http = rows[0]
    timing = [
        [
            row.label,
            format_seconds(row.end_to_end),
            format_ratio(row.end_to_end, http.end_to_end),
            format_seconds(row.early),
            format_seconds(row.late),
            f"{row.growth:.2f}",
            format_bytes(row.bytes_sent),
            format_ratio(row.bytes_sent, http.bytes_sent, 3),
        ]
        for row in rows
    ]
    work = [
        [
            row.label,
            format_bytes(row.handler_bytes),
            format_seconds(row.handler_cpu),
            format_ratio(row.handler_cpu, http.handler_cpu),
            _count(row.tokens_rendered),
            format_seconds(row.server_cpu),
            format_ratio(row.server_cpu, http.server_cpu),
            format_bytes(row.peak_rss),
        ]
        for row in rows
    ]
    return [
        *table(
            [
                "mode",
                "end-to-end",
                "/HTTP",
                "early turn",
                "late turn",
                "late/early",
                "sent",
                "/HTTP",
            ],
            timing,
        ),
        "",
        *table(
            [
                "mode",
                "handler parsed",
                "handler CPU",
                "/HTTP",
                "tokens rendered",
                "server CPU",
                "/HTTP",
                "server peak RSS",
            ],
            work,
        ),
    ]


def _breakdown(rows: Sequence[ModeSummary]) -> list[str]:
    """Where one rollout's time went at zero cost: the handler's CPU, the rest of the
    server's CPU (uvicorn, ws_mode, the middleware's renderer), and what is left (the client,
    loopback, scheduling). Meaningful with one rollout at a time, when nothing overlaps."""
    cells = []
    for row in rows:
        handler = row.handler_cpu or 0.0
        cells.append(
            [
                row.label,
                format_seconds(row.end_to_end),
                f"{format_seconds(handler)} ({percent(handler / row.end_to_end)})",
                f"{format_seconds(row.server_cpu - handler)} "
                f"({percent((row.server_cpu - handler) / row.end_to_end)})",
                f"{format_seconds(row.end_to_end - row.server_cpu)} "
                f"({percent((row.end_to_end - row.server_cpu) / row.end_to_end)})",
            ]
        )
    return [
        "  Where the time went (per rollout):",
        *table(
            [
                "mode",
                "end-to-end",
                "handler CPU",
                "rest of server CPU",
                "outside the server",
            ],
            cells,
        ),
        "  rest of server CPU: uvicorn, ws_mode, the middleware's renderer; outside the server: "
        "the client, loopback (and the link, with --link), scheduling.",
    ]


def _saving_lines(report: BenchReport, speed: float) -> list[str]:
    http, drop_in, cache_aware = report.summaries[speed]
    zero_http, zero_drop_in, zero_cache_aware = report.summaries[0.0]
    lines = [
        f"At {speed:g} tokens/s the rollout took {format_seconds(http.end_to_end)} over HTTP, "
        f"{format_seconds(drop_in.end_to_end)} drop-in "
        f"(saved {format_seconds(http.end_to_end - drop_in.end_to_end)}, "
        f"{percent(1 - drop_in.end_to_end / http.end_to_end)}) and "
        f"{format_seconds(cache_aware.end_to_end)} cache-aware "
        f"(saved {format_seconds(http.end_to_end - cache_aware.end_to_end)}, "
        f"{percent(1 - cache_aware.end_to_end / http.end_to_end)}); at zero cost the savings "
        f"were {format_seconds(zero_http.end_to_end - zero_drop_in.end_to_end)} and "
        f"{format_seconds(zero_http.end_to_end - zero_cache_aware.end_to_end)}.",
    ]
    if report.options.concurrency == 1:
        model_time = cache_aware.end_to_end - zero_cache_aware.end_to_end
        lines.append(
            "WebSocket mode saves API plumbing, which the model's speed does not change; "
            f"generating the tokens (about {format_seconds(model_time)} per rollout: cache-aware "
            f"at {speed:g} tokens/s minus at zero cost) takes the same time in every mode, so the "
            "ratio to HTTP moves towards 1 as the model gets slower."
        )
    else:
        lines.append(
            "WebSocket mode saves API plumbing, which the model's speed does not change; with "
            f"{report.options.concurrency} rollouts sharing one server process, it also saves "
            "the time each waited for the others' plumbing."
        )
    return lines


def format_report(report: BenchReport) -> list[str]:
    """The report as lines of text: the scenario, one table pair per model speed, the
    forwarding microbenchmark; with ``options.check``, the goals."""
    options = report.options
    concurrency = (
        "1 rollout at a time"
        if options.concurrency == 1
        else f"{options.concurrency} concurrent rollouts per mode"
    )
    early, late = windows(options.turns)
    lines = [
        f"ws-mode bench: an agent rollout of {options.turns} turns ({options.turns - 1} tool "
        f"calls, {format_bytes(options.tool_output_bytes)} per tool output), {concurrency}; "
        f"median of {options.repeat} repetitions, modes interleaved (order rotated), "
        f"server in its own process; {os.cpu_count()} CPUs.",
        f"Per rollout. Early / late turn: median time of turns {early.start + 1}-{early.stop} "
        f"/ {late.start + 1}-{late.stop} (send to terminal event). sent: bytes the client "
        "sent. handler: the reference server's own work (parse, render, digest, encode). "
        "server: the whole server process (uvicorn, ws_mode, handler).",
    ]
    link = link_line(options)
    if link is not None:
        lines.append(
            f"Link: every mode's client reaches the server through a relay modelling {link} "
            "(the forwarding microbenchmark and the stats routes go straight to it)."
        )
    for speed, rows in report.summaries.items():
        lines += ["", speed_label(speed, options.time_to_first_token), *_speed_tables(rows)]
        if speed == 0 and options.concurrency == 1:
            lines += ["", *_breakdown(rows)]
        if speed != 0:
            lines += ["", *_saving_lines(report, speed)]
        for row in rows:
            if row.mode == "on_miss" and not row.resumed:
                lines.append(
                    "warning: the cache-aware handler resumed no request from the Turn: "
                    "it redid the whole history every turn"
                )
    forward = report.forward
    if forward is not None:
        lines += [
            "",
            f"Event forwarding: {forward.events:,} response.output_text.delta events "
            f"({forward.batch} per handler body chunk) to a websockets client, median of "
            f"{len(forward.bare_rates)}",
            *table(
                ["endpoint", "events/s", "server CPU/event"],
                [
                    [
                        "bare Starlette WebSocket",
                        _count(forward.bare_rate),
                        format_seconds(forward.bare_cpu_per_event if forward.bare_cpu else None),
                    ],
                    [
                        "through the middleware",
                        _count(forward.middleware_rate),
                        format_seconds(
                            forward.middleware_cpu_per_event if forward.middleware_cpu else None
                        ),
                    ],
                    [
                        "through the middleware, events as objects",
                        _count(forward.objects_rate),
                        format_seconds(
                            forward.objects_cpu_per_event if forward.objects_cpu else None
                        ),
                    ],
                ],
            ),
            f"  ratio: {forward.ratio:.2f} (events/s), {forward.cpu_ratio:.2f} (server CPU/event); "
            f"events as objects: {forward.objects_rate / forward.bare_rate:.2f}, "
            f"{forward.objects_cpu_ratio:.2f}",
        ]
        if forward.in_process_cpu:
            lines.append(
                f"  ws_mode's own CPU per event, in-process with no socket: "
                f"{format_seconds(forward.in_process_cpu_per_event)} (SSE), "
                f"{format_seconds(forward.in_process_objects_cpu_per_event)} (objects)"
            )
        if forward.in_process_turn_cpu:
            lines.append(
                f"  ws_mode's own CPU per socket turn, in-process with no socket "
                f"({TURN_EVENTS} SSE events in one chunk): "
                f"{format_seconds(forward.in_process_cpu_per_turn)} (drop-in), "
                f"{format_seconds(forward.in_process_cache_aware_cpu_per_turn)} (cache-aware)"
            )
    if options.check:
        lines += ["", *goal_lines(measured_goals(report))]
    if report.profiles:
        lines += ["", "Server profiles (cProfile; times are inflated by profiling):"]
        lines += [f"  {path}" for path in report.profiles]
    if options.plot is not None:
        lines += ["", f"Per-turn latency plot: {options.plot}"]
    lines.append(f"({report.seconds:.0f} s)")
    return lines


# ----------------------------------------------------------------------------- the plot


def plot(report: BenchReport, path: str) -> None:
    """Draw each mode's per-turn latency against the turn number, one panel per model
    speed, as a PNG (matplotlib's Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    speeds = list(report.summaries)
    figure, axes = plt.subplots(
        1, len(speeds), figsize=(6.0 * len(speeds), 4.2), squeeze=False, layout="constrained"
    )
    for axis, speed in zip(axes[0], speeds, strict=True):
        for row in report.summaries[speed]:
            turns = range(1, len(row.turn_curve) + 1)
            axis.plot(
                turns, [value * 1000 for value in row.turn_curve], marker=".", label=row.label
            )
        axis.set_title(
            "model at zero cost"
            if speed == 0
            else speed_label(speed, report.options.time_to_first_token),
            fontsize=11,
        )
        axis.set_xlabel("turn")
        axis.set_ylabel("turn latency (ms, median)")
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.legend()
    options = report.options
    figure.suptitle(
        f"ws-mode bench: {options.turns} turns, {format_bytes(options.tool_output_bytes)} tool "
        f"outputs, concurrency {options.concurrency}",
        fontsize=12,
    )
    figure.savefig(path, dpi=120)
    plt.close(figure)
