"""What one ``ws-mode bench`` run does: its options, the modes it compares, the speeds it runs.

:class:`BenchOptions` is the scenario and the method (the command's flags,
:func:`configure_parser` and :func:`options_from_args`); :data:`MODES` the three ways of
running the rollout against the reference server (:mod:`ws_mode.toolkit.bench.rollout`;
``--proxy`` and ``--url`` compare others: :mod:`ws_mode.toolkit.bench.proxy`,
:mod:`ws_mode.toolkit.bench.url`); :class:`BenchError` the one-line failure every ``ws-mode
bench`` module raises.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Final, Literal
from urllib.parse import urlsplit

from ws_mode._install import install_hint

from ..args import number
from ..measure import format_seconds

if TYPE_CHECKING:
    from ..link import LinkSpec

__all__ = [
    "API_KEY_ENV",
    "MODES",
    "PROXY_TURNS",
    "URL_REPEAT",
    "URL_TURNS",
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
    """One way of running the rollout: its key (a name, and for :data:`MODES` its server
    path), its label and its transport."""

    key: str
    label: str
    transport: Literal["http", "socket"]


PROXY_TURNS: Final = 32
"""``--turns`` with ``--proxy``: 4 KiB tool outputs pass 100 KB of history at turn 25."""
URL_TURNS: Final = 8
URL_REPEAT: Final = 3
"""``--turns`` and ``--repeat`` with ``--url``: every turn is a call to a real model."""
API_KEY_ENV: Final = "OPENAI_API_KEY"

MODES: Final = (
    Mode("http", "HTTP", "http"),
    Mode("always", "WS drop-in", "socket"),
    Mode("on_miss", "WS cache-aware", "socket"),
)


@dataclass(frozen=True)
class BenchOptions:
    """A benchmark run's scenario and method (the ``ws-mode bench`` flags). With ``check``,
    the report also compares the measurements with the project's goals
    (:mod:`ws_mode.toolkit.bench.goals`). ``link`` (a :class:`~ws_mode.toolkit.link.LinkSpec` as
    text) puts a relay between every client and the server; ``proxy`` runs the proxy comparison and
    ``url`` the one against a server of the user's (``model``, ``headers`` as ``Name: value``,
    ``api_key``; ``socket_paths`` the socket paths measured there, under the URL's base as
    ``/v1/responses`` is, which is the one measured without them)."""

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
    link: str | None = None
    proxy: bool = False
    url: str | None = None
    model: str | None = None
    headers: tuple[str, ...] = ()
    api_key: str | None = None
    socket_paths: tuple[str, ...] = ()

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
        self.link_spec()
        self._validate_modes()
        if self.plot is not None:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise BenchError(
                    f"--plot needs matplotlib: pip install matplotlib (or {install_hint('bench')})"
                ) from None

    def _validate_modes(self) -> None:
        if self.proxy and self.url is not None:
            raise BenchError("--proxy and --url are different comparisons: choose one")
        alone = self.proxy or self.url is not None
        if alone and self.concurrency != 1:
            raise BenchError("--proxy and --url measure one rollout at a time: --concurrency 1")
        if alone and self.plot is not None:
            raise BenchError("--plot draws the reference modes only: not with --proxy or --url")
        if self.url is None:
            if (
                self.model is not None
                or self.headers
                or self.api_key is not None
                or self.socket_paths
            ):
                raise BenchError("--model, --header, --api-key and --socket-path go with --url")
            return
        scheme = urlsplit(self.url).scheme
        if scheme not in ("http", "https") or not urlsplit(self.url).hostname:
            raise BenchError(f"--url must be an http:// or https:// URL, got {self.url!r}")
        if self.link is not None and scheme == "https":
            raise BenchError("--link relays plain TCP to http:// servers only, not https://")
        if not self.model:
            raise BenchError("--url needs --model: the model your server serves")
        if self.profile is not None or self.check:
            raise BenchError("--profile and --check measure the reference servers: not with --url")
        for path in self.socket_paths:
            if not path.startswith("/") or any(c.isspace() or c in "?#" for c in path):
                raise BenchError(f"--socket-path must be a path starting with /, got {path!r}")
        if len(set(self.socket_paths)) != len(self.socket_paths):
            raise BenchError("--socket-path: each path once")
        self.request_headers()

    def link_spec(self) -> LinkSpec | None:
        """The ``link`` as a :class:`~ws_mode.toolkit.link.LinkSpec` (None without one);
        BenchError when it does not parse."""
        if self.link is None:
            return None
        from ..link import LinkSpec

        try:
            return LinkSpec.parse(self.link)
        except ValueError as exc:
            raise BenchError(f"--link: {exc}") from None

    def request_headers(self) -> dict[str, str]:
        """The headers every ``--url`` request carries: ``headers``, and ``Authorization:
        Bearer api_key`` unless a header sets Authorization; BenchError for one that is not
        ``Name: value``."""
        headers: dict[str, str] = {}
        for text in self.headers:
            name, colon, value = text.partition(":")
            if not colon or not name.strip() or any(c.isspace() for c in name.strip()):
                raise BenchError(f"--header must be 'Name: value', got {text!r}")
            headers[name.strip()] = value.strip()
        if self.api_key and not any(name.lower() == "authorization" for name in headers):
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def public(self) -> dict[str, Any]:
        """The options as JSON, with the API key and the header values left out."""
        fields = asdict(self)
        fields["api_key"] = None if self.api_key is None else "***"
        fields["headers"] = [text.partition(":")[0] + ": ***" for text in self.headers]
        return fields


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
        default=None,
        help=f"model calls per rollout, the last one answering (default: {defaults.turns}; "
        f"{PROXY_TURNS} with --proxy, so the history passes 100 KB; {URL_TURNS} with --url)",
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
        default=None,
        help=f"repetitions; every number is their median (default: {defaults.repeat}; "
        f"{URL_REPEAT} with --url)",
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
    parser.add_argument(
        "--link",
        metavar="rtt=30ms,up=10mbit,down=50mbit",
        type=_link_text,
        help="put a relay that adds this round-trip time and limits these rates between "
        "every client and the server it measures (every mode alike; the stats routes stay "
        "direct)",
    )
    parser.add_argument(
        "--proxy",
        action="store_true",
        help="measure ws-mode proxy instead: direct HTTP to an upstream reference server "
        "against the socket (and HTTP) through the proxy, each in its own process",
    )
    parser.add_argument(
        "--url",
        metavar="URL",
        help="measure your own server instead: HTTP with the full history (POST "
        "URL/v1/responses) against WebSocket mode (ws(s)://.../v1/responses)",
    )
    parser.add_argument("--model", help="with --url: the model of every request (required)")
    parser.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="'Name: value'",
        help="with --url: a header for every request and the socket's handshake (repeatable)",
    )
    parser.add_argument(
        "--api-key",
        metavar="KEY",
        help=f"with --url: send 'Authorization: Bearer KEY' (default: ${API_KEY_ENV})",
    )
    parser.add_argument(
        "--socket-path",
        action="append",
        default=[],
        metavar="PATH",
        help="with --url: a socket to measure at this path under the URL's base (repeatable: "
        "one per middleware, e.g. /v1/responses and /cache-aware/v1/responses for both modes; "
        "default: /v1/responses)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _link_text(text: str) -> str:
    """An argparse type: a ``--link`` that parses, kept as given."""
    from ..link import LinkSpec

    try:
        LinkSpec.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """The :class:`BenchOptions` of parsed ``ws-mode bench`` arguments."""
    defaults = BenchOptions()
    turns = defaults.turns
    if args.proxy:
        turns = PROXY_TURNS
    elif args.url is not None:
        turns = URL_TURNS
    api_key: str | None = args.api_key
    if api_key is None and args.url is not None:
        api_key = os.environ.get(API_KEY_ENV) or None
    return BenchOptions(
        turns=turns if args.turns is None else args.turns,
        tool_output_bytes=args.tool_output_bytes,
        tokens_per_second=args.tokens_per_second,
        time_to_first_token=args.time_to_first_token,
        concurrency=args.concurrency,
        repeat=(URL_REPEAT if args.url else defaults.repeat)
        if args.repeat is None
        else args.repeat,
        warmup=args.warmup,
        forward_events=args.forward_events,
        forward_batch=args.forward_batch,
        plot=args.plot,
        json=args.json,
        profile=args.profile,
        check=args.check,
        link=args.link,
        proxy=args.proxy,
        url=args.url,
        model=args.model,
        headers=tuple(args.header),
        api_key=api_key,
        socket_paths=tuple(args.socket_path),
    )
