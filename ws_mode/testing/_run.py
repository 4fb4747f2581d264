"""One run of a conversation program on one socket: send each turn, collect its events and the
handler's calls, check both, and keep the responses later steps build on.

The socket is the tools' client (`ws_mode.testing._client`, which needs websockets): the check
imports this module when a program runs.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from websockets.exceptions import InvalidHandshake

from .._protocol import SUCCESS_EVENTS
from .._settings import FullContext
from ._answers import IDS, Answer, AnswerCheck, http_answer, socket_answer
from ._client import FrameError, SocketClosed, SyncSocket, connect, socket_url
from ._diff import short
from ._expected import Node, check_calls, plan_turn
from ._program import Step
from ._recorder import Recorder
from ._report import (
    CompatibilityError,
    NondeterminismError,
    NotDeterministic,
    Report,
    TurnFailed,
    TurnReport,
    turn_line,
)
from ._validation import check_events, check_type, error_code, frame_failure


@dataclass(frozen=True)
class RunOptions:
    """What a run needs of its check's options (see `CompatibilityCheck`)."""

    turn_timeout: float
    settle: float
    allow_errors: bool
    validate_output: bool
    #: The middleware's `full_context`, when the kit knows it.
    mode: FullContext | None
    strict: bool = False
    compare_answers: bool = True
    #: Fields left out of the answer comparison: ids, and those the handler randomizes.
    ignored: frozenset[str] = IDS
    require_history: bool = False
    #: Where plain HTTP reaches the handler, and the headers it needs (the handshake's).
    http_path: str = "/v1/responses"
    http_headers: Mapping[str, str] = field(default_factory=dict)
    #: Whether the openai SDK's models validate output items in this run.
    sdk_validated: bool = False


def run_program(
    options: RunOptions,
    recorder: Recorder,
    token: str,
    steps: Sequence[Step],
    *,
    base_url: str,
    path: str,
    headers: Mapping[str, str],
) -> Report:
    """Run `steps` on a new socket at `base_url` + `path`, with `headers` on the handshake."""
    try:
        socket = connect(base_url, path, headers=headers, open_timeout=options.turn_timeout)
    except (InvalidHandshake, OSError) as exc:
        url = socket_url(base_url, path)
        raise CompatibilityError(f"the server refused the socket at {url}: {exc}") from None
    with socket:
        return ProgramRun(options, recorder, socket, token, tuple(steps), base_url).run()


class ProgramRun:
    """Runs `steps` on `socket`; the recorder's calls tagged `token` are this run's."""

    def __init__(
        self,
        options: RunOptions,
        recorder: Recorder,
        socket: SyncSocket,
        token: str,
        steps: tuple[Step, ...],
        base_url: str = "",
    ) -> None:
        self.base_url = base_url
        self.options = options
        self.answers = AnswerCheck(
            self._ask,
            compare=options.compare_answers,
            ignored=options.ignored,
            require_history=options.require_history,
            mode=options.mode,
        )
        self.recorder = recorder
        self.socket = socket
        self.token = token
        self.steps = steps
        self.nodes: list[Node] = []
        self.turns: list[TurnReport] = []
        # The turn being checked, for failure messages.
        self.index: int | None = None
        self.request: dict[str, Any] | None = None
        self.events: list[dict[str, Any]] = []

    def run(self) -> Report:
        """Run every step; raise `CompatibilityError` at the first failed check."""
        try:
            for index, step in enumerate(self.steps):
                self.index, self.events = index, []
                self.turns.append(self._turn(index, step))
            self._stray(wait=self.options.settle)
            extra = self.recorder.take(self.token)
            if extra:
                self.index = len(self.steps) - 1
                raise TurnFailed(
                    f"the handler was called {len(extra)} more time(s) after the last turn ended",
                    "first extra call's input: " + short(extra[0].context),
                )
        except TurnFailed as failure:
            raise self._error(failure) from None
        return Report(self.turns, sdk_validated=self.options.sdk_validated)

    def _turn(self, index: int, step: Step) -> TurnReport:
        plan = plan_turn(step, self.nodes)
        self.request = plan.request
        self.socket.send(plan.request)
        events = self._receive()
        # What the handler received first: a wrong context often makes it fail.
        calls = self.recorder.take(self.token)
        started = events[0]["type"] == "response.created"
        check_calls(step, plan, calls, started=started, token=self.token, mode=self.options.mode)
        response, output = check_events(
            step,
            plan.request,
            events,
            earlier={node.id: node.turn for node in self.nodes},
            allow_errors=self.options.allow_errors or plan.wrong is not None,
            validate_output=self.options.validate_output,
            strict=self.options.strict,
        )
        self._barrier()
        compared = self.answers.check(step, plan, socket_answer(events, output), bool(calls))
        if events[-1]["type"] in SUCCESS_EVENTS and response is not None:
            self.nodes.append(Node(str(response["id"]), step.lane, plan.context, output, index))
        elif (
            plan.parent is not None
            and plan.request.get("previous_response_id") is not None
            and (
                plan.parent.lane == step.lane
                or error_code(events[-1]) == "previous_response_not_found"
            )
        ):
            # A failed continuation on the parent's own lane drops the parent
            # (docs/protocol.md, "Conversation state").
            plan.parent.evicted = True
        return TurnReport(
            index,
            step,
            plan.request,
            events,
            response,
            output,
            plan.context,
            calls,
            wrong=plan.wrong,
            compared=compared,
        )

    def _ask(self, body: dict[str, Any]) -> Answer:
        """The handler's answer to `body` over plain HTTP."""
        options = self.options
        try:
            return http_answer(
                self.base_url, options.http_path, options.http_headers, body, options.turn_timeout
            )
        except (OSError, TimeoutError) as exc:
            raise TurnFailed(
                f"the HTTP request the answer is compared with failed: {exc!r}",
                "sent: " + short(body, 400),
            ) from None

    def _receive(self) -> list[dict[str, Any]]:
        """The turn's events, up to its terminal event."""
        timeout = self.options.turn_timeout
        silent = (
            f"no terminal event within {timeout:g} s "
            "(response.completed, response.incomplete, response.failed or error)"
        )
        with _reading(silent, "the server closed the socket during the turn"):
            for event in self.socket.iter_turn(timeout=timeout):
                self.events.append(check_type(event))
        return self.events

    def _barrier(self) -> None:
        """Send a `response.steer` for a response that does not exist: the server answers
        `response.steer.failed` after everything it sent before, so any other frame that
        arrives first was sent after the turn's terminal event."""
        marker = "resp_ws_mode_check_" + secrets.token_hex(6)
        self.socket.send({"type": "response.steer", "previous_response_id": marker, "input": "-"})
        silent = (
            "the server did not answer a response.steer for an unknown response "
            '(it must answer response.steer.failed, docs/protocol.md, "response.steer")'
        )
        with _reading(silent, "the server closed the socket after the turn"):
            event = check_type(self.socket.receive(self.options.turn_timeout))
        steered = event.get("steer")
        if not (
            event["type"] == "response.steer.failed"
            and isinstance(steered, dict)
            and steered.get("previous_response_id") == marker
        ):
            raise TurnFailed(
                "an event arrived after the turn's terminal event", "stray event: " + short(event)
            )

    def _stray(self, wait: float) -> None:
        """Wait `wait` seconds after the last turn for events sent late."""
        try:
            event = self.socket.receive(wait)
        except (TimeoutError, SocketClosed):
            return
        except FrameError as exc:
            raise frame_failure(exc.kind, exc.frame) from None
        raise TurnFailed(
            "an event arrived after the turn's terminal event",
            "stray event: " + short(check_type(event)),
        )

    def _error(self, failure: TurnFailed) -> CompatibilityError:
        """The error telling where `failure` happened: the turn, what it sent and received,
        and how the conversation got there."""
        index = self.index
        step = self.steps[index] if index is not None and index < len(self.steps) else None
        lines: list[str] = []
        if self.request is not None and index is not None:
            lines.append("sent: " + short(self.request, 400))
        if self.events:
            types = [str(event.get("type")) for event in self.events]
            if len(types) > 12:
                types = [*types[:5], f"… {len(types) - 10} more …", *types[-5:]]
            lines.append("received: " + ", ".join(types))
        earlier = self.turns[-8:] if index is None else self.turns[:index][-8:]
        if earlier:
            lines.append("earlier turns:")
            lines.extend("  " + turn_line(report) for report in earlier)
        kind = NondeterminismError if isinstance(failure, NotDeterministic) else CompatibilityError
        return kind(
            failure.problem,
            turn=index,
            step=step,
            steps=len(self.steps),
            details=failure.details,
            context="\n".join(lines),
        )


@contextlib.contextmanager
def _reading(silent: str, closed: str) -> Iterator[None]:
    """Fail the turn on what the socket raises while the kit reads: `silent` when nothing came
    in time, `closed` (and how) when the server closed the socket, or a frame's problem."""
    try:
        yield
    except TimeoutError:
        raise TurnFailed(silent) from None
    except SocketClosed as exc:
        raise TurnFailed(f"{closed}: {exc}") from None
    except FrameError as exc:
        raise frame_failure(exc.kind, exc.frame) from None
