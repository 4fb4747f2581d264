"""``ws-mode bench``: run the benchmark (:mod:`ws_mode.bench`), print its measurements.

The report holds measurements and ratios only; ``--check`` adds the project's goals
(:mod:`ws_mode.bench.goals`) and makes the command exit 1 when one is not met.
"""

from __future__ import annotations

import argparse
import sys

from .common import PROG, CommandError

__all__ = ["add_command", "run_from_args"]


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``bench`` and its flags."""
    from ..bench.options import configure_parser

    bench = commands.add_parser(
        "bench",
        help="benchmark HTTP against WebSocket mode (drop-in and cache-aware)",
        description="Run an agent rollout against the reference server over HTTP with the "
        "full history and over WebSocket mode (full_context=always, and on_miss with a "
        "renderer), with the model at zero cost and at the configured speed, interleaved and "
        "repeated, the server in its own process; print medians and the event-forwarding "
        "microbenchmark (with --check, the goals too).",
    )
    configure_parser(bench)
    bench.set_defaults(run=_bench)


def _bench(args: argparse.Namespace) -> int:
    from ..bench.options import BenchError

    try:
        return run_from_args(args)
    except BenchError as exc:
        raise CommandError(str(exc)) from exc


def run_from_args(args: argparse.Namespace) -> int:
    """Run ``ws-mode bench``: measure, write the files asked for, print the report; 1 when
    ``--check`` finds a goal not met. Raises :class:`~ws_mode.bench.options.BenchError`."""
    from ..bench.goals import measured_goals
    from ..bench.options import options_from_args
    from ..bench.report import format_report, save
    from ..bench.run import run_bench

    options = options_from_args(args)

    def progress(message: str) -> None:
        print(f"{PROG} bench: {message}", file=sys.stderr, flush=True)

    report = run_bench(options, progress=None if args.quiet else progress)
    save(report)
    for line in format_report(report):
        print(line)
    if not options.check:
        return 0
    missed = [goal for goal in measured_goals(report) if not goal.met]
    if missed:
        print(
            f"{PROG} bench: {len(missed)} goal(s) not met: "
            + "; ".join(goal.text for goal in missed),
            file=sys.stderr,
        )
        return 1
    return 0
