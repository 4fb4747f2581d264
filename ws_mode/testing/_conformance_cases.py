"""Every conformance case, in the order they run, and the ways to run them: all at once
(:func:`run_conformance`) or one at a time under pytest (:func:`check_conformance_case`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final

from . import (
    _conformance_errors,
    _conformance_interrupt,
    _conformance_lanes,
    _conformance_state,
    _conformance_steering,
)
from ._conformance import (
    CaseResult,
    ConformanceCase,
    ConformanceFailure,
    ConformanceOptions,
    run_cases,
    select_cases,
)

#: Every case, by rule family: lanes and limits, state and warm-ups, steering, interrupts,
#: errors and frames.
CONFORMANCE_CASES: Final[tuple[ConformanceCase, ...]] = (
    *_conformance_lanes.CASES,
    *_conformance_state.CASES,
    *_conformance_steering.CASES,
    *_conformance_interrupt.CASES,
    *_conformance_errors.CASES,
)


def run_conformance(
    base_url: str,
    options: ConformanceOptions | None = None,
    *,
    cases: Iterable[str] = (),
    on_result: Callable[[CaseResult], None] | None = None,
) -> list[CaseResult]:
    """Run the cases whose names match ``cases`` (shell-style patterns; all when empty)
    against ``base_url``, the server's origin (``http://host:8000``: the socket opens at
    the options' ``path`` under it); their results, in order."""
    chosen = select_cases(CONFORMANCE_CASES, cases)
    return run_cases(base_url, chosen, options, on_result)


def check_conformance_case(
    case: ConformanceCase | str, base_url: str, options: ConformanceOptions | None = None
) -> CaseResult:
    """Run one case (or the case of that name) against ``base_url``, for a test: its result
    when it passed, :class:`ConformanceFailure` (an AssertionError) when it failed, and
    ``pytest.skip`` with the reason when it was skipped (pytest imported only then)."""
    if isinstance(case, str):
        named = [known for known in CONFORMANCE_CASES if known.name == case]
        if not named:
            raise KeyError(f"no conformance case is named {case!r}")
        case = named[0]
    result = case.run(base_url, options)
    if result.outcome == "failed":
        raise ConformanceFailure(result)
    if result.outcome == "skipped":
        import pytest

        pytest.skip(f"{result.name}: {result.detail}")
    return result


def case_table() -> list[dict[str, Any]]:
    """Each case's name, rule and source."""
    return [
        {"name": case.name, "rule": case.rule, "source": case.source} for case in CONFORMANCE_CASES
    ]
