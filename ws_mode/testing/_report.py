"""What a check tells you: the `Report` of a program that passed, turn by turn, or the
`CompatibilityError` naming the turn where it failed and the difference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._items import Item
from ._program import Step
from ._recorder import RecordedCall


class CompatibilityError(AssertionError):
    """The check found a difference between WebSocket mode and HTTP, or an invalid stream.

    `turn` is the index of the failing turn (None when the socket itself failed), `step` its
    program step, `problem` a one-line summary and `details` the short diff.
    """

    def __init__(
        self,
        problem: str,
        *,
        turn: int | None = None,
        step: Step | None = None,
        steps: int = 0,
        details: str = "",
        context: str = "",
    ) -> None:
        self.problem = problem
        self.turn = turn
        self.step = step
        self.details = details
        if turn is None:
            head = "ws_mode compatibility check failed"
        else:
            head = f"ws_mode compatibility check failed at turn {turn} (from 0) of {steps}"
        lines = [head + ":"]
        if step is not None:
            lines.append(f"  step {turn}: {step.describe()}")
        lines.append(f"  problem: {problem}")
        lines.extend("    " + line for line in details.splitlines() if details)
        lines.extend("  " + line for line in context.splitlines() if context)
        super().__init__("\n".join(lines))


class TurnFailed(Exception):
    """A check of the turn being run failed: `problem` in one line, `details` the short diff.
    The run turns it into a `CompatibilityError` that tells where."""

    def __init__(self, problem: str, details: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.details = details


@dataclass(frozen=True)
class TurnReport:
    """What one turn sent, received and caused."""

    index: int
    step: Step
    request: dict[str, Any]
    events: list[dict[str, Any]]
    response: dict[str, Any] | None
    output: list[Item]
    context: list[Item]
    calls: list[RecordedCall]

    @property
    def terminal(self) -> str:
        """The type of the turn's last event."""
        return str(self.events[-1]["type"]) if self.events else "(none)"


@dataclass(frozen=True)
class Report:
    """The turns of one checked program, all of them valid."""

    turns: list[TurnReport]

    def summary(self) -> str:
        """One line a turn: what it did and how it ended."""
        return "\n".join(turn_line(report) for report in self.turns)

    def __str__(self) -> str:
        return self.summary()


def turn_line(report: TurnReport) -> str:
    """One line telling what a turn did and how it ended."""
    response = report.response or {}
    kinds = ", ".join(str(item.get("type")) for item in report.output) or "no output"
    previous = report.request.get("previous_response_id")
    if previous is not None:
        what = f"continues {previous}"
    elif "previous_response_id" in report.request:
        what = "recovery with the full context"
    else:
        what = "fresh chain"
    return (
        f"turn {report.index}: {what}"
        f"{'' if report.step.generate else ' (warm-up)'}"
        f"{f' on {report.step.lane!r}' if report.step.lane else ''}"
        f" -> {response.get('id', '-')} {report.terminal} [{kinds}], "
        f"context of {len(report.context)} items"
    )
