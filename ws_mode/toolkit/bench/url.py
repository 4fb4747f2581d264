"""``ws-mode bench --url URL``: does WebSocket mode help *your* server?

Against any Responses server with :class:`~ws_mode.WebSocketModeMiddleware` in front of its
handler, :func:`run_url_bench` runs the same conversation two ways, interleaved and repeated
after a warm-up: HTTP with the full history every turn (``POST URL/v1/responses``, streamed)
and WebSocket mode (``ws(s)://…/v1/responses``, only the new items; ``--socket-path`` measures
other socket paths instead, one per middleware, so both modes run in one bench). The
conversation is the tools' rollout (:mod:`ws_mode.toolkit.rollout`) as a conversation: a user
message, the function calls the model asks for (each answered with a synthetic output of
``--tool-output-bytes``), and when the model answers, the next user message
(:data:`FOLLOW_UPS`), up to ``--turns`` model calls.

Before any model call it checks that the server can be reached and that each socket's
handshake is accepted, and reads the mode the middleware names on its answer (the
``x-ws-mode-full-context`` header: ``always``, ``on_miss``, or ``unknown`` when the server does
not say). A refused handshake is explained in ``ws-mode check``'s words
(:func:`~ws_mode.toolkit.check.basic.explain_refusal`). After the runs it checks that the
socket's answers are HTTP's (:func:`~ws_mode.toolkit.rollout.rollout_difference`), says when the
model called no tool, and shows the spread of the repetitions, warning when HTTP's and a
socket's ranges overlap (:func:`cautions`). :func:`format_url_report` prints the
:class:`UrlReport`; ``--json`` writes :func:`url_report_json`.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal
from urllib.parse import urlsplit

from ws_mode._protocol import FULL_CONTEXT_HEADER
from ws_mode.testing._client import DEFAULT_PATH, SocketClosed, api_base, socket_url

from ..agent import DEFAULT_TOOLS
from ..measure import Spread, format_bytes, format_seconds, median
from .control import linked
from .options import BenchError, BenchOptions
from .rollout import format_ratio, rotated, table, windows

if TYPE_CHECKING:
    from ..rollout import RolloutError, RolloutResult

__all__ = [
    "FOLLOW_UPS",
    "UNKNOWN_MODE",
    "UrlMode",
    "UrlReport",
    "UrlSummary",
    "api_base",
    "cautions",
    "explain",
    "format_url_report",
    "run_url_bench",
    "save_url",
    "summarize",
    "url_report_json",
]

FOLLOW_UPS: Final = (
    "Now read the tests that cover it and say what they check.",
    "Which part would you change first, and why? Read what you need.",
    "Summarize what you found in three sentences.",
)
"""The user messages that follow each answer of the model, in turn."""
UNKNOWN_MODE: Final = "unknown"
"""The mode printed for a socket whose handshake's answer does not name one."""
CONNECT_SECONDS: Final = 10.0
TURN_SECONDS: Final = 120.0
_HEADER_NAME: Final = FULL_CONTEXT_HEADER.decode()


@dataclass(frozen=True)
class UrlMode:
    """One way the bench runs the conversation: over HTTP, or over the socket at ``path``
    (under the URL's base) whose middleware runs in ``full_context`` (``always``,
    ``on_miss``, or :data:`UNKNOWN_MODE`)."""

    key: str
    transport: Literal["http", "socket"]
    path: str = DEFAULT_PATH
    full_context: str = UNKNOWN_MODE

    @property
    def label(self) -> str:
        """The mode as the report's table names it."""
        if self.transport == "http":
            return "HTTP (full history)"
        return f"WebSocket mode ({self.full_context})"


HTTP_MODE: Final = UrlMode("http", "http")


def explain(status: int | None, where: str, detail: str) -> str:
    """What an HTTP request's refusal means for the user: 401 / 403 (credentials), 404 (the
    URL), others as they came. A refused socket is explained by ``ws-mode check``'s
    :func:`~ws_mode.toolkit.check.basic.explain_refusal` instead."""
    if status in (401, 403):
        from ..check.results import HINTS

        return f"POST {where} was refused (HTTP {status}): {HINTS['credentials']} {detail}"
    if status == 404:
        return f"nothing answers at POST {where} (HTTP 404): check --url; {detail}"
    return detail


def _refused(exc: RolloutError, mode: UrlMode, base: str) -> BenchError:
    """A rollout's failure in words: a refused socket as ``ws-mode check`` words it."""
    from websockets.exceptions import InvalidHandshake, InvalidURI

    from ..check.basic import explain_refusal

    if mode.transport == "socket":
        where = socket_url(base, mode.path)
        cause = exc.__cause__
        # The socket did not open (a closed socket is an OSError too, but it had opened).
        if isinstance(cause, InvalidHandshake | InvalidURI) or (
            isinstance(cause, OSError) and not isinstance(cause, SocketClosed)
        ):
            detail, hint = explain_refusal(cause)
            return BenchError(f"the WebSocket at {where} did not open: {detail}. {hint}")
        return BenchError(str(exc))
    return BenchError(explain(exc.status, base + DEFAULT_PATH, str(exc)))


def _reachable(base: str) -> None:
    parts = urlsplit(base)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        raise BenchError(f"cannot reach {host}:{port} ({base}): {exc}") from None


def _handshake(base: str, path: str, headers: Mapping[str, str]) -> str:
    """Open the socket at ``base + path`` and close it, sending nothing; the mode its
    handshake's answer names (:data:`UNKNOWN_MODE` when it names none). A refused handshake is
    a BenchError in ``ws-mode check``'s words."""
    from websockets.exceptions import InvalidHandshake, InvalidURI

    from ws_mode.testing._client import connect

    from ..check.basic import explain_refusal

    try:
        with connect(base, path, headers=headers, open_timeout=CONNECT_SECONDS) as opened:
            response = opened.connection.response
    except (InvalidHandshake, InvalidURI, OSError) as exc:
        detail, hint = explain_refusal(exc)
        where = socket_url(base, path)
        raise BenchError(f"the WebSocket at {where} did not open: {detail}. {hint}") from None
    said = response.headers.get(_HEADER_NAME) if response is not None else None
    return said if said in ("always", "on_miss") else UNKNOWN_MODE


@dataclass
class UrlSummary:
    """One mode's figures over the repetitions: the spread of a conversation's wall time
    (``end_to_end`` its median), each turn's median, the early and late windows, the bytes
    sent and the tool calls the model made (medians); ``path`` and ``full_context`` say which
    socket (HTTP's are the URL's path and None)."""

    mode: str
    label: str
    end_to_end: float
    spread: Spread
    turn_curve: list[float]
    early: float
    late: float
    bytes_sent: float
    tool_calls: float
    path: str = DEFAULT_PATH
    full_context: str | None = None
    #: The share of input tokens the server read from its prompt cache (its usage's
    #: `cached_tokens / input_tokens`, medians over the repetitions): on the continuations, and
    #: on the first turn, which has nothing to hit; None when the server reported none.
    cached: float | None = None
    cached_first: float | None = None


@dataclass
class UrlReport:
    """Everything one ``--url`` run measured: a summary per mode (HTTP first), how the
    socket's answers compared with HTTP's (``mismatches``, which fail the run; ``notes``)."""

    options: BenchOptions
    base: str
    link: str | None
    summaries: list[UrlSummary]
    seconds: float
    mismatches: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        """The first socket's end-to-end time / HTTP's."""
        return self.summaries[1].end_to_end / self.summaries[0].end_to_end


def summarize(mode: UrlMode, results: Sequence[RolloutResult], turns: int) -> UrlSummary:
    """One mode's :class:`UrlSummary` of its repetitions' results."""
    curve = [
        median([result.turn_seconds[index] for result in results if index < result.turns])
        for index in range(turns)
    ]
    early, late = windows(turns)
    spread = Spread.of(result.total_seconds for result in results)
    return UrlSummary(
        mode=mode.key,
        label=mode.label,
        end_to_end=spread.median,
        spread=spread,
        turn_curve=curve,
        early=median(curve[early]),
        late=median(curve[late]),
        bytes_sent=median([result.bytes_sent for result in results]),
        tool_calls=median([result.tool_calls for result in results]),
        path=mode.path,
        full_context=mode.full_context if mode.transport == "socket" else None,
        cached=_median_share([result.cache_share(continuations=True) for result in results]),
        cached_first=_median_share([result.cache_share(continuations=False) for result in results]),
    )


def _median_share(shares: Sequence[float | None]) -> float | None:
    reported = [share for share in shares if share is not None]
    return median(reported) if reported else None


def _cached(row: UrlSummary) -> str:
    """The prompt-cache column: the continuations' share, the first turn's after it."""
    if row.cached is None:
        return "-"
    first = "-" if row.cached_first is None else f"{row.cached_first:.2f}"
    return f"{row.cached:.2f} (first {first})"


def cautions(summaries: Sequence[UrlSummary], repeat: int) -> list[str]:
    """What keeps the figures from concluding: one repetition (no spread to judge by), or a
    socket whose range of end-to-end times overlaps HTTP's (the difference is within the
    runs' own spread), and a model that made no tool call."""
    http, *sockets = summaries
    lines: list[str] = []
    if repeat < 2:
        lines.append(
            "Warning: one repetition shows no spread, so nothing tells its difference from "
            "noise: run --repeat 5 or more."
        )
    else:
        for row in sockets:
            if row.spread.overlaps(http.spread):
                lines.append(
                    f"Warning: the ranges of HTTP ({_range(http.spread)}) and {row.label} "
                    f"({_range(row.spread)}) overlap: the difference between them is within "
                    f"the spread of these {repeat} repetitions, so it may be noise. Run more "
                    "(--repeat), on a quieter machine, before concluding."
                )
    if all(row.tool_calls == 0 for row in summaries):
        tool = DEFAULT_TOOLS[0]["name"]
        lines.append(
            f"The model made no tool call: the rollout needs a model that calls the tool the "
            f"bench offers ({tool}), so that tool outputs build up the history as an agent's "
            "do. Without one, every model call is a single turn answering a user message, and "
            "these figures measure single turns, not an agent's loop: pass --model with a "
            "model that calls tools."
        )
    return lines


def _range(spread: Spread) -> str:
    return f"{format_seconds(spread.low)}-{format_seconds(spread.high)}"


def compare_answers(
    http_runs: Sequence[RolloutResult], socket_runs: Mapping[UrlMode, Sequence[RolloutResult]]
) -> tuple[list[str], list[str]]:
    """Whether each socket's answers are HTTP's: the mismatches and the notes. A socket that
    answered differently is a mismatch when HTTP answered the same way in its two or more
    runs; when HTTP's own runs differ the model is not deterministic and nothing is compared."""
    from ..rollout import rollout_difference

    first, *others = http_runs
    unstable = next(
        (found for run in others if (found := rollout_difference(first, run)) is not None), None
    )
    mismatches: list[str] = []
    notes: list[str] = []
    for mode, runs in socket_runs.items():
        found = next(
            (found for run in runs if (found := rollout_difference(first, run)) is not None), None
        )
        if found is None:
            continue
        where = f"{mode.label} at {mode.path}"
        if unstable is not None:
            notes.append(
                f"Answers not compared for {where}: the model answers differently from one run "
                f"to the next (HTTP's own runs differ: {unstable.splitlines()[0]}), so the "
                "socket's answers cannot be held to HTTP's."
            )
        elif not others:
            notes.append(
                f"{where} answered differently from HTTP's one run ({found.splitlines()[0]}); "
                "with one HTTP run a model that is not deterministic looks the same: run "
                "--repeat 2 or more to tell."
            )
        else:
            hint = ""
            if mode.full_context == "on_miss":
                hint = (
                    "\nfull_context='on_miss': on a cache hit the handler gets only the new "
                    "input; a handler that is not cache-aware needs 'always' (docs/handlers.md)"
                )
            mismatches.append(
                f"{where}: the socket's answers differ from HTTP's for the same conversation "
                f"(HTTP answered the same way {len(http_runs)} times): {found}{hint}"
            )
    return mismatches, notes


def run_url_bench(
    options: BenchOptions, *, progress: Callable[[str], None] | None = None
) -> UrlReport:
    """Run the conversation over HTTP and over each socket path against ``options.url``,
    interleaved; the spread of each mode and how the answers compared. BenchError, in words,
    when the server cannot be used."""
    from ..rollout import RolloutError, run_rollout

    options.validate()
    say = progress or (lambda message: None)
    base = api_base(str(options.url))
    headers = options.request_headers()
    link = options.link_spec()
    started = time.perf_counter()
    _reachable(base)
    paths = options.socket_paths or (DEFAULT_PATH,)
    with linked(link, base) as client_base:
        modes = [HTTP_MODE]
        for index, path in enumerate(paths):
            key = "socket" if index == 0 else f"socket_{index + 1}"
            modes.append(UrlMode(key, "socket", path, _handshake(client_base, path, headers)))
        runs: dict[UrlMode, list[RolloutResult]] = {mode: [] for mode in modes}
        measured: dict[UrlMode, list[RolloutResult]] = {mode: [] for mode in modes}

        def one(mode: UrlMode) -> RolloutResult:
            try:
                result = run_rollout(
                    mode.transport,
                    client_base,
                    turns=options.turns,
                    tool_output_bytes=options.tool_output_bytes,
                    model=str(options.model),
                    headers=headers,
                    timeout=TURN_SECONDS,
                    follow_ups=FOLLOW_UPS,
                    path=mode.path,
                )
            except RolloutError as exc:
                raise _refused(exc, mode, base) from None
            runs[mode].append(result)
            return result

        if options.warmup:
            say("warming up")
        for _ in range(options.warmup):
            for mode in modes:
                one(mode)
        for repetition in range(options.repeat):
            say(f"repetition {repetition + 1}/{options.repeat}")
            for mode in rotated(modes, repetition):
                measured[mode].append(one(mode))
    mismatches, notes = compare_answers(runs[HTTP_MODE], {mode: runs[mode] for mode in modes[1:]})
    return UrlReport(
        options=options,
        base=base,
        link=link.describe() if link else None,
        summaries=[summarize(mode, measured[mode], options.turns) for mode in modes],
        seconds=time.perf_counter() - started,
        mismatches=mismatches,
        notes=notes,
    )


def _verdict(http: UrlSummary, row: UrlSummary, options: BenchOptions) -> str:
    ratio = row.end_to_end / http.end_to_end
    saved = http.end_to_end - row.end_to_end
    if options.repeat > 1 and row.spread.overlaps(http.spread):
        what = "showed no difference that these repetitions can tell from noise"
    elif ratio < 0.95:
        what = (
            f"helps: it saved {format_seconds(saved)} per conversation "
            f"({format_seconds(saved / options.turns)} per model call)"
        )
    elif ratio > 1.05:
        what = f"was slower here, by {format_seconds(-saved)} per conversation"
    else:
        what = "made no difference beyond the noise (within 5%)"
    return (
        f"{row.label} took {ratio:.2f} of HTTP's time (medians): it {what}, and sent "
        f"{format_ratio(row.bytes_sent, http.bytes_sent, 3)} of HTTP's bytes."
    )


def _mode_line(report: UrlReport) -> str:
    named = report.summaries[1:]
    said = "; ".join(f"{row.path}: {row.full_context}" for row in named)
    lines = (
        f"Mode, as each socket's handshake answer names it ({_HEADER_NAME}): {said}. "
        "always is drop-in (the handler gets the whole history every turn), on_miss cache-aware "
        "(only the new items on a cache hit)"
    )
    if any(row.full_context == UNKNOWN_MODE for row in named):
        lines += (
            "; unknown: the server did not say (not ws_mode's middleware, or a version of it "
            "that does not send the header)"
        )
    missing = {"always", "on_miss"} - {row.full_context for row in named}
    if len(missing) == 1:
        lines += (
            f". To measure {missing.pop()} too in the same run, serve a second middleware in "
            "that mode at another path and pass both paths with --socket-path (docs/benchmarks.md)"
        )
    return lines + "."


def format_url_report(report: UrlReport) -> list[str]:
    """The report as lines of text."""
    options = report.options
    http = report.summaries[0]
    early, late = windows(options.turns)
    sockets = ", ".join(socket_url(report.base, row.path) for row in report.summaries[1:])
    lines = [
        f"ws-mode bench --url {report.base}: a conversation of {options.turns} model calls "
        f"(model {options.model}; user messages, and the function calls the model makes, "
        f"each answered with {format_bytes(options.tool_output_bytes)} of synthetic output), "
        f"HTTP with the full history (POST {report.base}{DEFAULT_PATH}, streamed) against "
        f"WebSocket mode ({sockets}, only the new items); {options.repeat} repetitions, modes "
        "interleaved (order rotated): the median, and the least and most (range).",
        _mode_line(report),
        f"Early / late turn: median of turns {early.start + 1}-{early.stop} / "
        f"{late.start + 1}-{late.stop} (send to terminal event). sent: bytes the client sent. "
        "cached: the share of the continuations' input tokens the server read from its prompt "
        "cache (its usage's cached_tokens / input_tokens), the first turn's after it; - when it "
        "reported none.",
    ]
    if report.link is not None:
        lines.append(
            f"Link: the client reaches the server through a relay modelling {report.link}."
        )
    cells = [
        [
            row.label,
            format_seconds(row.end_to_end),
            _range(row.spread),
            format_ratio(row.end_to_end, http.end_to_end),
            format_seconds(row.early),
            format_seconds(row.late),
            format_bytes(row.bytes_sent),
            format_ratio(row.bytes_sent, http.bytes_sent, 3),
            f"{row.tool_calls:g}",
            _cached(row),
        ]
        for row in report.summaries
    ]
    headers = ["mode", "end-to-end", "range", "/HTTP", "early turn", "late turn", "sent"]
    lines += ["", *table([*headers, "/HTTP", "tool calls", "cached"], cells), ""]
    lines += [_verdict(http, row, options) for row in report.summaries[1:]]
    lines.append(
        "The saving grows with the history (turns, tool output sizes) and the client's distance."
    )
    lines += cautions(report.summaries, options.repeat)
    lines += [f"MISMATCH: {text}" for text in report.mismatches]
    if not report.mismatches and not report.notes:
        lines.append("Answers: the socket's were HTTP's in every run (ids left out).")
    lines += report.notes
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
        "mismatches": report.mismatches,
        "notes": report.notes,
    }


def save_url(report: UrlReport) -> None:
    """Write the JSON ``options.json`` asks for."""
    if report.options.json is not None:
        text = json.dumps(url_report_json(report), indent=2)
        Path(report.options.json).write_text(text + "\n")
