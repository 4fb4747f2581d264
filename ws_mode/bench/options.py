"""What one ``ws-mode bench`` run does: its options, the modes it compares, the speeds it runs.

:class:`BenchOptions` is the scenario and the method (the command's flags,
:func:`configure_parser` and :func:`options_from_args`); :data:`MODES` the three ways of
running the rollout; :class:`BenchError` the one-line failure every bench module raises.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Final, Literal

from ..tools.args import number
from ..tools.measure import format_seconds

__all__ = [
    "MODES",
    "BenchError",
    "BenchOptions",
    "Mode",
    "configure_parser",
    "options_from_args",
    "speed_key",
    "speed_label",
]


class BenchError(Exception):
    """The benchmark could not run or its runs disagree; one line for the user."""


@dataclass(frozen=True)
class Mode:
    """One way of running the rollout: its label, its transport and its server path."""

    key: Literal["http", "always", "on_miss"]
    label: str
    transport: Literal["http", "socket"]


MODES: Final = (
    Mode("http", "HTTP", "http"),
    Mode("always", "WS drop-in", "socket"),
    Mode("on_miss", "WS cache-aware", "socket"),
)


@dataclass(frozen=True)
class BenchOptions:
    """A benchmark run's scenario and method (the ``ws-mode bench`` flags). With ``check``,
    the report also compares the measurements with the project's goals
    (:mod:`ws_mode.bench.goals`)."""

    turns: int = 25
    tool_output_bytes: int = 4096
    tokens_per_second: float = 1000.0
    time_to_first_token: float = 0.0
    concurrency: int = 1
    repeat: int = 7
    warmup: int = 1
    forward_events: int = 20_000
    forward_batch: int = 1
    plot: str | None = None
    json: str | None = None
    profile: str | None = None
    check: bool = False

    @property
    def speeds(self) -> tuple[float, ...]:
        """The model speeds run: zero cost, then the configured one (when not zero)."""
        return (0.0,) if self.tokens_per_second == 0 else (0.0, self.tokens_per_second)

    def validate(self) -> None:
        """BenchError for options no run can honour (or a ``plot`` without matplotlib)."""
        if self.turns < 2:
            raise BenchError("--turns must be at least 2 (a tool call and the answer)")
        if self.repeat < 1 or self.concurrency < 1 or self.warmup < 0:
            raise BenchError("--repeat and --concurrency must be >= 1, --warmup >= 0")
        if self.plot is not None:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise BenchError(
                    "--plot needs matplotlib: pip install matplotlib (or 'ws-mode[bench]')"
                ) from None


def speed_key(speed: float) -> str:
    """A model speed as a name: ``zero-cost`` or ``1000tps``."""
    return "zero-cost" if speed == 0 else f"{speed:g}tps"


def speed_label(speed: float, time_to_first_token: float = 0.0) -> str:
    """A model speed as words, for the report and the progress lines."""
    if speed == 0:
        return "model at zero cost (tokens_per_second=0: the API plumbing only)"
    first = f", {format_seconds(time_to_first_token)} to first token" if time_to_first_token else ""
    return f"model at {speed:g} tokens/s{first}"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the ``ws-mode bench`` flags to ``parser``."""
    defaults = BenchOptions()
    parser.add_argument(
        "--turns",
        type=number(int, 2),
        default=defaults.turns,
        help="model calls per rollout, the last one answering (default: %(default)s)",
    )
    parser.add_argument(
        "--tool-output-bytes",
        type=number(int, 0),
        default=defaults.tool_output_bytes,
        help="bytes of each tool output (default: %(default)s)",
    )
    parser.add_argument(
        "--tokens-per-second",
        type=number(float, 0),
        default=defaults.tokens_per_second,
        help="the model speed measured besides zero cost; 0 runs zero cost only "
        "(default: %(default)g)",
    )
    parser.add_argument(
        "--time-to-first-token",
        type=number(float, 0),
        default=defaults.time_to_first_token,
        help="seconds before each response's first token at the configured speed "
        "(default: %(default)g)",
    )
    parser.add_argument(
        "--concurrency",
        type=number(int, 1),
        default=defaults.concurrency,
        help="rollouts run at once per mode (default: %(default)s)",
    )
    parser.add_argument(
        "--repeat",
        type=number(int, 1),
        default=defaults.repeat,
        help="repetitions; every number is their median (default: %(default)s)",
    )
    parser.add_argument(
        "--warmup",
        type=number(int, 0),
        default=defaults.warmup,
        help="unmeasured rollouts per mode before measuring (default: %(default)s)",
    )
    parser.add_argument(
        "--forward-events",
        type=number(int, 0),
        default=defaults.forward_events,
        help="events of the forwarding microbenchmark; 0 skips it (default: %(default)s)",
    )
    parser.add_argument(
        "--forward-batch",
        type=number(int, 1),
        default=defaults.forward_batch,
        help="events per body chunk the forwarding handler sends (default: %(default)s)",
    )
    parser.add_argument("--plot", metavar="FILE.png", help="draw per-turn latency (matplotlib)")
    parser.add_argument("--json", metavar="FILE", help="write the measurements as JSON")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="cProfile the server during each mode's measured runs and write DIR/*.pstats "
        "(slows the server: for finding where the time goes, not for the numbers)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare the measurements with ws_mode's goals (docs/benchmarks.md) and exit "
        "non-zero when one is not met",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """The :class:`BenchOptions` of parsed ``ws-mode bench`` arguments."""
    return BenchOptions(
        turns=args.turns,
        tool_output_bytes=args.tool_output_bytes,
        tokens_per_second=args.tokens_per_second,
        time_to_first_token=args.time_to_first_token,
        concurrency=args.concurrency,
        repeat=args.repeat,
        warmup=args.warmup,
        forward_events=args.forward_events,
        forward_batch=args.forward_batch,
        plot=args.plot,
        json=args.json,
        profile=args.profile,
        check=args.check,
    )
