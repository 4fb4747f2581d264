"""The ``ws-mode bench --proxy`` report: what the proxy costs, as text and as JSON.

:func:`format_proxy_report` prints a :class:`~ws_mode.toolkit.bench.proxy.ProxyReport`: per model
speed, each mode's rollout (end-to-end, early and late turn, the turn at 100 KB of history,
bytes sent, against direct HTTP), then the proxy's own cost (CPU per rollout and per turn, what
it adds to each turn against direct HTTP, its peak RSS); with ``--check`` the goals
(:func:`~ws_mode.toolkit.bench.goals.proxy_goals`). :func:`proxy_report_json` is what ``--json``
writes.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..measure import format_bytes, format_seconds, median
from .goals import goal_lines, proxy_goals
from .options import speed_key, speed_label
from .proxy import HISTORY_MARK, ProxyReport, ProxySummary
from .report import format_ratio, table
from .run import windows

__all__ = ["format_proxy_report", "proxy_report_json", "save_proxy"]


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
