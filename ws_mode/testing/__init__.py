"""The compatibility kit: check that WebSocket mode gives your handler exactly what HTTP gives.

Run it against your own app before switching WebSocket mode on::

    from hypothesis import given, settings
    from . import conversations

    from myproject.asgi import app

    @settings(max_examples=25, deadline=None)
    @given(program=conversations(models=["my-model"]))
    def test_websocket_mode(ws_mode_check, program):
        ws_mode_check(app, program)

`conversations()` is a hypothesis strategy of conversation programs; `ws_mode_check` (a pytest
fixture) or `CompatibilityCheck` / `check_conversation` serve the app behind
`WebSocketModeMiddleware` under a real server, drive each program over a real socket, and
raise `CompatibilityError` at the first turn where the handler did not receive what an HTTP
client with the full history would have sent, the client did not receive a protocol-valid
event stream, or the answer differs from the one that HTTP client gets (wrong input included:
an output for an unknown call must be refused). A passing check's `coverage` tells what it
covered. See docs/testing.md.

The conformance suite checks a live endpoint, any server, against WebSocket mode's rules, one
named case a rule (`CONFORMANCE_CASES`): `run_conformance(url)` runs them all, and under
pytest `check_conformance_case(case, url)` runs one, a skipped case becoming pytest's skip::

    @pytest.mark.parametrize("case", CONFORMANCE_CASES, ids=str)
    def test_conformance(case):
        check_conformance_case(case, "http://127.0.0.1:8000")

Requirements: this module imports **hypothesis** (the strategies), **websockets** (the
client) and **uvicorn** or **hypercorn** (the server), and **pytest** for the fixture; the
**openai** SDK, when installed, validates output items (a `SDKValidationWarning` says when
it is not). They are test dependencies (the
`testing` extra: `pip install ".[testing]"` in a clone of ws_mode); they are imported when
used, so registering the pytest plugin costs nothing where they are missing.

(PYTEST_DONT_REWRITE: the kit raises its own errors, so pytest may load it after import.)
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from ._check import CheckOptions, CompatibilityCheck, SDKValidationWarning, check_conversation
from ._program import (
    DEFAULT_FIELDS,
    DEFAULT_INSTRUCTIONS,
    DEFAULT_LANES,
    DEFAULT_MODELS,
    DEFAULT_TOOLS,
    Action,
    Conversation,
    InputForm,
    Step,
    WrongInput,
    conversations,
)
from ._recorder import RecordedCall
from ._report import CompatibilityError, Coverage, NondeterminismError, Report, TurnReport

# The fixture: at once under pytest (for `pytest_plugins = ["ws_mode.testing"]`), on first use
# elsewhere, so a program that only needs the kit's socket client or server runner (the
# `ws-mode` command) does not pay for importing pytest.
if "pytest" in sys.modules:
    from ._plugin import CompatibilityChecks, ws_mode_check


# The conformance suite: imported on first use, as it imports websockets.
if TYPE_CHECKING:
    from ._conformance import (
        CaseResult,
        ConformanceCase,
        ConformanceFailure,
        ConformanceOptions,
        conformance_summary,
    )
    from ._conformance_cases import (
        CONFORMANCE_CASES,
        check_conformance_case,
        run_conformance,
    )

#: The conformance suite's public names, by the private module that holds each.
_CONFORMANCE_NAMES = {
    "CaseResult": "_conformance",
    "ConformanceCase": "_conformance",
    "ConformanceFailure": "_conformance",
    "ConformanceOptions": "_conformance",
    "conformance_summary": "_conformance",
    "CONFORMANCE_CASES": "_conformance_cases",
    "check_conformance_case": "_conformance_cases",
    "run_conformance": "_conformance_cases",
}


def __getattr__(name: str) -> Any:
    if name in ("CompatibilityChecks", "ws_mode_check"):
        from . import _plugin

        return getattr(_plugin, name)
    if name in _CONFORMANCE_NAMES:
        module = importlib.import_module(f"{__name__}.{_CONFORMANCE_NAMES[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CONFORMANCE_CASES",
    "DEFAULT_FIELDS",
    "DEFAULT_INSTRUCTIONS",
    "DEFAULT_LANES",
    "DEFAULT_MODELS",
    "DEFAULT_TOOLS",
    "Action",
    "CaseResult",
    "CheckOptions",
    "CompatibilityCheck",
    "CompatibilityChecks",
    "CompatibilityError",
    "ConformanceCase",
    "ConformanceFailure",
    "ConformanceOptions",
    "Conversation",
    "Coverage",
    "InputForm",
    "NondeterminismError",
    "RecordedCall",
    "Report",
    "SDKValidationWarning",
    "Step",
    "TurnReport",
    "WrongInput",
    "check_conformance_case",
    "check_conversation",
    "conformance_summary",
    "conversations",
    "run_conformance",
    "ws_mode_check",
]
