"""The project's own goals for ``ws-mode bench``, checked only when asked (``--check``).

The default report prints measurements and ratios; ``ws-mode bench --check`` also compares
them with the goals below (the lab notebook, benchmarks/NOTEBOOK.md in the repository, says why
each is set where it is) and exits non-zero when one is not met: :func:`measured_goals` measures
each :class:`Goal` of the rollout comparison (:mod:`ws_mode.toolkit.bench.rollout`),
:func:`proxy_goals` those of ``--proxy`` (:mod:`ws_mode.toolkit.bench.proxy`), :func:`goal_lines`
prints them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from ..measure import format_seconds
from .forward import ForwardResult
from .options import MODES

if TYPE_CHECKING:
    # The reports import these goals to print them: their types only, no import cycle.
    from .proxy import ProxyReport
    from .rollout import BenchReport, ModeSummary

__all__ = [
    "GOAL_CACHE_AWARE",
    "GOAL_DROP_IN",
    "GOAL_FLAT",
    "GOAL_FORWARD_CPU",
    "GOAL_FORWARD_OWN_US",
    "GOAL_PROXY_FIXED_MS",
    "GOAL_PROXY_LINK",
    "GOAL_PROXY_LOOPBACK",
    "GOAL_PROXY_MARK_MS",
    "Goal",
    "goal_lines",
    "measured_goals",
    "percent",
    "proxy_goals",
]

GOAL_CACHE_AWARE: Final = 0.10
GOAL_FLAT: Final = 1.20
GOAL_DROP_IN: Final = 0.95
#: ws_mode's own CPU per forwarded event, in microseconds (in-process, no socket), the
#: handler handing its events as objects (`Turn.send_event`; issue 21). The SSE path's is
#: shown beside it.
GOAL_FORWARD_OWN_US: Final = 2.0
#: The server's CPU per event through the middleware (events handed as objects) over the bare
#: socket's.
GOAL_FORWARD_CPU: Final = 1.5
# ``--proxy`` (ws_mode.toolkit.bench.proxy): the proxy's CPU per turn in ms, and end-to-end ratios.
GOAL_PROXY_FIXED_MS: Final = 1.0
GOAL_PROXY_MARK_MS: Final = 1.5
GOAL_PROXY_LOOPBACK: Final = 1.05
GOAL_PROXY_LINK: Final = 0.60


def percent(value: float) -> str:
    """A fraction as a whole percentage."""
    return f"{value * 100:.0f}%"


@dataclass(frozen=True)
class Goal:
    """One of the benchmark's goals, as measured."""

    text: str
    value: float
    limit: float
    at_most: bool
    detail: str = ""
    why: str = ""
    """Where the time goes, shown when the goal is not met."""

    @property
    def met(self) -> bool:
        """Whether the measured value is within the limit."""
        if math.isnan(self.value):
            return False
        return self.value <= self.limit if self.at_most else self.value >= self.limit


def measured_goals(report: BenchReport) -> list[Goal]:
    """The goals, measured on the zero-cost model (and the forwarding microbenchmark)."""
    http, drop_in, cache_aware = (report.summary(0.0, mode.key) for mode in MODES)
    goals = [
        Goal(
            "cache-aware end-to-end / HTTP's (model at zero cost)",
            cache_aware.end_to_end / http.end_to_end,
            GOAL_CACHE_AWARE,
            at_most=True,
            why=f"cache-aware: the server spent {format_seconds(cache_aware.server_cpu)} of CPU "
            f"per rollout ({percent(cache_aware.server_cpu / cache_aware.end_to_end)} of "
            f"its end-to-end), the handler's own work {format_seconds(cache_aware.handler_cpu)}",
        ),
        Goal(
            "cache-aware per-turn time flat: late / early (model at zero cost)",
            cache_aware.growth,
            GOAL_FLAT,
            at_most=True,
            detail=f"HTTP's late / early: {http.growth:.2f}, drop-in's: {drop_in.growth:.2f}",
        ),
        Goal(
            "drop-in end-to-end / HTTP's (model at zero cost)",
            drop_in.end_to_end / http.end_to_end,
            GOAL_DROP_IN,
            at_most=True,
            why=_drop_in_why(http, drop_in, report.options.concurrency),
        ),
    ]
    forward = report.forward
    if forward is not None:
        if forward.in_process_objects_cpu:
            goals.append(
                Goal(
                    "event forwarding: ws_mode's own CPU per event (µs, in-process; "
                    "events handed as objects)",
                    forward.in_process_objects_cpu_per_event * 1e6,
                    GOAL_FORWARD_OWN_US,
                    at_most=True,
                    detail=f"as SSE: {format_seconds(forward.in_process_cpu_per_event)}"
                    if forward.in_process_cpu
                    else "",
                    why=_forward_why(forward),
                )
            )
        goals.append(
            Goal(
                "event forwarding: server CPU per event / the bare WebSocket's "
                "(events handed as objects)",
                1 / forward.objects_cpu_ratio if forward.objects_cpu_ratio else math.nan,
                GOAL_FORWARD_CPU,
                at_most=True,
                detail=f"server CPU per event: bare {format_seconds(forward.bare_cpu_per_event)}, "
                f"objects {format_seconds(forward.objects_cpu_per_event)}, "
                f"SSE {format_seconds(forward.middleware_cpu_per_event)} "
                f"({1 / forward.cpu_ratio:.2f} of bare); "
                f"throughput {forward.objects_rate / forward.bare_rate:.2f} of bare"
                if forward.bare_cpu and forward.objects_cpu and forward.middleware_cpu
                else "",
                why=_forward_why(forward),
            )
        )
    return goals


def _forward_why(forward: ForwardResult) -> str:
    if not forward.in_process_objects_cpu:
        return ""
    return (
        f"ws_mode's own work is {format_seconds(forward.in_process_objects_cpu_per_event)} per "
        "event handed as an object (measured in-process with a server send that does nothing, "
        "less the handler's own work: Turn.send_event, the event's encoding, "
        "Connection.send_text, each an interpreted Python call); the server's frame send, "
        "which the bare endpoint pays too, is the rest "
        f"({format_seconds(forward.bare_cpu_per_event)} per event there)"
    )


def _drop_in_why(http: ModeSummary, drop_in: ModeSummary, concurrency: int) -> str:
    if drop_in.handler_cpu is None or not http.end_to_end:
        return ""
    # Concurrent rollouts queue on one server process: their handler work adds up.
    floor = concurrency * drop_in.handler_cpu / http.end_to_end
    shared = f", times {concurrency} rollouts sharing the server" if concurrency > 1 else ""
    return (
        "drop-in leaves the handler stateless: it still parsed and rendered the whole history "
        f"every turn ({format_seconds(drop_in.handler_cpu)} of CPU per rollout{shared}: "
        f"{floor:.2f} of HTTP's end-to-end), which no transport removes; drop-in saved the rest: "
        f"{format_seconds(http.end_to_end - drop_in.end_to_end)} per rollout"
    )


def goal_lines(goals: list[Goal]) -> list[str]:
    """The goals as lines of the report: each with its limit, its value and whether it is
    met; where the time went under each one that is not."""
    lines = ["Goals:"]
    for goal in goals:
        relation = "<=" if goal.at_most else ">="
        verdict = "met" if goal.met else "NOT MET"
        detail = f" ({goal.detail})" if goal.detail else ""
        lines.append(
            f"  goal: {goal.text} {relation} {goal.limit:.2f}: {goal.value:.2f} - {verdict}{detail}"
        )
        if not goal.met and goal.why:
            lines.append(f"    why: {goal.why}")
    return lines


def proxy_goals(report: ProxyReport) -> list[Goal]:
    """The ``--proxy`` goals, measured on the zero-cost model: the proxy's CPU per turn early
    (its fixed cost) and at 100 KB of history, in ms; the socket through the proxy against
    direct HTTP end-to-end, on loopback or, with ``--link``, through the link."""
    direct = report.summary(0.0, "direct")
    socket = report.summary(0.0, "ws_proxy")
    mark = "" if report.mark_turn is None else f", from turn {report.mark_turn}"
    why_cpu = (
        "the proxy's CPU per turn is ws_mode's turn on the socket plus the proxy's HTTP call "
        "upstream and its forwarding of the events; ws-mode bench --proxy --profile DIR "
        "writes DIR/proxy-*.pstats to see where it goes"
    )
    goals = [
        Goal(
            "proxy fixed cost: its CPU per turn, early turns, WS via proxy (ms, zero cost)",
            _ms(socket.proxy_cpu_early),
            GOAL_PROXY_FIXED_MS,
            at_most=True,
            detail="HTTP via proxy: "
            + format_seconds(report.summary(0.0, "http_proxy").proxy_cpu_early),
            why=why_cpu,
        ),
        Goal(
            f"proxy CPU per turn at 100 KB of history{mark}, WS via proxy (ms, zero cost)",
            _ms(socket.proxy_cpu_mark) if report.mark_reached else math.nan,
            GOAL_PROXY_MARK_MS,
            at_most=True,
            why=why_cpu
            if report.mark_reached
            else "no tool-call turn's history reached 100 KB: make --turns larger",
        ),
    ]
    ratio = socket.row.end_to_end / direct.row.end_to_end
    added = report.added(0.0, "ws_proxy")
    why = (
        f"the proxy added {format_seconds(added[0])} per turn early and {format_seconds(added[1])} "
        f"late; its CPU per rollout was {format_seconds(socket.proxy_cpu)}"
    )
    if report.link is None:
        goals.append(
            Goal(
                "WS via proxy end-to-end / direct HTTP's (loopback, zero cost)",
                ratio,
                GOAL_PROXY_LOOPBACK,
                at_most=True,
                why=why,
            )
        )
    else:
        goals.append(
            Goal(
                f"WS via proxy end-to-end / direct HTTP's (link {report.link}, zero cost)",
                ratio,
                GOAL_PROXY_LINK,
                at_most=True,
                why=why,
            )
        )
    return goals


def _ms(seconds: float | None) -> float:
    return math.nan if seconds is None else seconds * 1000
