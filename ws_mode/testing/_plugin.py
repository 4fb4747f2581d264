"""The pytest plugin of the compatibility kit: the `ws_mode_check` fixture.

Registered through the `pytest11` entry point `ws_mode`, or explicitly with
`pytest_plugins = ["ws_mode.testing"]`. Importing it costs nothing: hypothesis, websockets and
the server are only imported when a check runs.

(PYTEST_DONT_REWRITE: the kit raises its own errors, so pytest may load it after import.)
"""

from __future__ import annotations

import typing
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from .._asgi import ASGIApp
from .._middleware import find_middlewares
from ._check import CheckOptions, CompatibilityCheck
from ._program import Conversation, Step
from ._report import Report


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
        return check

    def close(self) -> None:
        """Stop every server."""
        checks, self._checks = self._checks, []
        for _app, _options, check in checks:
            check.close()


@pytest.fixture(scope="session")
def ws_mode_check() -> Iterator[CompatibilityChecks]:
    """Check conversation programs against an app: `ws_mode_check(app, program, **options)`.

    Session-scoped, so it works inside hypothesis `@given` tests; servers are shared per app
    and options for the session.
    """
    checks = CompatibilityChecks()
    try:
        yield checks
    finally:
        checks.close()
