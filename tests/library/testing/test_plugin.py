"""The pytest plugin (`ws_mode.testing._plugin`): the `ws_mode_check` fixture checks the examples
with their own middleware, and loads in a user's project with `pytest_plugins`."""

from __future__ import annotations

import pytest

from tests.library.testing.apps import PROGRAM
from ws_mode.testing import CompatibilityChecks, CompatibilityError

# The kit's fixture, loaded the way a user's project without the entry point loads it.
pytest_plugins = ["pytester", "ws_mode.testing"]


def test_fastapi_example(ws_mode_check: CompatibilityChecks) -> None:
    from examples.fastapi_app import app

    report = ws_mode_check(app, PROGRAM)
    assert [len(turn.calls) for turn in report.turns] == [1, 1, 1, 0, 1, 1]


def test_starlette_example_with_auth(ws_mode_check: CompatibilityChecks) -> None:
    from examples.starlette_app import create_app as create_example

    app = create_example(api_key="secret")
    report = ws_mode_check(app, PROGRAM, headers={"Authorization": "Bearer secret"})
    assert report.turns[0].output[0]["type"] == "function_call"
    with pytest.raises(CompatibilityError, match="the turn ended with error"):
        ws_mode_check(app, PROGRAM, headers={"Authorization": "Bearer wrong"})


def test_the_plugin_loads_with_pytest_plugins(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from hypothesis import given, settings
        from ws_mode.toolkit.reference import ReferenceConfig, create_app
        from ws_mode.testing import conversations

        pytest_plugins = ["ws_mode.testing"]
        app = create_app(ReferenceConfig(tool_calls=1, answer_tokens=3))

        @settings(max_examples=5, deadline=None)
        @given(program=conversations(max_steps=3))
        def test_compatible(ws_mode_check, program):
            ws_mode_check(app, program)

        def test_broken(ws_mode_check):
            from ws_mode.testing import Step
            ws_mode_check(app, [Step("fresh")], middleware=lambda inner: inner)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:asyncio")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*CompatibilityError*refused the socket*"])
