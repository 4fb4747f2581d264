"""The ``ws-mode`` command: the parser, the dispatch to each command, the exit statuses.

One module per command: :mod:`~ws_mode.toolkit.cli.serve` (the reference server in WebSocket mode),
:mod:`~ws_mode.toolkit.cli.demo` (one rollout over HTTP and over the socket, side by side),
:mod:`~ws_mode.toolkit.cli.bench` (the benchmark), :mod:`~ws_mode.toolkit.cli.proxy` (WebSocket mode
in front of a remote Responses server) and :mod:`~ws_mode.toolkit.cli.check` (WebSocket mode's
checks against a live endpoint); :mod:`~ws_mode.toolkit.cli.common` holds what they share. Needs the
``cli`` extra (``pip install ".[cli]"`` in a clone of ws_mode); ``proxy`` needs only the ``proxy``
extra, ``check`` only the ``check`` extra (its socket client).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from ws_mode import __version__

from . import bench, check, demo, proxy, serve
from .common import CLI_REQUIREMENTS, PROG, CommandError, Requirements, configure_logging
from .serve import build_app

__all__ = ["build_app", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``ws-mode`` argument parser."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="OpenAI's Responses API WebSocket mode for any HTTP Responses server.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in (serve, proxy, demo, bench, check):
        command.add_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ws-mode`` command; return its exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (already printed)
        return exc.code if isinstance(exc.code, int) else 1
    run: Callable[[argparse.Namespace], int] | None = getattr(args, "run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return 2
    requirements: Requirements = getattr(args, "requirements", CLI_REQUIREMENTS)
    missing = requirements.missing()
    if missing:
        print(
            f"{PROG}: error: this command needs {', '.join(missing)}; "
            f"install them with: {requirements.install_hint()}",
            file=sys.stderr,
        )
        return 1
    configure_logging()
    try:
        return run(args)
    except CommandError as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130
