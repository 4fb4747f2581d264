"""The ``ws-mode`` command: a reference server in WebSocket mode, and a demo that measures it.

``ws-mode serve`` runs the reference Responses server (``ws_mode.reference``) wrapped by
:class:`~ws_mode.WebSocketModeMiddleware` under uvicorn. ``ws-mode demo`` starts the same on a
free loopback port, runs one agent rollout over plain HTTP with the full history and two over
the socket (drop-in ``full_context="always"`` and cache-aware ``"on_miss"``), and prints what
each cost. Needs the ``cli`` extra: ``pip install "ws-mode[cli]"``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from . import __version__
from .limits import Limits
from .middleware import FullContext, WebSocketModeMiddleware

if TYPE_CHECKING:
    import uvicorn
    from rich.console import Console
    from rich.table import Table
    from starlette.applications import Starlette
    from starlette.types import ASGIApp

    from .rollout import RolloutResult, TurnCallback

__all__ = ["build_app", "main"]

PROG: Final = "ws-mode"
API_PATH: Final = "/v1/responses"
CACHE_AWARE_PATH: Final = "/cache-aware/v1/responses"
"""Where the demo server takes sockets for ``full_context="on_miss"``."""
WS_MARGIN: Final = 1024 * 1024
"""uvicorn's frame limit sits this far above ``Limits.max_message_bytes``, so an oversized
message reaches the middleware, which answers it with an error event instead of a 1009 close."""
LOG_LEVELS: Final = ("critical", "error", "warning", "info", "debug", "trace")
CLI_MODULES: Final = ("uvicorn", "httpx", "websockets", "rich")
CLI_EXTRA: Final = "'ws-mode[cli]'"
WARM_UP_TURNS: Final = 3


class CommandError(Exception):
    """A failure the command reports in one line and exits non-zero for."""


# ----------------------------------------------------------------------------- arguments


def _number(
    kind: type[int] | type[float], minimum: float, *, strict: bool = False
) -> Callable[[str], Any]:
    """An argparse type: a number of ``kind`` that is >= ``minimum`` (> when ``strict``)."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
            ) from None
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if value < minimum or (strict and value == minimum):
            relation = ">" if strict else ">="
            raise argparse.ArgumentTypeError(f"must be {relation} {minimum:g}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _port(text: str) -> int:
    value: int = _number(int, 0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is at most 65535, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``ws-mode`` argument parser."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="OpenAI's Responses API WebSocket mode for any HTTP Responses server.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the reference Responses server with WebSocket mode",
        description="Run the reference Responses server (a scripted, deterministic model) "
        "wrapped by WebSocketModeMiddleware under uvicorn: plain HTTP POST /v1/responses and "
        "WebSocket mode at ws://HOST:PORT/v1/responses.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    serve.add_argument(
        "--port", type=_port, default=8000, help="port to bind, 0 for any (default: %(default)s)"
    )
    serve.add_argument(
        "--full-context",
        choices=("always", "on_miss"),
        default="always",
        help="give the handler the whole history on every turn (always), or only the new "
        "items plus the cached Turn when the parent is cached (on_miss) (default: %(default)s)",
    )
    serve.add_argument(
        "--tool-calls",
        type=_number(int, 0),
        default=3,
        help="tool calls the model asks for before it answers (default: %(default)s)",
    )
    serve.add_argument(
        "--tokens-per-second",
        type=_number(float, 0),
        default=0.0,
        help="simulated generation speed, 0 for no delay (default: %(default)g)",
    )
    serve.add_argument(
        "--max-connection-seconds",
        type=_number(float, 0, strict=True),
        default=Limits().max_connection_seconds,
        help="close each socket after this long (default: %(default)g)",
    )
    serve.add_argument(
        "--log-level", choices=LOG_LEVELS, default="info", help="uvicorn's log level"
    )
    serve.set_defaults(run=_serve)
    _add_proxy_command(commands)

    demo = commands.add_parser(
        "demo",
        help="measure an agent rollout over HTTP and over WebSocket mode",
        description="Start the reference server on a free loopback port and run the same agent "
        "rollout three ways: HTTP with the full history, and WebSocket mode with "
        "full_context=always (drop-in) and on_miss (cache-aware). Prints what each cost.",
    )
    demo.add_argument(
        "--turns",
        type=_number(int, 1),
        default=24,
        help="model calls in the rollout; the model asks for a tool on all but the last "
        "(default: %(default)s)",
    )
    demo.add_argument(
        "--tool-output-bytes",
        type=_number(int, 0),
        default=4096,
        help="size of each tool output the client sends (default: %(default)s)",
    )
    demo.add_argument(
        "--tokens-per-second",
        type=_number(float, 0),
        default=0.0,
        help="simulated generation speed, 0 for no delay: the rollout then measures only the "
        "API plumbing (default: %(default)g)",
    )
    demo.add_argument(
        "--no-progress", action="store_true", help="no progress bars (also off when not a TTY)"
    )
    demo.set_defaults(run=_demo)
    _add_bench_command(commands)
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
    missing = [name for name in CLI_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        print(
            f"{PROG}: error: this command needs {', '.join(missing)}; "
            f"install them with: pip install {CLI_EXTRA}",
            file=sys.stderr,
        )
        return 1
    try:
        return run(args)
    except CommandError as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130


# ----------------------------------------------------------------------------- apps


def build_app(
    *,
    tool_calls: int = 3,
    tokens_per_second: float = 0.0,
    full_context: FullContext = "always",
    limits: Limits | None = None,
) -> WebSocketModeMiddleware:
    """The reference Responses server wrapped by the middleware, as ``ws-mode serve`` runs it.

    Its :class:`~ws_mode.reference.ReferenceStats` are on ``app.app.state.reference_stats``.
    """
    from .reference import ReferenceConfig, create_app

    reference = create_app(
        ReferenceConfig(tool_calls=tool_calls, tokens_per_second=tokens_per_second)
    )
    return WebSocketModeMiddleware(reference, full_context=full_context, limits=limits)


def _demo_app(reference: Starlette) -> WebSocketModeMiddleware:
    """Both middleware modes in front of one reference app: sockets at ``/v1/responses`` get
    ``full_context="always"``, sockets at ``CACHE_AWARE_PATH`` ``"on_miss"``; plain HTTP goes
    to the reference app through both."""
    drop_in = WebSocketModeMiddleware(reference, path=API_PATH, full_context="always")
    return WebSocketModeMiddleware(
        drop_in, path=CACHE_AWARE_PATH, handler_path=API_PATH, full_context="on_miss"
    )


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


# ----------------------------------------------------------------------------- serve


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    limits = Limits(max_connection_seconds=args.max_connection_seconds)
    app = build_app(
        tool_calls=args.tool_calls,
        tokens_per_second=args.tokens_per_second,
        full_context=args.full_context,
        limits=limits,
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        ws_max_size=limits.max_message_bytes + WS_MARGIN,
    )
    host = _url_host(args.host)
    full_context = args.full_context

    def banner(origin: str) -> str:
        return (
            f"{PROG} serve: WebSocket mode (full_context={full_context}) at "
            f"ws://{origin}{API_PATH}; openai SDK: "
            f'OpenAI(base_url="http://{origin}/v1", api_key="unused")'
        )

    _run_server(config, args.port, banner, f"the server could not start on {host}:{args.port}")
    return 0


def _run_server(
    config: uvicorn.Config, port: int, banner: Callable[[str], str], failure: str
) -> None:
    """Run uvicorn, draining WebSocket mode on shutdown; print `banner(origin)` once bound."""
    from .server import Server

    host = _url_host(config.host)

    class AnnouncingServer(Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                print(banner(f"{host}:{_bound_port(self, port)}"), flush=True)

    try:
        AnnouncingServer(config).run()
    except SystemExit as exc:  # uvicorn exits 1 when it cannot bind or start
        if exc.code:
            raise CommandError(failure) from None
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the Ctrl-C it shut down for


# ----------------------------------------------------------------------------- bench


def _add_bench_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .bench import configure_parser

    bench = commands.add_parser(
        "bench",
        help="benchmark HTTP against WebSocket mode (drop-in and cache-aware)",
        description="Run an agent rollout against the reference server over HTTP with the "
        "full history and over WebSocket mode (full_context=always, and on_miss with a "
        "renderer), with the model at zero cost and at the configured speed, interleaved and "
        "repeated, the server in its own process; print medians, the event-forwarding "
        "microbenchmark and the goals.",
    )
    configure_parser(bench)
    bench.set_defaults(run=_bench)


def _bench(args: argparse.Namespace) -> int:
    from .bench import BenchError, run_from_args

    try:
        return run_from_args(args)
    except BenchError as exc:
        raise CommandError(str(exc)) from exc


# ----------------------------------------------------------------------------- proxy

UPSTREAM_KEY_ENV: Final = "WS_MODE_UPSTREAM_API_KEY"


def _add_proxy_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    proxy = commands.add_parser(
        "proxy",
        help="give WebSocket mode to a remote HTTP Responses server",
        description="Forward every HTTP request to an upstream Responses server (vLLM, Ollama, "
        "LiteLLM, OpenAI), streaming both ways, with WebSocket mode at "
        "ws://HOST:PORT/v1/responses in front. See docs/proxy.md.",
    )
    proxy.add_argument(
        "--upstream",
        required=True,
        metavar="URL",
        help="the upstream's base URL, like the openai SDK's base_url: "
        "http://localhost:8000/v1 stands for the client's /v1",
    )
    proxy.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    proxy.add_argument(
        "--port", type=_port, default=8000, help="port to bind, 0 for any (default: %(default)s)"
    )
    proxy.add_argument(
        "--api-key",
        metavar="KEY",
        help=f"send 'Authorization: Bearer KEY' upstream instead of the client's own "
        f"(default: ${UPSTREAM_KEY_ENV}, else the client's header passes through)",
    )
    proxy.add_argument(
        "--full-context",
        choices=("always", "on_miss"),
        default="always",
        help="send the upstream the whole history on every turn (always), or only the new "
        "items plus previous_response_id when the parent is cached (on_miss: only for "
        "upstreams that store responses) (default: %(default)s)",
    )
    proxy.add_argument(
        "--forward-uncached",
        action="store_true",
        help="forward a previous_response_id the socket has not cached to the upstream, to "
        "resolve from its own store, instead of answering previous_response_not_found",
    )
    proxy.add_argument(
        "--timeout",
        type=_number(float, 0, strict=True),
        default=600.0,
        help="seconds to wait for the upstream on each read (default: %(default)g)",
    )
    proxy.add_argument(
        "--log-level", choices=LOG_LEVELS, default="info", help="uvicorn's log level"
    )
    proxy.set_defaults(run=_proxy)


def _proxy(args: argparse.Namespace) -> int:
    import os

    import httpx
    import uvicorn

    from .errors import ConfigError
    from .proxy import create_proxy

    api_key: str | None = args.api_key or os.environ.get(UPSTREAM_KEY_ENV) or None
    try:
        upstream = create_proxy(
            args.upstream,
            api_key=api_key,
            timeout=httpx.Timeout(args.timeout, connect=min(args.timeout, 10.0)),
        )
    except ConfigError as exc:
        raise CommandError(str(exc)) from None
    limits = Limits()
    app = WebSocketModeMiddleware(
        upstream,
        full_context=args.full_context,
        on_cache_miss="forward" if args.forward_uncached else "error",
        limits=limits,
    )
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        lifespan="on",
        ws_max_size=limits.max_message_bytes + WS_MARGIN,
    )
    host = _url_host(args.host)
    auth = "the configured key" if api_key else "the client's Authorization"

    def banner(origin: str) -> str:
        return (
            f"{PROG} proxy: WebSocket mode at ws://{origin}{API_PATH}, forwarding to "
            f"{upstream.describe()} with {auth}; openai SDK: "
            f'OpenAI(base_url="http://{origin}/v1")'
        )

    _run_server(config, args.port, banner, f"the proxy could not start on {host}:{args.port}")
    return 0


# ----------------------------------------------------------------------------- demo


@contextlib.contextmanager
def _background_server(app: ASGIApp) -> Iterator[str]:
    """Run ``app`` under uvicorn on a free loopback port in a daemon thread; yield its origin.
    The server stops when the block exits (and dies with the process in any case)."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,  # uvicorn binds (with TCP_NODELAY on each connection); the OS picks the port
        log_level="warning",
        lifespan="off",
        ws_max_size=Limits().max_message_bytes + WS_MARGIN,
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    failures: list[BaseException] = []

    def run() -> None:
        try:
            server.run()
        except BaseException as exc:  # reported by the waiting thread
            failures.append(exc)

    thread = threading.Thread(target=run, name="ws-mode-demo-server", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 15.0
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                reason = f": {failures[0]!r}" if failures else ""
                raise CommandError(f"the demo server did not start{reason}")
            time.sleep(0.005)
        yield f"http://127.0.0.1:{_bound_port(server, 0)}"
    finally:
        server.should_exit = True
        thread.join(10.0)


def _bound_port(server: uvicorn.Server, default: int) -> int:
    """The port a started uvicorn server listens on (the chosen one when asked for 0)."""
    for listening in getattr(server, "servers", ()):  # set by startup()
        for listener in listening.sockets:
            port: int = listener.getsockname()[1]
            return port
    return default


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
        from .rollout import run_http, run_socket

        runner = run_http if self.transport == "http" else run_socket
        return runner(
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

    from .reference import ReferenceConfig, create_app
    from .rollout import RolloutError

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
        with _background_server(_demo_app(reference)) as base_url:
            console.print(
                f"{PROG} demo: one agent rollout of {turns} turns ({turns - 1} tool calls, "
                f"{_format_bytes(args.tool_output_bytes)} per tool output) against the reference "
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

    answers = {row.result.answer for row in measured}
    if len(answers) != 1:
        raise CommandError(
            "the modes got different answers, so the model saw different contexts: "
            + " | ".join(sorted(answers))
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


def _format_seconds(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 0.001:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds * 1_000_000:.0f} µs"


def _format_bytes(count: int) -> str:
    if count >= 1024 * 1024:
        return f"{count / (1024 * 1024):.2f} MiB"
    if count >= 1024:
        return f"{count / 1024:.1f} KiB"
    return f"{count} B"


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
            _format_seconds(result.total_seconds),
            _format_seconds(result.early_median()),
            _format_seconds(result.late_median()),
            _format_bytes(result.bytes_sent),
            _format_bytes(row.bytes_parsed),
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
        f"({_format_bytes(http.bytes_sent)} in {http.turns} turns); over the socket it sent only "
        f"the new tool outputs ({_format_bytes(always.bytes_sent)}, {bytes_ratio:.1f} times less).",
        f"With full_context=always (drop-in) the handler still parsed the whole history each turn "
        f"({_format_bytes(measured[1].bytes_parsed)}); with on_miss it parsed only the new items "
        f"({_format_bytes(measured[2].bytes_parsed)}) and took the rest from the cached Turn.",
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
                f", while HTTP's turns slowed from {_format_seconds(early)} to "
                f"{_format_seconds(late)} as the history grew."
            )
        else:
            timing += "."
    else:
        timing += (
            f": re-sending a {_format_bytes(http.turn_bytes[-1])} history costs HTTP little on "
            "loopback and one short rollout is noisy; the gap grows with the history "
            "(try --turns 60 --tool-output-bytes 32768)."
        )
    lines.append(
        timing + " All three modes got the same answer, so the model saw the same context."
    )
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
