"""``ws-mode bench``: run the benchmark (:mod:`ws_mode.toolkit.bench`), print its measurements.

By default it runs the rollout comparison (:mod:`ws_mode.toolkit.bench.rollout`); ``--proxy``
runs :mod:`ws_mode.toolkit.bench.proxy` instead, ``--url`` :mod:`ws_mode.toolkit.bench.url`. The
report holds measurements and ratios only; ``--check`` adds the project's goals
(:mod:`ws_mode.toolkit.bench.goals`) and makes the command exit 1 when one is not met, as
``--url`` does when the socket's answers differ from HTTP's.
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
        "microbenchmark (with --check, the goals too). --link puts a modelled network between "
        "client and server; --proxy measures ws-mode proxy against HTTP straight to its "
        "upstream; --url URL measures your own server. See docs/benchmarks.md.",
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
    ``--check`` finds a goal not met, or ``--url`` socket answers that differ from HTTP's.
    Raises :class:`~ws_mode.toolkit.bench.options.BenchError`."""
    from ..bench.goals import Goal, measured_goals, proxy_goals
    from ..bench.options import options_from_args

    options = options_from_args(args)
    options.validate()

    def progress(message: str) -> None:
        print(f"{PROG} bench: {message}", file=sys.stderr, flush=True)

    say = None if args.quiet else progress
    goals: list[Goal] = []
    if options.url is not None:
        from ..bench.url import format_url_report, run_url_bench, save_url

        url_report = run_url_bench(options, progress=say)
        save_url(url_report)
        for line in format_url_report(url_report):
            print(line)
        if url_report.mismatches:
            print(
                f"{PROG} bench: the socket's answers differ from HTTP's: "
                + "; ".join(text.splitlines()[0] for text in url_report.mismatches),
                file=sys.stderr,
            )
            return 1
        return 0
    if options.proxy:
        from ..bench.proxy import format_proxy_report, run_proxy_bench, save_proxy

        proxy_report = run_proxy_bench(options, progress=say)
        save_proxy(proxy_report)
        lines = format_proxy_report(proxy_report)
        goals = proxy_goals(proxy_report) if options.check else []
    else:
        from ..bench.rollout import format_report, run_bench, save

        report = run_bench(options, progress=say)
        save(report)
        lines = format_report(report)
        goals = measured_goals(report) if options.check else []
    for line in lines:
        print(line)
    missed = [goal for goal in goals if not goal.met]
    if missed:
        print(
            f"{PROG} bench: {len(missed)} goal(s) not met: "
            + "; ".join(goal.text for goal in missed),
            file=sys.stderr,
        )
        return 1
    return 0
