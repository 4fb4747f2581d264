"""A compatibility check of an app whose WebSocketModeMiddleware sits in Starlette's middleware
stack: turns enter the whole app and still reach the check's recorder (the middleware hands a
turn on to the app its settings name)."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Mount

from tests.library.testing.apps import PROGRAM, reference
from ws_mode import WebSocketModeMiddleware
from ws_mode.testing import CompatibilityCheck


def test_a_middleware_in_the_apps_stack_is_checked() -> None:
    app = Starlette(
        routes=[Mount("/", app=reference())], middleware=[Middleware(WebSocketModeMiddleware)]
    )
    with CompatibilityCheck(app) as check:
        report = check.run(PROGRAM)
    assert len(report.turns) == len(PROGRAM)
