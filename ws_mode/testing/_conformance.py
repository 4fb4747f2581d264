"""The conformance suite's case model and runner: WebSocket mode's rules as named cases, run
against any endpoint.

A :class:`ConformanceCase` has a stable name (``lanes.stream_id_echoed``), the rule it checks in
a sentence and where that rule is written (OpenAI's WebSocket mode or steering guide, or a
section of docs/protocol.md). It runs against a live endpoint through a :class:`Probe`, which
opens sockets with the kit's one client (:mod:`._client`), reads turns and checks their events
with the kit's validators (:mod:`._validation`). A case ends as a :class:`CaseResult`:
``passed`` (with what was seen), ``failed`` (with what was seen instead) or ``skipped`` (why:
the server may legitimately not support steering, the run was not told how to trigger a 429
or how long the server's sockets live, the model would not call a tool ...).

Cases that need the server's cooperation (a tool call, a stream slow enough to steer into)
ask for it as any client would (tools with ``tool_choice: "required"``, a long answer) and
skip when the endpoint does not give it. The cases themselves sit by rule family in
``_conformance_lanes``, ``_conformance_state``, ``_conformance_steering`` and
``_conformance_errors``; :data:`CONFORMANCE_CASES` (in :mod:`._conformance_cases`) lists them
all. Needs websockets.
"""

from __future__ import annotations

import contextlib
import fnmatch
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from .._protocol import TERMINAL_EVENTS
from ._client import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_PATH,
    FrameError,
    MessageTooLarge,
    ReadLimitExceeded,
    SocketClosed,
    SyncSocket,
    check_received,
    connect,
)
from ._program import Step
from ._report import TurnFailed
from ._validation import check_events, check_type, frame_failure

Outcome = Literal["passed", "failed", "skipped"]

#: The events that answer a `response.steer`; they are not part of any response's stream.
STEER_EVENTS: Final = frozenset(
    {"response.steer.accepted", "response.steer.pending", "response.steer.failed"}
)
#: Asks for a long answer: a stream slow enough to steer into.
LONG_ANSWER: Final = "Write a long story, at least 300 words, about a lighthouse keeper."
#: At most this many rounds of tool calls are answered while waiting for a message to stream.
TOOL_ROUNDS: Final = 4


class CaseSkipped(Exception):
    """The case cannot run against this endpoint, legitimately; the message says why."""


class CaseFailed(Exception):
    """The endpoint broke the case's rule; the message says what was seen."""


class ConformanceFailure(AssertionError):
    """Raised by :func:`check_conformance_case` when a case fails: its result's detail."""

    def __init__(self, result: CaseResult) -> None:
        super().__init__(
            f"{result.name} failed: {result.detail}\n  rule: {result.rule} ({result.source})"
        )
        self.result = result


@dataclass(frozen=True)
class ConformanceOptions:
    """How to reach and probe the endpoint.

    ``path`` is the socket's path under the base URL, ``headers`` go on every handshake,
    ``model`` is sent in every ``response.create`` (none when None: the server's default),
    ``timeout`` bounds a handshake and each turn, in seconds. ``connection_lifetime`` is how
    long the server keeps a socket (seconds): the lifetime case waits that long, and is
    skipped without it. ``rate_limited_request`` holds fields of a ``response.create`` the
    server answers with 429 (and its rate-limit headers): the ``error.headers`` case is skipped
    without it. ``create_fields`` are sent in every ``response.create`` (``{"store": false}``,
    a model's settings), under the case's own fields. ``max_message_bytes`` bounds each
    message read from the endpoint, and the most one socket's messages may total: more
    fails the case (:class:`MessageTooLarge`, :class:`ReadLimitExceeded`)."""

    path: str = DEFAULT_PATH
    headers: Mapping[str, str] = field(default_factory=dict)
    model: str | None = None
    timeout: float = 30.0
    connection_lifetime: float | None = None
    rate_limited_request: Mapping[str, Any] | None = None
    create_fields: Mapping[str, Any] = field(default_factory=dict)
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES


@dataclass(frozen=True)
class CaseResult:
    """How one case went: ``outcome`` and ``detail`` (what was seen, or why it was skipped)."""

    name: str
    rule: str
    source: str
    outcome: Outcome
    detail: str
    seconds: float = 0.0


@dataclass(frozen=True)
class ConformanceCase:
    """A rule of WebSocket mode as a case: ``name``, the ``rule`` in a sentence, its
    ``source``, and the check (told a :class:`Probe`, it returns what it saw, or raises
    :class:`CaseFailed` or :class:`CaseSkipped`)."""

    name: str
    rule: str
    source: str
    check: Callable[[Probe], str] = field(repr=False, compare=False)

    def __str__(self) -> str:
        return self.name

    def run(self, base_url: str, options: ConformanceOptions | None = None) -> CaseResult:
        """Run the case against the server at ``base_url`` (its origin, ``http://host:8000``:
        the socket opens at the options' ``path`` under it)."""
        started = time.perf_counter()
        try:
            with Probe(base_url, options or ConformanceOptions()) as probe:
                outcome: Outcome = "passed"
                detail = self.check(probe)
        except CaseSkipped as exc:
            outcome, detail = "skipped", str(exc)
        except CaseFailed as exc:
            outcome, detail = "failed", str(exc)
        except TurnFailed as exc:
            first = exc.details.splitlines()[0] if exc.details else ""
            outcome, detail = "failed", exc.problem + (f" ({first})" if first else "")
        except TimeoutError:
            outcome = "failed"
            detail = f"no answer within {(options or ConformanceOptions()).timeout:g} s"
        except (MessageTooLarge, ReadLimitExceeded) as exc:
            outcome, detail = "failed", str(exc)
        except SocketClosed as exc:
            outcome, detail = "failed", f"the socket closed: {str(exc).partition('; then')[0]}"
        except OSError as exc:
            outcome, detail = "failed", f"could not connect: {exc}"
        except Exception as exc:  # a handshake refused, or anything the case did not expect
            outcome, detail = "failed", f"{type(exc).__name__}: {exc}"
        took = time.perf_counter() - started
        return CaseResult(self.name, self.rule, self.source, outcome, detail, took)


def select_cases(
    cases: Sequence[ConformanceCase], patterns: Iterable[str] = ()
) -> list[ConformanceCase]:
    """The cases whose name matches one of the shell-style ``patterns`` (``lanes.*``,
    ``*steer*``); all of them when there are none."""
    wanted = list(patterns)
    if not wanted:
        return list(cases)
    return [case for case in cases if any(fnmatch.fnmatchcase(case.name, p) for p in wanted)]


def run_cases(
    base_url: str,
    cases: Sequence[ConformanceCase],
    options: ConformanceOptions | None = None,
    on_result: Callable[[CaseResult], None] | None = None,
) -> list[CaseResult]:
    """Run ``cases`` one after the other against ``base_url``; ``on_result`` hears each
    result as it comes."""
    results = []
    for case in cases:
        result = case.run(base_url, options)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def conformance_summary(results: Sequence[CaseResult]) -> str:
    """``N passed, N failed, N skipped``."""
    counts = dict.fromkeys(("passed", "failed", "skipped"), 0)
    for result in results:
        counts[result.outcome] += 1
    return ", ".join(f"{count} {outcome}" for outcome, count in counts.items())


# ----------------------------------------------------------------------------- turns


@dataclass
class Turn:
    """One response's events on one lane, up to its terminal one, checked as the kit checks a
    turn (errors allowed): its final ``response`` (None after an ``error``) and ``output``."""

    request: dict[str, Any]
    events: list[dict[str, Any]]
    response: dict[str, Any] | None
    output: list[dict[str, Any]]

    @property
    def last(self) -> dict[str, Any]:
        """The terminal event."""
        return self.events[-1]

    @property
    def error(self) -> dict[str, Any] | None:
        """The ``error`` event that ended the turn, if it did."""
        return self.last if self.last.get("type") == "error" else None

    @property
    def finished(self) -> bool:
        """Whether the response completed or ended incomplete (not failed, no error)."""
        return self.last.get("type") in ("response.completed", "response.incomplete")

    @property
    def id(self) -> str:
        """The response's id; :class:`CaseFailed` when the turn has none."""
        if self.response is None:
            raise CaseFailed(f"expected a response, got {describe(self.last)}")
        return str(self.response["id"])

    def calls(self) -> list[dict[str, Any]]:
        """The function calls in the output (the client must answer them)."""
        return [item for item in self.output if item.get("type") == "function_call"]

    def usage_input_tokens(self) -> int | None:
        """``usage.input_tokens`` of the response, when the server reports it."""
        usage = (self.response or {}).get("usage")
        tokens = usage.get("input_tokens") if isinstance(usage, dict) else None
        return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None


def describe(event: Mapping[str, Any]) -> str:
    """An event in a few words: its type, and an error's status and code."""
    kind = str(event.get("type"))
    error = event.get("error")
    if kind in ("error", "response.steer.failed") and isinstance(error, dict):
        return f"{kind} {event.get('status', '')} {error.get('code')!r}: " + str(
            error.get("message", "")
        )[:160].replace("\n", " ")
    if kind in TERMINAL_EVENTS and isinstance(event.get("response"), dict):
        response = event["response"]
        failure = response.get("error") or response.get("incomplete_details")
        return kind + (f" ({failure})" if failure else "")
    return kind


class Probe:
    """What a case runs with: the endpoint and the options, sockets opened for the case
    (closed when it ends), and helpers to send requests and read turns."""

    def __init__(self, base_url: str, options: ConformanceOptions) -> None:
        self.base_url = base_url
        self.options = options
        self._sockets = contextlib.ExitStack()

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._sockets.close()

    @property
    def timeout(self) -> float:
        """How long a handshake or one response may take, in seconds."""
        return self.options.timeout

    def socket(self) -> SyncSocket:
        """A new socket to the endpoint, closed when the case ends."""
        socket = connect(
            self.base_url,
            self.options.path,
            headers=self.options.headers,
            open_timeout=self.options.timeout,
            max_message_bytes=self.options.max_message_bytes,
        )
        return self._sockets.enter_context(socket)

    def create(self, input: Any = "Say hello.", **fields: Any) -> dict[str, Any]:
        """A ``response.create`` of ``input`` (a string is one user message), the model asked
        for, the options' ``create_fields`` and ``fields``."""
        request: dict[str, Any] = {"type": "response.create"}
        if self.options.model is not None:
            request["model"] = self.options.model
        request.update(self.options.create_fields)
        request["input"] = input
        request.update(fields)
        return request

    def receive(self, socket: SyncSocket, timeout: float | None = None) -> dict[str, Any]:
        """The next event, checked to be one; TimeoutError after ``timeout`` (default: the
        options' timeout). :class:`ReadLimitExceeded` once the socket's messages pass the
        options' ``max_message_bytes`` in all: a case's socket carries a few short turns,
        and every case reads through here, whatever it keeps."""
        try:
            event = check_type(socket.receive(self.timeout if timeout is None else timeout))
        except FrameError as exc:
            raise frame_failure(exc.kind, exc.frame) from None
        check_received(socket, self.options.max_message_bytes)
        return event

    def read_until(
        self,
        socket: SyncSocket,
        done: Callable[[dict[str, Any]], bool],
        seen: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Read events (appended to ``seen``) until one satisfies ``done``; return it."""
        deadline = time.monotonic() + self.timeout
        while True:
            event = self.receive(socket, max(0.0, deadline - time.monotonic()))
            if seen is not None:
                seen.append(event)
            if done(event):
                return event

    def start_streaming(
        self, socket: SyncSocket, request: dict[str, Any], what: str = "the response"
    ) -> tuple[str, list[dict[str, Any]]]:
        """Send ``request`` and read up to its ``response.created`` (the set-up of every case
        that acts on a response still streaming): the response's id and the events read.
        :class:`CaseFailed`, naming ``what``, when the response ends first."""
        socket.send(request)
        seen: list[dict[str, Any]] = []
        created = self.read_until(
            socket, lambda event: event["type"] in ("response.created", *TERMINAL_EVENTS), seen
        )
        if created["type"] != "response.created":
            raise CaseFailed(f"{what} ended with {describe(created)}")
        return str(created["response"]["id"]), seen

    def turn(
        self,
        socket: SyncSocket,
        request: dict[str, Any],
        *,
        send: bool = True,
        before: Sequence[dict[str, Any]] = (),
        steers: list[dict[str, Any]] | None = None,
    ) -> Turn:
        """Send ``request`` (unless ``send`` is False) and read its events up to the terminal
        one, after the events ``before`` already read. Only it runs on the socket, so an event
        of another lane fails the lane check. Steering events go to ``steers`` (a
        :class:`CaseFailed` when they come and ``steers`` is None)."""
        if send:
            socket.send(request)
        events = [event for event in before if event.get("type") not in STEER_EVENTS]
        for event in before:
            if event.get("type") in STEER_EVENTS:
                self._steer_event(event, steers)
        deadline = time.monotonic() + self.timeout
        while not events or events[-1]["type"] not in TERMINAL_EVENTS:
            event = self.receive(socket, max(0.0, deadline - time.monotonic()))
            if event["type"] in STEER_EVENTS:
                self._steer_event(event, steers)
            else:  # one request runs: an event of another lane is this one's, mislabelled
                events.append(event)
        return self.checked(request, events)

    @staticmethod
    def _steer_event(event: dict[str, Any], steers: list[dict[str, Any]] | None) -> None:
        if steers is None:
            raise CaseFailed(f"a steering event came though nothing was steered: {describe(event)}")
        steers.append(event)

    def at_once(self, socket: SyncSocket, requests: Sequence[dict[str, Any]]) -> list[Turn]:
        """Send ``requests`` (each on its own lane) one after the other without waiting, and
        read until each has its terminal event; their turns, in order."""
        for request in requests:
            socket.send(request)
        lanes = {request.get("stream_id"): request for request in requests}
        if len(lanes) != len(requests):
            raise ValueError("at_once needs one request a lane")
        events: dict[Any, list[dict[str, Any]]] = {lane: [] for lane in lanes}
        open_lanes = set(lanes)
        deadline = time.monotonic() + self.timeout
        while open_lanes:
            event = self.receive(socket, max(0.0, deadline - time.monotonic()))
            lane = event.get("stream_id")
            if lane not in open_lanes:
                raise CaseFailed(f"an event with stream_id {lane!r} came: {describe(event)}")
            events[lane].append(event)
            if event["type"] in TERMINAL_EVENTS:
                open_lanes.discard(lane)
        return [self.checked(lanes[lane], events[lane]) for lane in lanes]

    def checked(self, request: dict[str, Any], events: list[dict[str, Any]]) -> Turn:
        """A turn of ``events`` (its terminal one last), checked by the kit's validators."""
        # `generate` null or absent generates (the SDKs type it `Optional[bool]`); only false
        # is a warm-up, as ws_mode itself reads it.
        step = Step(lane=request.get("stream_id"), generate=request.get("generate") is not False)
        response, output = check_events(
            step, request, events, earlier={}, allow_errors=True, validate_output=False
        )
        return Turn(request, events, response, output)

    def finished_turn(self, socket: SyncSocket, request: dict[str, Any], what: str) -> Turn:
        """:meth:`turn`, which must finish: :class:`CaseFailed` with what ended it otherwise."""
        turn = self.turn(socket, request)
        if not turn.finished:
            raise CaseFailed(f"{what} ended with {describe(turn.last)}")
        return turn

    def follow_up(self, turn: Turn, text: str = "Thanks. Say goodbye.") -> list[dict[str, Any]]:
        """The input that continues ``turn``: an output for each function call it made, or a
        user message when it made none."""
        calls = turn.calls()
        if calls:
            return [
                {"type": "function_call_output", "call_id": call["call_id"], "output": "found"}
                for call in calls
            ]
        return [user_message(text)]

    def expect_error(
        self,
        turn: Turn,
        code: str,
        *,
        status: int | None = 400,
        param: str | None = None,
        what: str,
    ) -> dict[str, Any]:
        """The turn's error event, which must carry ``code`` (and ``status``, ``param``)."""
        error = turn.error
        if error is None:
            raise CaseFailed(f"{what} was answered with {describe(turn.last)}, not an error")
        nested = error.get("error") or {}
        if nested.get("code") != code:
            raise CaseFailed(f"{what}: expected error {code!r}, got {describe(error)}")
        if status is not None and error.get("status") != status:
            raise CaseFailed(
                f"{what}: {code} came with status {error.get('status')!r}, not {status}"
            )
        if param is not None and nested.get("param") != param:
            raise CaseFailed(
                f"{what}: {code} came with param {nested.get('param')!r}, not {param!r}"
            )
        return error

    def still_works(self, socket: SyncSocket, after: str) -> None:
        """A warm-up on ``socket`` completes: the socket survived ``after``."""
        turn = self.turn(socket, self.create("Still there?", generate=False))
        if turn.last.get("type") != "response.completed":
            raise CaseFailed(f"after {after}, a warm-up ended with {describe(turn.last)}")


def user_message(text: str) -> dict[str, Any]:
    """A user message item of ``text``."""
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def message_streaming(
    probe: Probe, socket: SyncSocket, request: dict[str, Any], into: str = "steer into"
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Send ``request`` and read until a message item starts streaming
    (``response.output_item.added``), answering the tool calls of up to :data:`TOOL_ROUNDS`
    responses before it, on the request's lane: the request whose response streams it, and its
    events read so far.
    Skips the case when no message streams (``into`` says what for)."""
    for _round in range(TOOL_ROUNDS):
        socket.send(request)
        seen: list[dict[str, Any]] = []
        event = probe.read_until(
            socket,
            lambda event: (
                event["type"] in TERMINAL_EVENTS
                or (
                    event["type"] == "response.output_item.added"
                    and (event.get("item") or {}).get("type") == "message"
                )
            ),
            seen,
        )
        if event["type"] not in TERMINAL_EVENTS:
            return request, seen
        turn = probe.checked(request, seen)
        if not turn.finished or not turn.calls():
            raise CaseSkipped(
                f"no message ever streamed to {into}: the turn ended with {describe(event)}"
            )
        lane = {"stream_id": request["stream_id"]} if "stream_id" in request else {}
        request = probe.create(probe.follow_up(turn), previous_response_id=turn.id, **lane)
    raise CaseSkipped(f"the model only called tools in {TOOL_ROUNDS} rounds")
