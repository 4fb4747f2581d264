"""``ws-mode check URL``: does this endpoint speak WebSocket mode, and what cuts it?

Points the checks of :mod:`ws_mode.toolkit.check` at any live endpoint (ours or anyone's,
local or behind proxies and load balancers) and prints one row a check (``ok``, ``FAILED`` or
``skipped``), then for each failure what to change in the server, the proxy or the balancer.
While it runs, it says on stderr what it does (each result as it comes, what a long check waits
for, each message size probed); ``--quiet`` leaves only the table.
Exits 1 when a check fails, so a deployment can run it in CI; ``--json FILE`` writes the
results. ``--all`` adds the conformance suite (:mod:`ws_mode.testing`'s cases, one per rule of
WebSocket mode: lanes, limits, the cache, steering, errors, frames), one row a case
(``passed``, ``FAILED`` or ``skipped``) and a summary line; ``--case PATTERN`` runs the cases
whose names match, ``--list`` lists them. The URL is the HTTP API's base
(``http://host:8000``, ``https://host/v1``, as the openai SDK's ``base_url``) or the socket's
own (``wss://host/v1/responses``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..args import number
from .common import CHECK_REQUIREMENTS, PROG, CommandError

if TYPE_CHECKING:
    from ws_mode.testing import CaseResult, ConformanceCase

    from ..check import CheckOptions, CheckReport

__all__ = ["add_command", "format_cases", "parse_size", "run_check", "target_of"]

KiB = 1024
MiB = 1024 * KiB
_UNITS = {"": 1, "b": 1, "k": KiB, "kb": KiB, "kib": KiB, "m": MiB, "mb": MiB, "mib": MiB}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*\Z", re.IGNORECASE)
_SECONDS = number(float, 0)
_TIMEOUT = number(float, 0, strict=True)
#: The socket's path under the API's base, as the openai SDK builds it.
SOCKET_PATH = "/v1/responses"


def parse_size(text: str) -> int:
    """An argparse type: a size in bytes, with an optional unit (``64KiB``, ``16M``; K and M
    are 1024 and 1024²)."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"expected a size such as 65536, 64KiB or 16MiB: {text!r}")
    return int(float(match.group(1)) * _UNITS[unit])


def target_of(url: str) -> tuple[str, str]:
    """The base URL and socket path of ``url``: an HTTP base (``/v1`` and ``/v1/responses``
    optional) gets ``/v1/responses``; a ``ws://`` or ``wss://`` URL is the socket's own (its
    path, when it has one, kept). :class:`CommandError` for anything else."""
    from ws_mode.testing._client import api_base  # light: the bench's modules need the cli extra

    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    if scheme not in ("http", "https") or not parts.hostname:
        raise CommandError(f"expected an http(s):// or ws(s):// URL, got {url!r}")
    path = parts.path.rstrip("/")
    origin = f"{scheme}://{parts.netloc}"
    if parts.scheme in ("ws", "wss") and path and not path.endswith(("/v1", SOCKET_PATH)):
        return origin, path + (f"?{parts.query}" if parts.query else "")
    return api_base(origin + path), SOCKET_PATH


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``check`` and its flags."""
    check = commands.add_parser(
        "check",
        help="check that a live endpoint speaks WebSocket mode, through its proxies",
        description="Run WebSocket mode's checks against a live endpoint: the handshake, a "
        "warm-up, a chained conversation, previous_response_not_found, two lanes at once, the "
        "error envelope, the largest message that gets through and whether an idle socket "
        "survives; print a table and, for each failure, what to change. Exits 1 when a check "
        "fails. See docs/deployment.md.",
    )
    check.add_argument(
        "url",
        metavar="URL",
        nargs="?",
        help="the API's base URL (http://host:8000, https://host/v1) or the socket's "
        "(wss://host/v1/responses)",
    )
    check.add_argument(
        "--api-key",
        default=None,
        help="sent as Authorization: Bearer KEY on the handshake (default: $OPENAI_API_KEY)",
    )
    check.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="a header for the handshake (repeatable)",
    )
    check.add_argument(
        "--model",
        default=None,
        help="the model to ask for (default: none sent; the server's default)",
    )
    check.add_argument(
        "--timeout",
        type=_TIMEOUT,
        default=30.0,
        metavar="SECONDS",
        help="how long a handshake or one turn may take (default: %(default)g)",
    )
    check.add_argument(
        "--idle",
        type=_SECONDS,
        default=75.0,
        metavar="SECONDS",
        help="how long the idle socket stays silent, the client sending no pings; 0 skips "
        "the check (default: %(default)g, past the 60 s idle timeouts of nginx and AWS ALB). "
        "When a hop closes it, the server's pings are timed on a socket the client keeps open "
        "with its own pings, for as long again at most",
    )
    check.add_argument(
        "--min-probe-bytes",
        type=parse_size,
        default=64 * KiB,
        metavar="SIZE",
        help="the first message size probed (default: 64KiB)",
    )
    check.add_argument(
        "--max-probe-bytes",
        type=parse_size,
        default=64 * MiB,
        metavar="SIZE",
        help="the largest message size probed, what the deployment must carry; 0 skips the "
        "probe (default: 64MiB, ws_mode's Limits.max_message_bytes)",
    )
    check.add_argument(
        "--max-message-bytes",
        type=parse_size,
        # The kit's client's DEFAULT_MAX_MESSAGE_BYTES, not imported: it needs websockets.
        default=64 * MiB,
        metavar="SIZE",
        help="the largest message read from the endpoint, and the most one socket's messages "
        "may total: more fails the check (a larger message is not read, the checker closing "
        "the socket with 1009), so that an endpoint cannot make the checker hold more "
        "(default: 64MiB)",
    )
    check.add_argument(
        "--all",
        action="store_true",
        help="also run every conformance case (WebSocket mode's rules, one case each; see "
        "docs/testing.md); a skipped case does not fail the run",
    )
    check.add_argument(
        "--case",
        action="append",
        default=[],
        metavar="PATTERN",
        help="also run the conformance cases whose names match PATTERN (shell-style: "
        "'lanes.*', '*steer*'; repeatable)",
    )
    check.add_argument(
        "--list",
        action="store_true",
        help="list the conformance cases (name, rule, source) and exit",
    )
    check.add_argument(
        "--connection-lifetime",
        type=_TIMEOUT,
        default=None,
        metavar="SECONDS",
        help="how long the server keeps a socket: the errors.connection_lifetime case waits "
        "that long for websocket_connection_limit_reached (default: skipped)",
    )
    check.add_argument(
        "--rate-limited-request",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="fields of a response.create the server answers with 429 and its rate-limit "
        'headers, e.g. \'{"model": "limited"}\': the errors.rate_limit_headers case '
        "checks error.headers (default: skipped)",
    )
    check.add_argument(
        "--create-fields",
        type=_json_object,
        default={},
        metavar="JSON",
        help="fields every conformance case sends in its response.create, e.g. "
        "'{\"store\": false}' (default: none)",
    )
    check.add_argument("--json", default=None, metavar="FILE", help="write the results as JSON")
    check.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print no progress on stderr (each check's result as it comes, what a long "
        "check waits for): only the table, on stdout",
    )
    check.set_defaults(run=run_check, requirements=CHECK_REQUIREMENTS)


def _json_object(text: str) -> dict[str, object]:
    """An argparse type: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _headers(args: argparse.Namespace) -> dict[str, str]:
    from ..bench.options import BenchError, BenchOptions

    api_key = args.api_key or os.environ.get("OPENAI_API_KEY") or None
    try:
        return BenchOptions(headers=tuple(args.header), api_key=api_key).request_headers()
    except BenchError as exc:
        raise CommandError(str(exc)) from None


def run_check(args: argparse.Namespace) -> int:
    """Run ``ws-mode check``: 0 when every check passed (or was skipped), 1 otherwise."""
    # Imported here: the checks need websockets, which the rest of the command line does not.
    from ..check import CheckOptions, CheckResult, Target, format_report, report_json, run_checks

    if args.list:
        return _list_cases()
    if args.url is None:
        raise CommandError("a URL is needed (only --list runs without one)")
    base, path = target_of(args.url)
    chosen = _chosen_cases(args) if args.all or args.case else None
    if args.max_probe_bytes and args.min_probe_bytes > args.max_probe_bytes:
        raise CommandError("--min-probe-bytes is larger than --max-probe-bytes")
    if args.max_message_bytes < 1:
        raise CommandError("--max-message-bytes must be at least 1 byte")
    options = CheckOptions(
        headers=_headers(args),
        model=args.model,
        timeout=args.timeout,
        idle_seconds=args.idle,
        min_probe_bytes=max(1, args.min_probe_bytes),
        max_probe_bytes=args.max_probe_bytes,
        max_message_bytes=args.max_message_bytes,
    )
    target = Target(base, path)

    def say(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    def on_result(result: CheckResult) -> None:
        say(f"  {result.name}: {result.status}")

    def on_progress(check: str, line: str) -> None:
        say(f"  {check}: {line}")

    say(f"{PROG} check: checking {target.url}")
    report = run_checks(target, options, on_result, on_progress)
    print("\n".join(format_report(report, verdict=chosen is None)), flush=True)
    cases = None
    if chosen is not None:
        handshake_ok = report.result("handshake").status == "ok"
        cases = _run_cases(args, chosen, base, path, options, handshake_ok, say)
        print("\n" + verdict_line(report, cases), flush=True)
    if args.json is not None:
        written = report_json(report)
        if cases is not None:
            written["cases"] = [_case_json(result) for result in cases]
            written["ok"] = written["ok"] and all(r.outcome != "failed" for r in cases)
        try:
            Path(args.json).write_text(json.dumps(written, indent=2) + "\n")
        except OSError as exc:
            raise CommandError(f"cannot write {args.json}: {exc}") from None
    failed = cases is not None and any(result.outcome == "failed" for result in cases)
    return 0 if report.ok and not failed else 1


def verdict_line(report: CheckReport, cases: Sequence[CaseResult]) -> str:
    """One verdict for the checks and the conformance cases together, as the exit status
    says it: the endpoint works when neither a check nor a case failed (skips do not count)."""
    checks = sum(result.status == "FAILED" for result in report.results)
    failed = sum(result.outcome == "failed" for result in cases)
    if not checks and not failed:
        return "verdict: WebSocket mode works here (no check and no conformance case failed)"
    parts = [f"{count} {what}{'s' if count != 1 else ''}" for count, what in
             ((checks, "check"), (failed, "conformance case")) if count]  # fmt: skip
    return f"verdict: {' and '.join(parts)} failed (exit status 1)"


def _list_cases() -> int:
    from ws_mode.testing import CONFORMANCE_CASES

    width = max(len(case.name) for case in CONFORMANCE_CASES)
    for case in CONFORMANCE_CASES:
        print(f"{case.name.ljust(width)}  {case.rule} ({case.source})")
    return 0


def _chosen_cases(args: argparse.Namespace) -> list[ConformanceCase]:
    """The conformance cases ``--all`` or ``--case`` asks for; :class:`CommandError` when the
    patterns match none."""
    from ws_mode.testing import CONFORMANCE_CASES
    from ws_mode.testing._conformance import select_cases

    chosen = select_cases(CONFORMANCE_CASES, [] if args.all else args.case)
    if not chosen:
        raise CommandError(f"no conformance case matches {' '.join(args.case)!r} (see --list)")
    return chosen


def _run_cases(
    args: argparse.Namespace,
    chosen: list[ConformanceCase],
    base: str,
    path: str,
    options: CheckOptions,
    handshake_ok: bool,
    say: Callable[[str], None],
) -> list[CaseResult]:
    """Run the ``chosen`` conformance cases (skipped when the handshake failed), and print
    their table."""
    from ws_mode.testing import CaseResult, ConformanceOptions, run_conformance

    conformance = ConformanceOptions(
        path=path,
        headers=options.headers,
        model=options.model,
        timeout=options.timeout,
        connection_lifetime=args.connection_lifetime,
        rate_limited_request=args.rate_limited_request,
        create_fields=args.create_fields,
        max_message_bytes=options.max_message_bytes,
    )
    if not handshake_ok:
        results = [
            CaseResult(case.name, case.rule, case.source, "skipped", "the handshake failed")
            for case in chosen
        ]
    else:
        say(f"{PROG} check: conformance cases")
        results = run_conformance(
            base,
            conformance,
            cases=[case.name for case in chosen],
            on_result=lambda result: say(f"  {result.name}: {result.outcome}"),
        )
    print("\n".join(format_cases(results)), flush=True)
    return results


def format_cases(results: Sequence[CaseResult]) -> list[str]:
    """The conformance cases as lines: one row a case (name, outcome, detail), then the
    summary line."""
    from ws_mode.testing import conformance_summary

    width = max(len("case"), *(len(result.name) for result in results))
    shown = {"passed": "passed", "failed": "FAILED", "skipped": "skipped"}
    lines = ["", f"  {'case'.ljust(width)}  {'outcome':7}  detail", "  " + "-" * (width + 40)]
    for result in results:
        row = f"  {result.name.ljust(width)}  {shown[result.outcome]:7}  {result.detail}"
        lines.append(row.rstrip())
    lines += ["", "conformance: " + conformance_summary(results)]
    return lines


def _case_json(result: CaseResult) -> dict[str, object]:
    return {
        "name": result.name,
        "outcome": result.outcome,
        "detail": result.detail,
        "rule": result.rule,
        "source": result.source,
        "seconds": round(result.seconds, 3),
    }
