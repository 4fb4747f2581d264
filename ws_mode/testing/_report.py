"""What a check tells you: the `Report` of a program that passed, turn by turn, the `Coverage`
of all the programs a check ran, or the `CompatibilityError` naming the turn where it failed and
the difference."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
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


class NondeterminismError(CompatibilityError):
    """The handler answered one request differently from one call to the next, so its answers
    over the socket cannot be compared with HTTP's: seed it, name the fields it randomizes in
    `ignore_fields`, or pass `compare_answers=False`."""


NONDETERMINISM_HINT = (
    "To check it: make the handler deterministic for a given request (seed its randomness, "
    "e.g. from the request's input, or temperature 0), name the fields it randomizes in "
    "ignore_fields=[...], or pass compare_answers=False (the kit then checks requests and "
    "event streams only)."
)


class TurnFailed(Exception):
    """A check of the turn being run failed: `problem` in one line, `details` the short diff.
    The run turns it into a `CompatibilityError` that tells where."""

    def __init__(self, problem: str, details: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.details = details


class NotDeterministic(TurnFailed):
    """The turn's comparison with HTTP found a handler that is not deterministic."""


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
    #: The wrong input the turn sent (None: right input).
    wrong: str | None = None
    #: Whether its answer was compared with HTTP's.
    compared: bool = False

    @property
    def terminal(self) -> str:
        """The type of the turn's last event."""
        return str(self.events[-1]["type"]) if self.events else "(none)"


@dataclass(frozen=True)
class Report:
    """The turns of one checked program, all of them valid."""

    turns: list[TurnReport]
    #: Whether output items were validated with the openai SDK's models.
    sdk_validated: bool = False

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
        f"{f' with wrong input ({report.wrong})' if report.wrong else ''}"
        f"{f' on {report.step.lane!r}' if report.step.lane else ''}"
        f" -> {response.get('id', '-')} {report.terminal} [{kinds}], "
        f"context of {len(report.context)} items"
    )


@dataclass
class Coverage:
    """What the programs a check ran covered, for the summary a passing run prints."""

    programs: int = 0
    turns: int = 0
    lanes: set[str] = field(default_factory=set)
    #: Steps by kind: continue, fork, fresh, recover, warm-up.
    steps: Counter[str] = field(default_factory=Counter)
    #: Wrong-input turns by kind.
    wrong_inputs: Counter[str] = field(default_factory=Counter)
    wrong_input_programs: int = 0
    #: Turns whose answer was compared with HTTP's.
    compared: int = 0
    #: Whether the openai SDK's models validated output items (None: not asked to).
    sdk_validated: bool | None = None
    strict: bool = False

    def add(self, report: Report) -> None:
        """Count a passing program's turns."""
        self.programs += 1
        self.turns += len(report.turns)
        if any(turn.wrong for turn in report.turns):
            self.wrong_input_programs += 1
        for turn in report.turns:
            step = turn.step
            self.lanes.add("default" if step.lane is None else repr(step.lane))
            self.steps["warm-up" if not step.generate else step.action] += 1
            if turn.wrong:
                self.wrong_inputs[turn.wrong] += 1
            self.compared += turn.compared

    def summary(self) -> str:
        """A few lines telling what was covered."""
        if not self.programs:
            return "no program ran"
        steps = ", ".join(
            f"{self.steps[kind]} {kind}"
            for kind in ("continue", "fork", "fresh", "recover", "warm-up")
            if self.steps[kind]
        )
        wrong = ", ".join(f"{count} {kind}" for kind, count in sorted(self.wrong_inputs.items()))
        if self.sdk_validated is None:
            sdk = "not asked for (validate_output=False)"
        elif self.sdk_validated:
            sdk = "yes"
        else:
            sdk = "NO: the openai SDK is not installed (pip install openai)"
        return "\n".join(
            [
                f"{self.programs} programs passed, {self.turns} turns on "
                f"{len(self.lanes)} lanes ({', '.join(sorted(self.lanes))})",
                f"steps: {steps}",
                f"wrong-input turns: {sum(self.wrong_inputs.values())} in "
                f"{self.wrong_input_programs} programs" + (f" ({wrong})" if wrong else ""),
                f"answers compared with HTTP's: {self.compared}",
                f"output items validated with the openai SDK's models: {sdk}",
                f"strict event fields: {'on' if self.strict else 'off'}",
            ]
        )

    def __str__(self) -> str:
        return self.summary()
