"""The pytest plugin of the compatibility kit: the `ws_mode_check` fixture, the summary of what
its checks covered at the end of the session, and a short report for a hypothesis
`FlakyFailure` that a handler which is not deterministic causes.

Registered through the `pytest11` entry point `ws_mode`, or explicitly with
`pytest_plugins = ["ws_mode.testing"]`. Importing it costs nothing: hypothesis, websockets and
the server are only imported when a check runs.

(PYTEST_DONT_REWRITE: the kit raises its own errors, so pytest may load it after import.)
"""

from __future__ import annotations

import typing
from collections.abc import Generator, Iterator, Sequence
from typing import Any

import pytest

from .._asgi import ASGIApp
from .._middleware import find_middlewares
from ._check import CheckOptions, CompatibilityCheck
from ._program import Conversation, Step
from ._report import NONDETERMINISM_HINT, CompatibilityError, Report


class CompatibilityChecks:
    """What the `ws_mode_check` fixture gives: `ws_mode_check(app, program, **options)` checks
    one program and returns its `Report`.

    One server is started per app and options, on first use, and kept for the whole test
    session (hypothesis runs many programs against it); all stop when the session ends.
    Options are `CompatibilityCheck`'s keywords. An app that contains its own
    `WebSocketModeMiddleware` is served by one check at a time: asking for other options
    stops the previous check of that app.
    """

    def __init__(self) -> None:
        self._checks: list[tuple[ASGIApp, dict[str, Any], CompatibilityCheck]] = []
        #: Every check started, for the session's summary.
        self._started: list[CompatibilityCheck] = []

    def __call__(
        self,
        app: ASGIApp,
        program: Conversation | Sequence[Step],
        **options: typing.Unpack[CheckOptions],
    ) -> Report:
        return self.checker(app, **options).run(program)

    def checker(self, app: ASGIApp, **options: typing.Unpack[CheckOptions]) -> CompatibilityCheck:
        """The running check for `app` and `options`, started on first use."""
        wanted: dict[str, Any] = dict(options)
        for served, given, check in self._checks:
            if served is app and given == wanted:
                return check
        if options.get("middleware") is None and find_middlewares(app):
            # The app's own middleware records for one check at a time: stop the check with
            # other options first.
            for entry in [entry for entry in self._checks if entry[0] is app]:
                self._checks.remove(entry)
                entry[2].close()
        check = CompatibilityCheck(app, **options)
        check.start()
        self._checks.append((app, wanted, check))
        self._started.append(check)
        return check

    def summary(self) -> str:
        """What the programs of every check covered, a paragraph a check ("" before any)."""
        paragraphs = []
        for check in self._started:
            app = getattr(check.app, "__name__", type(check.app).__name__)
            mode = f" (full_context={check.mode!r})" if check.mode else ""
            head = f"{app}{mode}:"
            lines = check.summary().splitlines()
            paragraphs.append("\n".join([head, *("  " + line for line in lines)]))
        return "\n".join(paragraphs)

    def close(self) -> None:
        """Stop every server."""
        checks, self._checks = self._checks, []
        for _app, _options, check in checks:
            check.close()


_CHECKS = pytest.StashKey[CompatibilityChecks]()


@pytest.fixture(scope="session")
def ws_mode_check(request: pytest.FixtureRequest) -> Iterator[CompatibilityChecks]:
    """Check conversation programs against an app: `ws_mode_check(app, program, **options)`.

    Session-scoped, so it works inside hypothesis `@given` tests; servers are shared per app
    and options for the session. The terminal summary tells what the checks covered.
    """
    checks = CompatibilityChecks()
    request.config.stash[_CHECKS] = checks
    try:
        yield checks
    finally:
        checks.close()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """What the `ws_mode_check` fixture's checks covered, when it was used."""
    checks = config.stash.get(_CHECKS, None)
    summary = checks.summary() if checks is not None else ""
    if summary:
        terminalreporter.section("ws_mode compatibility check")
        terminalreporter.write_line(summary)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Replace the long report of a hypothesis `FlakyFailure` around a `CompatibilityError`
    (a program failed once and passed when replayed) with a short one: the handler is not
    deterministic, how to handle it, and the first failure."""
    report = yield
    error = call.excinfo.value if call.excinfo is not None else None
    # FlakyFailure, an exception group, or an older hypothesis's Flaky (by name: importing
    # hypothesis here would cost every session that loads the plugin).
    if report.failed and type(error).__name__ in ("FlakyFailure", "Flaky"):
        found = _compatibility_error(error)
        if found is not None:
            report.longrepr = (
                "ws_mode compatibility check: a program failed once and passed when hypothesis "
                "ran it again (FlakyFailure): the handler's answers are not deterministic, or "
                "depend on earlier calls.\n"
                + NONDETERMINISM_HINT
                + "\n\nThe first failure:\n"
                + str(found)
            )
    return report


def _compatibility_error(error: BaseException | None) -> CompatibilityError | None:
    """The first `CompatibilityError` in `error`, an exception group, or its cause, or None."""
    if error is None or isinstance(error, CompatibilityError):
        return error
    inner: list[BaseException | None] = [error.__cause__]
    if isinstance(error, BaseExceptionGroup):
        inner[:0] = error.exceptions
    for candidate in inner:
        found = _compatibility_error(candidate)
        if found is not None:
            return found
    return None
