"""``ws-mode bench --url URL``: does WebSocket mode help *your* server?

Against any Responses server with :class:`~ws_mode.WebSocketModeMiddleware` in front of its
handler, :func:`run_url_bench` runs the same conversation two ways, interleaved and repeated
after a warm-up: HTTP with the full history every turn (``POST URL/v1/responses``, streamed)
and WebSocket mode (``ws(s)://…/v1/responses``, only the new items). The conversation is the
tools' rollout (:mod:`ws_mode.toolkit.rollout`) as a conversation: a user message, the function
calls the model asks for (each answered with a synthetic output of ``--tool-output-bytes``),
and when the model answers, the next user message (:data:`FOLLOW_UPS`), up to ``--turns``
model calls. Nothing is assumed of the model: it may call tools or not.

Before any model call it checks that the server can be reached and that the socket's handshake
is accepted, so a server without WebSocket mode (426), wrong credentials (401) or a wrong URL
fail at once, in words (:func:`explain`). :func:`format_url_report` prints the
:class:`UrlReport`; ``--json`` writes :func:`url_report_json`.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from ws_mode.testing._client import DEFAULT_PATH, api_base, socket_url

from ..measure import format_bytes, format_seconds, median
from .control import linked
from .options import BenchError, BenchOptions, Mode
from .rollout import format_ratio, rotated, table, windows

if TYPE_CHECKING:
    from ..rollout import RolloutResult

__all__ = [
    "FOLLOW_UPS",
    "URL_MODES",
    "UrlReport",
    "UrlSummary",
    "api_base",
    "explain",
    "format_url_report",
    "run_url_bench",
    "save_url",
    "url_report_json",
]

URL_MODES: Final = (
    Mode("http", "HTTP (full history)", "http"),
    Mode("socket", "WebSocket mode", "socket"),
)
FOLLOW_UPS: Final = (
    "Now read the tests that cover it and say what they check.",
    "Which part would you change first, and why? Read what you need.",
    "Summarize what you found in three sentences.",
)
"""The user messages that follow each answer of the model, in turn."""
CONNECT_SECONDS: Final = 10.0
TURN_SECONDS: Final = 120.0


def explain(status: int | None, where: str, detail: str) -> str:
    """What a refusal means for the user: 426 (WebSocket mode is off), 401 / 403
    (credentials), others as they came."""
    if status == 426:
        return (
            f"WebSocket mode is not enabled at {where}: the server answered HTTP 426 (Upgrade "
            "Required): put ws_mode's WebSocketModeMiddleware in front of your handler, or "
            f"switch it on (enabled=True); {detail}"
        )
    if status in (401, 403):
        return (
            f"the server refused the credentials at {where} (HTTP {status}): pass --api-key KEY "
            f"(or set OPENAI_API_KEY) or --header 'Authorization: ...'; {detail}"
        )
    if status == 404:
        return f"nothing answers at {where} (HTTP 404): check --url; {detail}"
    return detail


def _reachable(base: str) -> None:
    parts = urlsplit(base)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        raise BenchError(f"cannot reach {host}:{port} ({base}): {exc}") from None


def _handshake(base: str, headers: Mapping[str, str]) -> None:
    """Open a socket and close it: the handshake is accepted, or a BenchError says why."""
    from ..rollout import RolloutError, check_socket

    try:
        check_socket(base, headers=headers, timeout=CONNECT_SECONDS)
    except RolloutError as exc:
        raise BenchError(explain(exc.status, socket_url(base), str(exc))) from None


@dataclass
class UrlSummary:
    """One mode's medians over the repetitions: a conversation's wall time, each turn's,
    the early and late windows, the bytes sent and the tool calls the model made."""

    mode: str
    label: str
    end_to_end: float
    turn_curve: list[float]
    early: float
    late: float
    bytes_sent: float
    tool_calls: float


@dataclass
class UrlReport:
    """Everything one ``--url`` run measured."""

    options: BenchOptions
    base: str
    link: str | None
    summaries: list[UrlSummary]
    seconds: float

    @property
    def ratio(self) -> float:
        """WebSocket mode's end-to-end time / HTTP's."""
        http, socket_mode = self.summaries
        return socket_mode.end_to_end / http.end_to_end


def _summarize(mode: Mode, results: list[RolloutResult], turns: int) -> UrlSummary:
    curve = [median([result.turn_seconds[index] for result in results]) for index in range(turns)]
    early, late = windows(turns)
    return UrlSummary(
        mode=mode.key,
        label=mode.label,
        end_to_end=median([result.total_seconds for result in results]),
        turn_curve=curve,
        early=median(curve[early]),
        late=median(curve[late]),
        bytes_sent=median([result.bytes_sent for result in results]),
        tool_calls=median([result.tool_calls for result in results]),
    )


def run_url_bench(
    options: BenchOptions, *, progress: Callable[[str], None] | None = None
) -> UrlReport:
    """Run the conversation over HTTP and over WebSocket mode against ``options.url``,
    interleaved; the medians. BenchError, in words, when the server cannot be used."""
    from ..rollout import RolloutError, run_rollout

    options.validate()
    say = progress or (lambda message: None)
    base = api_base(str(options.url))
    headers = options.request_headers()
    link = options.link_spec()
    started = time.perf_counter()
    _reachable(base)
    results: dict[str, list[RolloutResult]] = {mode.key: [] for mode in URL_MODES}
    with linked(link, base) as client_base:
        _handshake(client_base, headers)

        def one(mode: Mode) -> RolloutResult:
            try:
                return run_rollout(
                    mode.transport,
                    client_base,
                    turns=options.turns,
                    tool_output_bytes=options.tool_output_bytes,
                    model=str(options.model),
                    headers=headers,
                    timeout=TURN_SECONDS,
                    follow_ups=FOLLOW_UPS,
                )
            except RolloutError as exc:
                where = socket_url(base) if mode.transport == "socket" else base + DEFAULT_PATH
                raise BenchError(explain(exc.status, where, str(exc))) from None

        if options.warmup:
            say("warming up")
        for _ in range(options.warmup):
            for mode in URL_MODES:
                one(mode)
        for repetition in range(options.repeat):
            say(f"repetition {repetition + 1}/{options.repeat}")
            for mode in rotated(URL_MODES, repetition):
                results[mode.key].append(one(mode))
    return UrlReport(
        options=options,
        base=base,
        link=link.describe() if link else None,
        summaries=[_summarize(mode, results[mode.key], options.turns) for mode in URL_MODES],
        seconds=time.perf_counter() - started,
    )


def _verdict(report: UrlReport) -> str:
    http, socket_mode = report.summaries
    saved = http.end_to_end - socket_mode.end_to_end
    turns = report.options.turns
    if report.ratio < 0.95:
        what = (
            f"helps: it saved {format_seconds(saved)} per conversation "
            f"({format_seconds(saved / turns)} per model call)"
        )
    elif report.ratio > 1.05:
        what = f"was slower here, by {format_seconds(-saved)} per conversation"
    else:
        what = "made no difference beyond the noise (within 5%)"
    return (
        f"WebSocket mode took {report.ratio:.2f} of HTTP's time: it {what}, and sent "
        f"{format_ratio(socket_mode.bytes_sent, http.bytes_sent, 3)} of HTTP's bytes. The "
        "saving grows with the history (turns, tool output sizes) and the client's distance."
    )


def format_url_report(report: UrlReport) -> list[str]:
    """The report as lines of text."""
    options = report.options
    http = report.summaries[0]
    early, late = windows(options.turns)
    lines = [
        f"ws-mode bench --url {report.base}: a conversation of {options.turns} model calls "
        f"(model {options.model}; user messages, and the function calls the model makes, "
        f"each answered with {format_bytes(options.tool_output_bytes)} of synthetic output), "
        f"HTTP with the full history (POST {report.base}{DEFAULT_PATH}, streamed) against "
        f"WebSocket mode ({socket_url(report.base)}, only the new items); median of "
        f"{options.repeat} repetitions, modes interleaved (order rotated).",
        f"Early / late turn: median of turns {early.start + 1}-{early.stop} / "
        f"{late.start + 1}-{late.stop} (send to terminal event). sent: bytes the client sent.",
    ]
    if report.link is not None:
        lines.append(
            f"Link: the client reaches the server through a relay modelling {report.link}."
        )
    cells = [
        [
            row.label,
            format_seconds(row.end_to_end),
            format_ratio(row.end_to_end, http.end_to_end),
            format_seconds(row.early),
            format_seconds(row.late),
            format_bytes(row.bytes_sent),
            format_ratio(row.bytes_sent, http.bytes_sent, 3),
            f"{row.tool_calls:g}",
        ]
        for row in report.summaries
    ]
    headers = ["mode", "end-to-end", "/HTTP", "early turn", "late turn", "sent", "/HTTP"]
    lines += ["", *table([*headers, "tool calls"], cells), "", _verdict(report)]
    lines.append(f"({report.seconds:.0f} s)")
    return lines


def url_report_json(report: UrlReport) -> dict[str, Any]:
    """The report as plain JSON (no API key, no header values)."""
    return {
        "options": report.options.public(),
        "base": report.base,
        "link": report.link,
        "seconds": report.seconds,
        "ratio": report.ratio,
        "summaries": [asdict(row) for row in report.summaries],
    }


def save_url(report: UrlReport) -> None:
    """Write the JSON ``options.json`` asks for."""
    if report.options.json is not None:
        text = json.dumps(url_report_json(report), indent=2)
        Path(report.options.json).write_text(text + "\n")
