"""``ws-mode check``'s checks of a live endpoint: WebSocket mode tried against any server, ours
or anyone's, local or behind proxies and load balancers, and what to change when it fails.

:func:`run_checks` runs each check of :data:`CHECKS` on its own socket, in order: the handshake
(a refusal named: 426, 401/403, 404, a proxy that strips ``Upgrade``), a warm-up, a chained
conversation, ``previous_response_not_found``, two lanes at once, the error envelope of a bad
event, the largest message that gets through and whether an idle socket survives. When the
handshake fails the others are skipped. Each turn's events are checked with the compatibility
kit's validators (:func:`~ws_mode.testing._validation.check_events`). The outcome is a
:class:`CheckReport`: one :class:`CheckResult` a check, shown as a table
(:func:`format_report`) or as JSON (:func:`report_json`), each failure with a hint from
:data:`HINTS`, or written from what was measured. The long checks report their progress as
they go (:data:`Progress`): each size probed, what the idle socket waits for. A turn that ends
with ws_mode's own ``store_unavailable`` fails with the store's hint (:func:`hint_for_error`):
the middleware is there, its store is not.

The largest message probe (:func:`check_largest_message`) opens a socket per size and sends one
valid ``response.create`` padded to that exact size: a warm-up (``generate: false``) whose input
text is the padding, so no model runs, sent uncompressed so the size is what every hop carries.
The sizes double from ``min_probe_bytes`` to the first failure (or to ``max_probe_bytes``), then
a binary search narrows the ceiling to within 1/64 of it (1 KiB at least); powers of two, the
usual limits, are found exactly. How the first failing size failed says which hop refused it: a
close 1009 (the ASGI server's or a proxy's frame limit), a dropped connection (daphne, granian,
some proxies), an HTTP 413 at the handshake (a proxy's body limit), or ws_mode's own
``message_too_large`` error (``Limits.max_message_bytes``), after which the socket stays usable.
A ceiling set by ws_mode itself passes the check; one set by another hop fails it, since the
socket and its cache are lost there (docs/deployment.md, "The message size limit"). The probes
run on the asyncio client (:func:`probe_size` says why).

The idle socket (:func:`check_idle_socket`) sends nothing, not even pings, for
``idle_seconds``, noting each ping the server sends (:class:`PingTimedConnection`). When a hop
closes it, the server's pings are timed on a second socket that the client keeps open with its
own pings (:func:`time_server_pings`), so that the hint tells pings that are off, pings slower
than the hop's timeout (both numbers given) and a hop that pings cannot keep open.

The package, by concept: :mod:`.results` (results, report, options, the socket and turn
helpers every check shares, the shared hints), :mod:`.basic` (the handshake and the protocol
checks), :mod:`.size` (the largest message), :mod:`.idle` (the idle socket and the server's
pings), and here the run and its report. Only ``ws-mode check``
(:mod:`ws_mode.toolkit.cli.check`) uses any of it. Needs websockets.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any, Final

from websockets.exceptions import ConnectionClosed, InvalidHandshake

from ws_mode.testing._client import MessageTooLarge, ReadLimitExceeded, SocketClosed, SyncSocket
from ws_mode.testing._report import TurnFailed

from .basic import (
    check_chained_conversation,
    check_error_envelope,
    check_handshake,
    check_lanes,
    check_unknown_previous_response,
    check_warm_up,
    describe_refusal,
    explain_refusal,
)
from .idle import (
    IDLE_HINTS,
    IDLE_SOCKET,
    IdleWait,
    PingTimedConnection,
    check_idle_socket,
    client_ping_interval,
    describe_pings,
    no_server_pings_hint,
    open_ping_timed_socket,
    pings_ignored_hint,
    slow_pings_hint,
    time_server_pings,
    wait_idle,
)
from .results import HINTS as SHARED_HINTS
from .results import (
    CheckedTurn,
    CheckFailed,
    CheckOptions,
    CheckReport,
    CheckResult,
    Progress,
    Status,
    Target,
    checked_turn,
    close_code,
    hint_for_error,
    open_socket,
    read_event,
    require_finished,
    response_create,
    run_turn,
    too_large_detail,
)
from .size import (
    LARGEST_MESSAGE,
    SIZE_HINTS,
    SizeProbe,
    check_largest_message,
    find_ceiling,
    padded_warm_up,
    probe_size,
)

__all__ = [
    "CHECKS",
    "HINTS",
    "CheckFailed",
    "CheckOptions",
    "CheckReport",
    "CheckResult",
    "CheckedTurn",
    "IdleWait",
    "PingTimedConnection",
    "Progress",
    "SizeProbe",
    "Status",
    "Target",
    "check_chained_conversation",
    "check_error_envelope",
    "check_handshake",
    "check_idle_socket",
    "check_lanes",
    "check_largest_message",
    "check_unknown_previous_response",
    "check_warm_up",
    "checked_turn",
    "client_ping_interval",
    "close_code",
    "describe_pings",
    "describe_refusal",
    "explain_refusal",
    "find_ceiling",
    "format_report",
    "hint_for_error",
    "no_server_pings_hint",
    "open_ping_timed_socket",
    "open_socket",
    "padded_warm_up",
    "pings_ignored_hint",
    "probe_size",
    "read_event",
    "report_json",
    "require_finished",
    "response_create",
    "run_checks",
    "run_turn",
    "slow_pings_hint",
    "time_server_pings",
    "too_large_detail",
    "wait_idle",
]

#: The width hints are wrapped to.
HINT_WIDTH: Final = 100
#: The checks, in the order they run and are shown.
CHECKS: Final = (
    "handshake",
    "warm-up",
    "chained conversation",
    "previous_response_not_found",
    "lanes",
    "error envelope",
    "largest message",
    "idle socket",
)
#: What to change when a check fails, by the kind of failure: the hints more than one check
#: meets, then those of the largest message and of the idle socket.
HINTS: Final[dict[str, str]] = {**SHARED_HINTS, **SIZE_HINTS, **IDLE_HINTS}

# ----------------------------------------------------------------------------- the run

SocketCheck = Callable[[SyncSocket, CheckOptions], CheckResult]
SOCKET_CHECKS: Final[tuple[tuple[str, SocketCheck], ...]] = (
    ("warm-up", check_warm_up),
    ("chained conversation", check_chained_conversation),
    ("previous_response_not_found", check_unknown_previous_response),
    ("lanes", check_lanes),
    ("error envelope", check_error_envelope),
)


def run_checks(
    target: Target,
    options: CheckOptions,
    on_result: Callable[[CheckResult], None] | None = None,
    on_progress: Callable[[str, str], None] | None = None,
) -> CheckReport:
    """Run every check against ``target``; ``on_result`` hears each result as it comes,
    ``on_progress`` each line of progress of a long check (``(check, line)``: what it waits
    for, each message size probed)."""
    results: list[CheckResult] = []

    def record(result: CheckResult) -> None:
        results.append(result)
        if on_result is not None:
            on_result(result)

    def progress_of(name: str) -> Progress | None:
        if on_progress is None:
            return None
        return lambda line: on_progress(name, line)

    checks: list[tuple[str, Callable[[], CheckResult]]] = []
    for name, check in SOCKET_CHECKS:
        checks.append((name, _on_new_socket(target, options, check)))
    checks.append(
        (
            LARGEST_MESSAGE,
            lambda: check_largest_message(target, options, progress_of(LARGEST_MESSAGE)),
        )
    )
    checks.append(
        (IDLE_SOCKET, lambda: check_idle_socket(target, options, progress_of(IDLE_SOCKET)))
    )
    handshake = check_handshake(target, options)
    record(handshake)
    for name, run in checks:
        if handshake.status != "ok":
            record(CheckResult.skipped(name, "the handshake failed"))
        elif name == LARGEST_MESSAGE and not options.max_probe_bytes:
            record(CheckResult.skipped(name, "--max-probe-bytes 0"))
        elif name == IDLE_SOCKET and not options.idle_seconds:
            record(CheckResult.skipped(name, "--idle 0"))
        else:
            record(_run_guarded(name, options, run))
    return CheckReport(target.url, results)


def _on_new_socket(
    target: Target, options: CheckOptions, check: SocketCheck
) -> Callable[[], CheckResult]:
    def run() -> CheckResult:
        with open_socket(target, options) as socket:
            return check(socket, options)

    return run


def _run_guarded(name: str, options: CheckOptions, run: Callable[[], CheckResult]) -> CheckResult:
    """``run()``, its failures turned into a failed result."""
    try:
        return run()
    except CheckFailed as exc:
        return exc.result
    except TurnFailed as exc:
        detail = exc.problem + (f" ({exc.details.splitlines()[0]})" if exc.details else "")
        return CheckResult.failed(name, detail, "protocol")
    except TimeoutError:
        return CheckResult.failed(name, f"no answer within {options.timeout:g} s", "model")
    except (MessageTooLarge, ReadLimitExceeded) as exc:  # the checker's own limit, named
        return CheckResult.failed(name, too_large_detail(exc), "answer_too_large")
    except (SocketClosed, ConnectionClosed) as exc:
        why = str(exc).partition("; then")[0]
        return CheckResult.failed(name, f"the socket closed during the turn: {why}", "closed")
    except (InvalidHandshake, OSError) as exc:
        detail, hint, _ = describe_refusal(exc)
        return CheckResult.failed(name, f"could not open a socket: {detail}", hint)


# ----------------------------------------------------------------------------- the report


def format_report(report: CheckReport, *, verdict: bool = True) -> list[str]:
    """The report as lines: a title, the table (check, result, detail), the hint of each
    failure, and the counts, with the verdict when ``verdict`` (not when conformance cases
    follow, whose outcome is part of it: the command line prints one verdict for both)."""
    rows = [(result.name, result.status, result.detail) for result in report.results]
    widths = [
        max(len(row[column]) for row in [("check", "result", ""), *rows]) for column in (0, 1)
    ]
    lines = [f"ws-mode check {report.url}", ""]
    head = f"  {'check'.ljust(widths[0])}  {'result'.ljust(widths[1])}  detail"
    lines += [head, "  " + "-" * (len(head) + 30)]
    for name, status, detail in rows:
        lines.append(f"  {name.ljust(widths[0])}  {status.ljust(widths[1])}  {detail}".rstrip())
    hints = [result for result in report.results if result.status == "FAILED" and result.hint]
    if hints:
        lines += ["", "What to change:"]
        for result in hints:
            lines += textwrap.wrap(
                f"{result.name}: {result.hint}",
                HINT_WIDTH,
                initial_indent="  ",
                subsequent_indent="    ",
                break_on_hyphens=False,
            )
    failed = sum(result.status == "FAILED" for result in report.results)
    skipped = sum(result.status == "skipped" for result in report.results)
    passed = len(report.results) - failed - skipped
    counts = f"{passed} ok, {failed} failed, {skipped} skipped"
    lines += ["", counts + (": WebSocket mode works here" if report.ok and verdict else "")]
    return lines


def report_json(report: CheckReport) -> dict[str, Any]:
    """The report as JSON: the URL, whether it passed, and each check with its data."""
    return {
        "url": report.url,
        "ok": report.ok,
        "checks": [
            {
                "name": result.name,
                "status": result.status.lower(),
                "detail": result.detail,
                "hint": result.hint or None,
                **({"data": result.data} if result.data else {}),
            }
            for result in report.results
        ],
    }
