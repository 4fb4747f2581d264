"""The pytest plugin (`ws_mode.testing._plugin`): the `ws_mode_check` fixture checks the examples
with their own middleware, and loads in a user's project with `pytest_plugins`."""

from __future__ import annotations

import pytest

from tests.library.testing.apps import PROGRAM
from ws_mode.testing import CompatibilityChecks, CompatibilityError
from ws_mode.testing._plugin import _compatibility_error

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
    """In a user's project: a pass prints what the checks covered, and a program that failed
    once and passed when hypothesis replayed it gets a short report instead of FlakyFailure's."""
    pytester.makepyfile(
        """
        from hypothesis import given, settings
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse
        from starlette.routing import Route
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

        calls = 0

        async def first_call_differs(request):
            global calls
            calls += 1
            text = "first" if calls == 1 else "later"
            content = [{"type": "output_text", "text": text, "annotations": []}]
            item = {"type": "message", "id": "msg_1", "role": "assistant",
                    "status": "completed", "content": content}
            return JSONResponse({"id": f"resp_{calls}", "object": "response", "created_at": 0,
                                 "status": "completed", "model": "m", "output": [item]})

        flaky = Starlette(routes=[Route("/v1/responses", first_call_differs, methods=["POST"])])

        @settings(max_examples=3, deadline=None, database=None)
        @given(program=conversations(max_steps=1, wrong_inputs=False, warm_ups=False))
        def test_flaky(ws_mode_check, program):
            ws_mode_check(flaky, program)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:asyncio")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*CompatibilityError*refused the socket*",
            "*a program failed once and passed when hypothesis ran it again (FlakyFailure)*",
            "*seed its randomness*",
            "*the socket's answer differs from HTTP's*",
            "*ws_mode compatibility check*",
            "*5 programs passed, * turns on * lanes*",
            "*answers compared with HTTP's: *",
            "*output items validated with the openai SDK's models: yes*",
        ]
    )
    assert "Traceback" not in result.stdout.str().split("test_flaky")[-1]


def test_the_compatibility_error_is_found_in_a_flaky_failure() -> None:
    error = CompatibilityError("a problem")
    nested = ExceptionGroup("flaky", [ValueError("x"), ExceptionGroup("inner", [error])])
    assert _compatibility_error(nested) is error
    caused = RuntimeError("flaky")
    caused.__cause__ = error
    assert _compatibility_error(caused) is error
    assert _compatibility_error(ExceptionGroup("flaky", [ValueError("x")])) is None
