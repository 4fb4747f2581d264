"""``ws-mode demo``: one agent rollout over HTTP and over WebSocket mode, side by side.

It starts the reference server on loopback (the tools' runner,
:class:`~ws_mode.testing._loopback.ServerThread`), runs one agent rollout over plain HTTP with the
full history and two over the socket (drop-in ``full_context="always"`` and cache-aware
``"on_miss"``), and prints what each cost (rich).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from ws_mode._middleware import WebSocketModeMiddleware

from ..args import number
from ..measure import format_bytes, format_seconds
from .common import API_PATH, PROG, CommandError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from starlette.applications import Starlette
    from starlette.types import ASGIApp

    from ..rollout import RolloutResult, TurnCallback

__all__ = ["CACHE_AWARE_PATH", "add_command"]

CACHE_AWARE_PATH: Final = "/cache-aware/v1/responses"
"""Where the demo server takes sockets for ``full_context="on_miss"``."""
WARM_UP_TURNS: Final = 3
SERVER_NAME: Final = "ws-mode-demo"
"""The demo server's thread is named after this."""


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``demo`` and its flags."""
    demo = commands.add_parser(
        "demo",
        help="measure an agent rollout over HTTP and over WebSocket mode",
        description="Start the reference server on a free loopback port and run the same agent "
        "rollout three ways: HTTP with the full history, and WebSocket mode with "
        "full_context=always (drop-in) and on_miss (cache-aware). Prints what each cost.",
    )
    demo.add_argument(
        "--turns",
        type=number(int, 1),
        default=24,
        help="model calls in the rollout; the model asks for a tool on all but the last "
        "(default: %(default)s)",
    )
    demo.add_argument(
        "--tool-output-bytes",
        type=number(int, 0),
        default=4096,
        help="size of each tool output the client sends (default: %(default)s)",
    )
    demo.add_argument(
        "--tokens-per-second",
        type=number(float, 0),
        default=0.0,
        help="simulated generation speed, 0 for no delay: the rollout then measures only the "
        "API plumbing (default: %(default)g)",
    )
    demo.add_argument(
        "--no-progress", action="store_true", help="no progress bars (also off when not a TTY)"
    )
    demo.set_defaults(run=_demo)


def _demo_app(reference: Starlette) -> WebSocketModeMiddleware:
    """Both middleware modes in front of one reference app: sockets at ``/v1/responses`` get
    ``full_context="always"``, sockets at ``CACHE_AWARE_PATH`` ``"on_miss"``; plain HTTP goes
    to the reference app through both."""
    drop_in = WebSocketModeMiddleware(reference, path=API_PATH, full_context="always")
    return WebSocketModeMiddleware(
        drop_in, path=CACHE_AWARE_PATH, handler_path=API_PATH, full_context="on_miss"
    )


@contextlib.contextmanager
def _server(app: ASGIApp) -> Iterator[str]:
    """Serve ``app`` on loopback in a daemon thread; yield its origin. The server stops when
    the block exits (and dies with the process in any case)."""
    from ws_mode.testing._loopback import ServerStartError, ServerThread, ws_max_size

    server = ServerThread(
        app,
        ws_max_size=ws_max_size(),
        lifespan="off",
        name=SERVER_NAME,
        options={"timeout_graceful_shutdown": 2},
    )
    try:
        base_url = server.start()
    except ServerStartError as exc:
        raise CommandError(f"the demo server did not start: {exc}") from exc
    try:
        yield base_url
    finally:
        server.stop()


@dataclass(frozen=True)
class _Mode:
    """One way of running the rollout."""

    name: str
    transport: Literal["http", "socket"]
    path: str

    def run(
        self,
        base_url: str,
        *,
        turns: int,
        tool_output_bytes: int,
        on_turn: TurnCallback | None = None,
        metadata: dict[str, str] | None = None,
    ) -> RolloutResult:
        """Run the rollout this way."""
        from .. import rollout

        return rollout.run_rollout(
            self.transport,
            base_url,
            turns=turns,
            tool_output_bytes=tool_output_bytes,
            path=self.path,
            on_turn=on_turn,
            metadata=metadata,
        )


@dataclass(frozen=True)
class _Measured:
    """What one mode's rollout cost."""

    mode: _Mode
    result: RolloutResult
    bytes_parsed: int


def _demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..reference import ReferenceConfig, create_app
    from ..rollout import RolloutError, rollout_difference

    tty = sys.stdout.isatty()
    # Not a terminal: no width to follow, so one wide enough for the table.
    console = Console(highlight=False) if tty else Console(highlight=False, width=100)
    turns: int = args.turns
    reference = create_app(
        ReferenceConfig(tool_calls=turns - 1, tokens_per_second=args.tokens_per_second)
    )
    stats = reference.state.reference_stats
    modes = [
        _Mode("HTTP", "http", API_PATH),
        _Mode("WS always", "socket", API_PATH),
        _Mode("WS on_miss", "socket", CACHE_AWARE_PATH),
    ]
    measured: list[_Measured] = []
    try:
        with _server(_demo_app(reference)) as base_url:
            console.print(
                f"{PROG} demo: one agent rollout of {turns} turns ({turns - 1} tool calls, "
                f"{format_bytes(args.tool_output_bytes)} per tool output) against the reference "
                f"server at {base_url}, run three ways: HTTP with the full history each turn, "
                "and WebSocket mode (WS) with full_context=always (drop-in) and on_miss "
                "(cache-aware)."
            )
            warm_up = min(turns, WARM_UP_TURNS)
            for mode in modes:  # discarded: imports, connection pools, first-call costs
                mode.run(
                    base_url,
                    turns=warm_up,
                    tool_output_bytes=args.tool_output_bytes,
                    metadata={"reference_tool_calls": str(warm_up - 1)},
                )
            names = [mode.name for mode in modes]
            enabled = tty and not args.no_progress
            with _progress(console, names, turns, enabled=enabled) as callbacks:
                for mode in modes:
                    stats.reset()
                    result = mode.run(
                        base_url,
                        turns=turns,
                        tool_output_bytes=args.tool_output_bytes,
                        on_turn=callbacks[mode.name],
                    )
                    measured.append(_Measured(mode, result, stats.bytes_parsed))
    except RolloutError as exc:
        raise CommandError(str(exc)) from exc

    over_http = measured[0]
    for row in measured[1:]:
        differs = rollout_difference(over_http.result, row.result)
        if differs is not None:
            raise CommandError(
                f"{row.mode.name} got different answers from HTTP, so the model saw different "
                f"contexts: {differs}"
            )
    for row in measured:
        if row.result.turns != turns:
            raise CommandError(
                f"the {row.mode.name} rollout took {row.result.turns} turns instead of {turns}"
            )
    console.print(_table(measured, turns))
    for line in _summary(measured):
        console.print(line)
    return 0


@contextlib.contextmanager
def _progress(
    console: Console, names: Sequence[str], turns: int, *, enabled: bool
) -> Iterator[dict[str, TurnCallback | None]]:
    """Yield a turn callback per mode name, each advancing that mode's progress bar (all bars
    shown from the start). Disabled, every callback is None."""
    if not enabled:
        yield dict.fromkeys(names)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    width = max(len(name) for name in names)
    with Progress(
        TextColumn(f"{{task.description:<{width}}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("turns"),
        console=console,
    ) as progress:

        def advancing(name: str) -> TurnCallback:
            task = progress.add_task(name, total=turns)

            def advance(turn: int, seconds: float) -> None:
                progress.update(task, completed=turn)

            return advance

        yield {name: advancing(name) for name in names}


def _ratio(value: float, reference: float) -> float:
    return value / reference if reference else float("nan")


def _table(measured: Sequence[_Measured], turns: int) -> Table:
    from rich import box
    from rich.table import Table

    table = Table(
        title=f"One agent rollout: {turns} turns, {turns - 1} tool calls",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
        caption="early / late turn: median time of the first / last 3 turns (send to terminal "
        "event); sent: bytes the client sent; parsed: request bytes the handler parsed",
        caption_justify="left",
    )
    table.add_column("mode", no_wrap=True)
    headers = ("total", "early\nturn", "late\nturn", "sent", "parsed", "time\n/HTTP", "sent\n/HTTP")
    for header in headers:
        table.add_column(header, justify="right", no_wrap=True)
    http = measured[0].result
    for row in measured:
        result = row.result
        is_http = row.mode.transport == "http"
        table.add_row(
            row.mode.name,
            format_seconds(result.total_seconds),
            format_seconds(result.early_median()),
            format_seconds(result.late_median()),
            format_bytes(result.bytes_sent),
            format_bytes(row.bytes_parsed),
            "1" if is_http else f"{_ratio(result.total_seconds, http.total_seconds):.2f}",
            "1" if is_http else f"{_ratio(result.bytes_sent, http.bytes_sent):.3f}",
        )
    return table


def _summary(measured: Sequence[_Measured]) -> list[str]:
    """Three lines saying what the table shows, worded from its numbers: `measured` holds
    HTTP, then the socket with full_context=always, then with on_miss."""
    http, always, on_miss = (row.result for row in measured)
    bytes_ratio = _ratio(http.bytes_sent, always.bytes_sent)
    lines = [
        f"Over HTTP the client re-sent the whole history every turn "
        f"({format_bytes(http.bytes_sent)} in {http.turns} turns); over the socket it sent only "
        f"the new tool outputs ({format_bytes(always.bytes_sent)}, {bytes_ratio:.1f} times less).",
        f"With full_context=always (drop-in) the handler still parsed the whole history each turn "
        f"({format_bytes(measured[1].bytes_parsed)}); with on_miss it parsed only the new items "
        f"({format_bytes(measured[2].bytes_parsed)}) and took the rest from the cached Turn.",
    ]
    ratios = (
        _ratio(always.total_seconds, http.total_seconds),
        _ratio(on_miss.total_seconds, http.total_seconds),
    )
    timing = (
        f"End to end the socket took {ratios[0]:.2f}x (always) and {ratios[1]:.2f}x (on_miss) "
        "the time of HTTP"
    )
    if max(ratios) < 0.9:
        early, late = http.early_median(), http.late_median()
        if late > 1.2 * early:
            timing += (
                f", while HTTP's turns slowed from {format_seconds(early)} to "
                f"{format_seconds(late)} as the history grew."
            )
        else:
            timing += "."
    else:
        timing += (
            f": re-sending a {format_bytes(http.turn_bytes[-1])} history costs HTTP little on "
            "loopback and one short rollout is noisy; the gap grows with the history "
            "(try --turns 60 --tool-output-bytes 32768)."
        )
    lines.append(
        timing + " All three modes got the same answer, so the model saw the same context."
    )
    return lines
