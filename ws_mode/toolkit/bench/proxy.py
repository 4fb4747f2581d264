"""``ws-mode bench --proxy``: what ``ws-mode proxy`` costs, against HTTP straight to its upstream.

:func:`run_proxy_bench` starts the upstream (the reference server,
:mod:`ws_mode.toolkit.bench.server`, plain HTTP) and the proxy in front of it, each in its own
process, with ``--link`` one relay in front of each (:func:`~ws_mode.toolkit.bench.control.linked`:
the client is remote, the proxy sits next to its upstream). It runs the rollout in the
:data:`PROXY_MODES`, interleaved and repeated after a warm-up: HTTP with the full history straight
to the upstream, the socket through the proxy (which sends the upstream the full history each turn),
and HTTP through the proxy.

Besides the rollout's times it reads the proxy process's CPU time before and after every turn
(:func:`~ws_mode.toolkit.bench.control.process_cpu`, from outside: no request to the proxy between
turns) and its peak RSS; :class:`ProxyReport` holds the medians. :func:`format_proxy_report`
prints it: per model speed, each mode's rollout (end-to-end, early and late turn, the turn at
100 KB of history, bytes sent, against direct HTTP), then the proxy's own cost (CPU per rollout
and per turn, what it adds to each turn against direct HTTP, its peak RSS); with ``--check`` the
goals (:func:`~ws_mode.toolkit.bench.goals.proxy_goals`). :func:`proxy_report_json` is what
``--json`` writes.

The proxy's process is this same module, ``python -m ws_mode.toolkit.bench.proxy --serve
--upstream URL --speeds N --fd N`` (through
:func:`~ws_mode.toolkit.bench.control.measured_process`, :func:`serve`). It serves what
``ws-mode proxy`` serves (:mod:`ws_mode.toolkit.cli.proxy`): :func:`ws_mode.proxy.create_proxy`
behind :class:`~ws_mode.WebSocketModeMiddleware` (``full_context="always"``, cache misses
answered with an error, default limits), with uvicorn's lifespan on so the proxy's HTTP client
opens on startup (:func:`build_proxy_app`). The upstream is given by its origin, so client paths
go upstream unchanged: for each model speed ``i``, WebSocket mode and HTTP at
``/s{i}/v1/responses`` (:func:`~ws_mode.toolkit.bench.server.mode_path`), forwarded to the same
path upstream. Unlike ``ws-mode proxy`` it logs no access line per request (uvicorn's log level
is warning), and it also serves the bench's stats and profile routes
(:func:`~ws_mode.toolkit.bench.server.control_routes`: the process's CPU time and peak RSS,
cProfile).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from starlette.applications import Starlette
from starlette.types import ASGIApp

from ws_mode._limits import Limits
from ws_mode._middleware import WebSocketModeMiddleware
from ws_mode.testing._loopback import add_child_arguments, serve_inherited, ws_max_size

from ..measure import format_bytes, format_seconds, median, median_present
from .control import ServerControl, linked, measured_process, process_cpu, server_process
from .goals import goal_lines, proxy_goals
from .options import BenchError, BenchOptions, Mode, speed_key, speed_label
from .rollout import (
    WINDOW,
    ModeSummary,
    Sample,
    format_ratio,
    rotated,
    summarize,
    table,
    windows,
)
from .server import Dispatch, ServerSpec, control_routes, mode_path, process_stats

if TYPE_CHECKING:
    from ..rollout import RolloutResult

__all__ = [
    "HISTORY_MARK",
    "PROXY_MODES",
    "ProxyReport",
    "ProxySample",
    "ProxySummary",
    "build_proxy_app",
    "format_proxy_report",
    "history_mark",
    "proxy_report_json",
    "run_proxy_bench",
    "save_proxy",
    "serve",
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
    :data:`~ws_mode.toolkit.bench.rollout.WINDOW` tool-call turns (the last turn, the answer, left
    out); the late window when no tool-call turn reaches it. And that first turn, from 1."""
    first = next((i for i, size in enumerate(history) if size >= HISTORY_MARK), None)
    last = len(history) - 1
    if first is None or first >= last:
        return windows(len(history))[1], None if first is None else first + 1
    return slice(first, min(first + WINDOW, last)), first + 1


# ----------------------------------------------------------------------------- the proxy's process


def build_proxy_app(upstream: str, speeds: int) -> ASGIApp:
    """The proxy in front of ``upstream`` (an origin), with WebSocket mode at the path of each
    of ``speeds`` model speeds, and the bench's stats and profile routes under ``/bench/``."""
    from ws_mode.proxy import create_proxy

    limits = Limits()
    app: ASGIApp = create_proxy(upstream)
    for index in range(speeds):
        path = mode_path(index, "http")
        app = WebSocketModeMiddleware(
            app,
            path=path,
            handler_path=path,
            full_context="always",
            on_cache_miss="error",
            limits=limits,
        )

    def stats() -> dict[str, Any]:
        return {"references": [], **process_stats()}

    tools = Starlette(routes=control_routes(stats, lambda: None))
    return Dispatch([("/bench/", tools)], app)


def serve(argv: Sequence[str] | None = None) -> int:
    """The proxy's process: ``python -m ws_mode.toolkit.bench.proxy --serve --upstream URL
    --speeds N --fd N`` (started by :func:`run_proxy_bench`) serves :func:`build_proxy_app` on the
    parent's socket."""
    parser = argparse.ArgumentParser(
        prog="python -m ws_mode.toolkit.bench.proxy",
        description="The proxy ws-mode bench --proxy measures, in its own process; "
        "ws-mode bench --proxy starts it.",
    )
    parser.add_argument("--serve", action="store_true", required=True, help="serve the proxy")
    parser.add_argument("--upstream", required=True, help="the upstream's origin")
    parser.add_argument("--speeds", type=int, default=1, help="model speeds the upstream serves")
    add_child_arguments(parser)
    args = parser.parse_args(argv)
    serve_inherited(
        build_proxy_app(args.upstream, args.speeds),
        args,
        lifespan="on",
        access_log=False,
        ws_max_size=ws_max_size(),
        timeout_graceful_shutdown=2,
    )
    return 0


# ----------------------------------------------------------------------------- the run


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
        arguments = ["--serve", "--upstream", upstream_url, "--speeds", str(len(options.speeds))]
        proxy = stack.enter_context(
            measured_process("ws_mode.toolkit.bench.proxy", arguments, "the proxy")
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


# ----------------------------------------------------------------------------- the report as text


def _turns(window: slice) -> str:
    first, last = window.start + 1, window.stop
    return f"turn {first}" if first == last else f"turns {first}-{last}"


def _mark_line(report: ProxyReport) -> str:
    window = _turns(report.mark)
    size = format_bytes(report.history[report.mark.start])
    if report.mark_turn is None:
        return (
            f"History: no turn's full-history body reaches {HISTORY_MARK:,} bytes (the largest: "
            f"{format_bytes(max(report.history))}); 'at 100 KB' is the late window, {window}, "
            f"from {size}: make --turns or --tool-output-bytes larger"
        )
    if report.mark.start + 1 != report.mark_turn:
        return (
            f"History: the full-history body passes {HISTORY_MARK:,} bytes at turn "
            f"{report.mark_turn}, the answer; 'at 100 KB' is the late window, {window}, from "
            f"{size}: make --turns larger"
        )
    return (
        f"History: the full-history body passes {HISTORY_MARK:,} bytes at turn "
        f"{report.mark_turn} ({size}); 'at 100 KB' is the median of {window}."
    )


def _rollout_table(report: ProxyReport, rows: list[ProxySummary]) -> list[str]:
    direct = rows[0].row
    cells = [
        [
            summary.row.label,
            format_seconds(summary.row.end_to_end),
            format_ratio(summary.row.end_to_end, direct.end_to_end),
            format_seconds(summary.row.early),
            format_seconds(summary.row.late),
            format_seconds(median(summary.row.turn_curve[report.mark])),
            format_bytes(summary.row.bytes_sent),
            format_ratio(summary.row.bytes_sent, direct.bytes_sent, 3),
            format_seconds(summary.row.server_cpu),
        ]
        for summary in rows
    ]
    headers = ["mode", "end-to-end", "/direct", "early turn", "late turn", "at 100 KB"]
    return table([*headers, "sent", "/direct", "upstream CPU"], cells)


def _proxy_table(report: ProxyReport, speed: float, rows: list[ProxySummary]) -> list[str]:
    cells = []
    for summary in rows[1:]:
        early, late, mark = report.added(speed, summary.row.mode)
        turns = summary.row.turn_curve
        cells.append(
            [
                summary.row.label,
                format_seconds(summary.proxy_cpu),
                format_seconds(summary.proxy_cpu / len(turns) if turns else None),
                format_seconds(summary.proxy_cpu_early),
                format_seconds(summary.proxy_cpu_mark),
                format_seconds(early),
                format_seconds(late),
                format_seconds(mark),
                format_bytes(summary.proxy_peak_rss),
            ]
        )
    headers = ["mode", "proxy CPU", "per turn", "early turn", "at 100 KB"]
    return table([*headers, "added early", "added late", "at 100 KB", "proxy peak RSS"], cells)


def format_proxy_report(report: ProxyReport) -> list[str]:
    """The report as lines of text; with ``options.check``, the goals."""
    options = report.options
    early, late = windows(options.turns)
    lines = [
        f"ws-mode bench --proxy: an agent rollout of {options.turns} turns "
        f"({options.turns - 1} tool calls, {format_bytes(options.tool_output_bytes)} per tool "
        "output), one at a time, against the reference server (plain HTTP) and ws-mode proxy "
        "in front of it (full_context=always), each in its own process; median of "
        f"{options.repeat} repetitions, modes interleaved (order rotated); {os.cpu_count()} "
        "CPUs.",
        "Modes: HTTP direct (the whole history each turn, straight to the upstream), WS via "
        "proxy (only the new items; the proxy sends the upstream the whole history), HTTP via "
        "proxy (the whole history, through the proxy).",
        f"Early / late turn: median of turns {early.start + 1}-{early.stop} / "
        f"{late.start + 1}-{late.stop} (send to terminal event). Proxy CPU: the proxy "
        "process's CPU time, read from outside after every turn; added: the mode's turn time "
        "minus direct HTTP's, turn by turn.",
        _mark_line(report),
    ]
    if report.link is not None:
        lines.append(
            f"Link: the client reaches the upstream and the proxy each through a relay "
            f"modelling {report.link}; the proxy reaches its upstream on loopback."
        )
    for speed, rows in report.summaries.items():
        lines += [
            "",
            speed_label(speed, options.time_to_first_token),
            *_rollout_table(report, rows),
            "",
            "  The proxy's own cost (per rollout, per turn; added: against direct HTTP):",
            *_proxy_table(report, speed, rows),
        ]
    if options.check:
        lines += ["", *goal_lines(proxy_goals(report))]
    if report.profiles:
        lines += ["", "Profiles (cProfile; times are inflated by profiling):"]
        lines += [f"  {path}" for path in report.profiles]
    lines.append(f"({report.seconds:.0f} s)")
    return lines


# ----------------------------------------------------------------------------- the report as JSON


def proxy_report_json(report: ProxyReport) -> dict[str, Any]:
    """The report as plain JSON (with ``options.check``, the goals)."""
    data: dict[str, Any] = {
        "options": report.options.public(),
        "link": report.link,
        "seconds": report.seconds,
        "history": report.history,
        "mark_turn": report.mark_turn,
        "mark_turns": [report.mark.start + 1, report.mark.stop],
        "summaries": {
            speed_key(speed): [
                {
                    **asdict(summary),
                    "added": report.added(speed, summary.row.mode),
                }
                for summary in rows
            ]
            for speed, rows in report.summaries.items()
        },
        "profiles": report.profiles,
    }
    if report.options.check:
        data["goals"] = [{**asdict(goal), "met": goal.met} for goal in proxy_goals(report)]
    return data


def save_proxy(report: ProxyReport) -> None:
    """Write the JSON ``options.json`` asks for."""
    if report.options.json is not None:
        text = json.dumps(proxy_report_json(report), indent=2)
        Path(report.options.json).write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(serve())
