"""The ``ws-mode bench`` report: tables of measurements and ratios, a plot, the JSON file.

:func:`format_report` prints a :class:`~ws_mode.toolkit.bench.run.BenchReport` as text (the
project's goals only with ``--check``, :mod:`ws_mode.toolkit.bench.goals`), :func:`plot` draws the
per-turn latency (matplotlib, imported there), :func:`report_json` is the JSON ``--json`` writes and
:func:`save` writes both files the options ask for.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..measure import format_bytes, format_seconds
from .goals import goal_lines, measured_goals, percent
from .options import BenchOptions, speed_key, speed_label
from .run import BenchReport, ModeSummary, windows

__all__ = ["format_ratio", "format_report", "link_line", "plot", "report_json", "save", "table"]


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


# ----------------------------------------------------------------------------- text


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
                ],
            ),
            f"  ratio: {forward.ratio:.2f} (events/s), {forward.cpu_ratio:.2f} (server CPU/event)",
        ]
        if forward.in_process_cpu:
            lines.append(
                f"  ws_mode's own CPU per event, in-process with no socket: "
                f"{format_seconds(forward.in_process_cpu_per_event)}"
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
