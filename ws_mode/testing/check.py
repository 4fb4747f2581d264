"""The check: drive a conversation program over a real socket and compare, turn by turn, what
the handler received with what an HTTP client keeping the full history would have sent.

The expected context of every turn is built from the outputs the socket actually returned on
earlier turns, so handlers whose answers change from run to run (a real model) are checked as
well as deterministic ones: nothing is compared against a second run.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
import threading
import time
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..middleware import FullContext, Settings, WebSocketModeMiddleware
from ..turn import turn
from ._server import ServerName, ServerThread
from .program import Conversation, Step

__all__ = [
    "CheckOptions",
    "CompatibilityCheck",
    "CompatibilityError",
    "RecordedCall",
    "Report",
    "TurnReport",
    "check_conversation",
]

#: The handshake header that tags a run's handler calls (the handler sees the handshake's
#: headers on every turn).
RUN_HEADER = "x-ws-mode-check"
TERMINAL_EVENTS = frozenset(
    {"response.completed", "response.incomplete", "response.failed", "error"}
)
RESPONSE_EVENTS = frozenset(
    {
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.completed",
        "response.incomplete",
        "response.failed",
    }
)
TERMINAL_STATUS = {
    "response.completed": "completed",
    "response.incomplete": "incomplete",
    "response.failed": "failed",
}
# Fields of a create the handler never receives as they are.
_NOT_FORWARDED = frozenset({"type", "stream_id", "generate", "input", "previous_response_id"})
_SHORT = 240  # characters of a value shown in a failure message

Item = dict[str, Any]


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


@dataclass(frozen=True)
class RecordedCall:
    """One call of the handler, as it received it.

    `body` is the JSON request body; `context` the whole context: the body's `input` as items
    (a string is one user message), or `Turn.history()` when the body held only the new items
    (`full_context=False`, a cache-aware turn of `full_context="on_miss"`).
    """

    body: Any
    context: Any
    full_context: bool
    headers: dict[str, str]
    has_turn: bool


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
        return "\n".join(_turn_line(report) for report in self.turns)

    def __str__(self) -> str:
        return self.summary()


class CheckOptions(TypedDict, total=False):
    """The keyword options of `CompatibilityCheck` (and of the `ws_mode_check` fixture)."""

    full_context: FullContext | None
    server: ServerName
    middleware_options: Mapping[str, Any] | None
    middleware: Callable[[ASGIApp], ASGIApp] | None
    headers: Mapping[str, str] | None
    path: str | None
    validate_output: bool
    allow_errors: bool
    turn_timeout: float
    settle: float


class CompatibilityCheck:
    """Serves `app` behind WebSocket mode under a real server, and checks programs against it.

    Use it as a context manager (the server starts once) and call `run(program)` for each
    program, e.g. in a hypothesis test. The handler is wrapped with a recorder that captures
    what each call receives; the app to serve is built around it:

    - by default, `WebSocketModeMiddleware(recorder, full_context=..., **middleware_options)`;
    - when `app` already contains a `WebSocketModeMiddleware` (`app.add_middleware(...)`, a
      Starlette middleware list, or the middleware itself), the recorder goes inside that one
      and your options stay (`full_context`, when given, overrides its mode during the check);
    - with `middleware=`, `middleware(recorder)` (to check extra layers around the socket).

    `headers` go on the handshake (your auth). `validate_output` checks output items with the
    openai SDK's models when the SDK is installed. `allow_errors=True` accepts turns that end
    in `error` or `response.failed` (still checked for validity); by default they fail the
    check. `turn_timeout` bounds each turn. After each turn the kit sends a `response.steer`
    for an unknown response and waits for its `response.steer.failed`: any other frame before
    it was sent after the turn's terminal event. `settle` adds a wait after the last turn,
    for events a server sends late from a background task.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        full_context: FullContext | None = None,
        server: ServerName = "uvicorn",
        middleware_options: Mapping[str, Any] | None = None,
        middleware: Callable[[ASGIApp], ASGIApp] | None = None,
        headers: Mapping[str, str] | None = None,
        path: str | None = None,
        validate_output: bool = True,
        allow_errors: bool = False,
        turn_timeout: float = 60.0,
        settle: float = 0.0,
    ) -> None:
        if full_context not in (None, "always", "on_miss"):
            raise ValueError(f"full_context must be 'always', 'on_miss' or None: {full_context!r}")
        if middleware is not None and (full_context is not None or middleware_options):
            raise ValueError(
                "middleware= builds the served app itself: configure full_context and the "
                "middleware's options inside it"
            )
        if turn_timeout <= 0 or settle < 0:
            raise ValueError("turn_timeout must be > 0 and settle >= 0")
        self.app = app
        self.full_context = full_context
        self.server = server
        self.middleware_options = dict(middleware_options or {})
        self.middleware = middleware
        self.headers = {name.lower(): value for name, value in (headers or {}).items()}
        self.path = path
        self.validate_output = validate_output
        self.allow_errors = allow_errors
        self.turn_timeout = turn_timeout
        self.settle = settle
        #: The middleware's mode, when the kit knows it (None with `middleware=`).
        self.mode: FullContext | None = None
        self.base_url = ""
        self._recorder: _Recorder | None = None
        self._server: ServerThread | None = None
        self._embedded: tuple[WebSocketModeMiddleware, Settings] | None = None

    # Lifetime.

    def __enter__(self) -> CompatibilityCheck:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        """Build the served app and start the server (once)."""
        if self._server is not None:
            return
        served, socket_path = self._build()
        if self.path is None:
            self.path = socket_path
        self._server = ServerThread(served, self.server)
        try:
            self.base_url = self._server.start()
        except BaseException:
            self._server = None
            self._restore()
            raise

    def close(self) -> None:
        """Stop the server and undo any change made to the app."""
        server, self._server = self._server, None
        try:
            if server is not None:
                server.stop()
        finally:
            self._restore()

    def _build(self) -> tuple[ASGIApp, str]:
        if self.middleware is not None:
            self._recorder = _Recorder(self.app)
            return self.middleware(self._recorder), "/v1/responses"
        found = find_middleware(self.app)
        if found is None:
            self.mode = self.full_context or "always"
            self._recorder = _Recorder(self.app)
            wrapped = WebSocketModeMiddleware(
                self._recorder, full_context=self.mode, **self.middleware_options
            )
            return wrapped, wrapped.settings.path
        if self.middleware_options:
            raise ValueError(
                "the app already contains a WebSocketModeMiddleware: configure it there, "
                "not with middleware_options"
            )
        original = found.settings
        if isinstance(original.app, _Recorder):
            raise RuntimeError("this app's WebSocketModeMiddleware is already under a check")
        self.mode = self.full_context or original.full_context
        self._recorder = _Recorder(original.app)
        found.settings = dataclasses.replace(original, app=self._recorder, full_context=self.mode)
        self._embedded = (found, original)
        return self.app, original.path

    def _restore(self) -> None:
        if self._embedded is not None:
            found, original = self._embedded
            found.settings = original
            self._embedded = None

    # Checking.

    def run(self, program: Conversation | Sequence[Step]) -> Report:
        """Run `program` on a new socket; raise `CompatibilityError` at the first difference."""
        from websockets.exceptions import InvalidHandshake
        from websockets.sync.client import connect

        steps = tuple(program.steps if isinstance(program, Conversation) else program)
        if not steps:
            raise ValueError("a program needs at least one step")
        if self._server is None:
            self.start()
        recorder = self._recorder
        assert recorder is not None
        token = secrets.token_hex(8)
        url = self.base_url.replace("http", "ws", 1) + (self.path or "/v1/responses")
        headers = {**self.headers, RUN_HEADER: token}
        try:
            socket = connect(
                url,
                additional_headers=headers,
                max_size=None,
                proxy=None,
                open_timeout=self.turn_timeout,
                close_timeout=2,
            )
        except (InvalidHandshake, OSError) as exc:
            raise CompatibilityError(f"the server refused the socket at {url}: {exc}") from None
        recorder.active.add(token)
        try:
            with socket:
                return _Run(self, recorder, socket, token, steps).run()
        finally:
            recorder.active.discard(token)
            recorder.take(token)  # forget what a failed run left behind


def check_conversation(
    app: ASGIApp,
    program: Conversation | Sequence[Step],
    **options: typing.Unpack[CheckOptions],
) -> Report:
    """Check one program against `app` (a server is started and stopped around it).

    For many programs (hypothesis), keep one `CompatibilityCheck` open instead.
    """
    with CompatibilityCheck(app, **options) as check:
        return check.run(program)


# The recorder.


class _Recorder:
    """Wraps the handler app; records what each ws_mode call receives, then calls it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._calls: list[tuple[str | None, RecordedCall]] = []
        #: The runs in progress; ws_mode calls without a run's header are recorded (as
        #: untagged, a failure) only while one is.
        self.active: set[str] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in scope.get("headers", [])
        }
        current = turn(scope)
        tag = headers.get(RUN_HEADER)
        if tag is None and (current is None or not self.active):
            await self.app(scope, receive, send)  # other traffic: not ours
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        try:
            body: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = raw.decode("utf-8", "replace")
        full = current is None or current.full_context
        if full:
            context = _as_items(body.get("input") if isinstance(body, dict) else None)
        else:
            assert current is not None
            context = orjson.loads(orjson.dumps(current.history()))
        call = RecordedCall(body, context, full, headers, current is not None)
        with self._lock:
            self._calls.append((tag, call))
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def take(self, token: str) -> list[RecordedCall]:
        """The calls of run `token` (and untagged calls) recorded since the last take."""
        with self._lock:
            taken = [call for tag, call in self._calls if tag in (token, None)]
            self._calls = [(tag, call) for tag, call in self._calls if tag not in (token, None)]
        return taken


# Running one program.


@dataclass
class _Node:
    """A finished response the program can build on."""

    id: str
    lane: str | None
    context: list[Item]
    output: list[Item]
    turn: int
    evicted: bool = False

    def history(self) -> list[Item]:
        return [*self.context, *self.output]


@dataclass
class _Plan:
    parent: _Node | None
    request: dict[str, Any]
    context: list[Item]


class _Run:
    def __init__(
        self,
        check: CompatibilityCheck,
        recorder: _Recorder,
        socket: Any,
        token: str,
        steps: tuple[Step, ...],
    ) -> None:
        self.check = check
        self.recorder = recorder
        self.socket = socket
        self.token = token
        self.steps = steps
        self.nodes: list[_Node] = []
        self.turns: list[TurnReport] = []
        self.ids: dict[str, int] = {}
        # The turn being checked, for failure messages.
        self.index: int | None = None
        self.request: dict[str, Any] | None = None
        self.events: list[dict[str, Any]] = []

    def run(self) -> Report:
        for index, step in enumerate(self.steps):
            self.index, self.events = index, []
            self.turns.append(self._turn(index, step))
        self._stray(wait=self.check.settle)
        extra = self.recorder.take(self.token)
        if extra:
            self.index = len(self.steps) - 1
            self._fail(
                f"the handler was called {len(extra)} more time(s) after the last turn ended",
                "first extra call's input: " + _short(extra[0].context),
            )
        return Report(self.turns)

    # One turn.

    def _turn(self, index: int, step: Step) -> TurnReport:
        plan = self._plan(step)
        self.request = plan.request
        self.socket.send(orjson.dumps(plan.request).decode())
        events = self._receive(step)
        # What the handler received first: a wrong context often makes it fail.
        calls = self.recorder.take(self.token)
        self._check_calls(step, plan, events, calls)
        response, output = self._check_events(step, plan, events)
        self._barrier()
        terminal = events[-1]["type"]
        if terminal in ("response.completed", "response.incomplete") and response is not None:
            node = _Node(str(response["id"]), step.lane, plan.context, output, index)
            self.nodes.append(node)
        elif (
            plan.parent is not None
            and plan.request.get("previous_response_id") is not None
            and (
                plan.parent.lane == step.lane
                or _error_code(events[-1]) == "previous_response_not_found"
            )
        ):
            # A failed continuation on the parent's own lane drops the parent (PROTOCOL.md §4).
            plan.parent.evicted = True
        return TurnReport(index, step, plan.request, events, response, output, plan.context, calls)

    def _plan(self, step: Step) -> _Plan:
        live = [node for node in self.nodes if not node.evicted]
        parent: _Node | None = None
        if step.action != "fresh" and live:
            if step.action == "continue":
                own = [node for node in live if node.lane == step.lane]
                parent = (own or live)[-1]
            else:
                parent = live[step.parent % len(live)]
        prefix = parent.history() if parent is not None else []
        new = _new_input(step, prefix)
        request: dict[str, Any] = {"type": "response.create", "model": step.model}
        request.update(_copy(dict(step.fields)))
        if step.instructions is not None:
            request["instructions"] = step.instructions
        if step.tools is not None:
            request["tools"] = _copy([dict(tool) for tool in step.tools])
        if step.action == "recover" and parent is not None:
            # The documented recovery: the whole context, previous_response_id null.
            request["input"] = _copy([*prefix, *_as_items(new)])
            request["previous_response_id"] = None
            context = _copy(request["input"])
        else:
            request["input"] = new
            if parent is not None:
                request["previous_response_id"] = parent.id
            context = _copy([*prefix, *_as_items(new)])
        if step.lane is not None:
            request["stream_id"] = step.lane
        if not step.generate:
            request["generate"] = False
        return _Plan(parent, request, context)

    def _receive(self, step: Step) -> list[dict[str, Any]]:
        from websockets.exceptions import ConnectionClosed

        deadline = time.monotonic() + self.check.turn_timeout
        while True:
            try:
                frame = self.socket.recv(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                self._fail(
                    f"no terminal event within {self.check.turn_timeout:g} s "
                    "(response.completed, response.incomplete, response.failed or error)"
                )
            except ConnectionClosed as exc:
                self._fail(f"the server closed the socket during the turn: {exc}")
            event = self._decode(frame)
            self.events.append(event)
            if event["type"] in TERMINAL_EVENTS:
                return self.events

    def _barrier(self) -> None:
        """Send a `response.steer` for a response that does not exist: the server answers
        `response.steer.failed` after everything it sent before, so any other frame that
        arrives first was sent after the turn's terminal event."""
        from websockets.exceptions import ConnectionClosed

        marker = "resp_ws_mode_check_" + secrets.token_hex(6)
        steer = {"type": "response.steer", "previous_response_id": marker, "input": "-"}
        self.socket.send(orjson.dumps(steer).decode())
        deadline = time.monotonic() + self.check.turn_timeout
        while True:
            try:
                frame = self.socket.recv(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                self._fail(
                    "the server did not answer a response.steer for an unknown response "
                    "(it must answer response.steer.failed, PROTOCOL.md §2)"
                )
            except ConnectionClosed as exc:
                self._fail(f"the server closed the socket after the turn: {exc}")
            event = self._decode(frame)
            steered = event.get("steer")
            if (
                event["type"] == "response.steer.failed"
                and isinstance(steered, dict)
                and steered.get("previous_response_id") == marker
            ):
                return
            self._fail(
                "an event arrived after the turn's terminal event", "stray event: " + _short(event)
            )

    def _stray(self, wait: float) -> None:
        """Wait `wait` seconds after the last turn for events sent late."""
        from websockets.exceptions import ConnectionClosed

        try:
            frame = self.socket.recv(timeout=wait)
        except (TimeoutError, ConnectionClosed):
            return
        event = self._decode(frame)
        self._fail(
            "an event arrived after the turn's terminal event", "stray event: " + _short(event)
        )

    def _decode(self, frame: Any) -> dict[str, Any]:
        if not isinstance(frame, str):
            self._fail("the server sent a binary frame; every event must be JSON in a text frame")
        try:
            event = orjson.loads(frame)
        except orjson.JSONDecodeError:
            hint = ""
            if frame.startswith(("event:", "data:")):
                hint = " (SSE framing leaked onto the socket)"
            self._fail("a frame is not JSON" + hint, "frame: " + _short(frame))
        if not isinstance(event, dict):
            self._fail("a frame is not a JSON object", "frame: " + _short(frame))
        if not isinstance(event.get("type"), str):
            self._fail("an event has no string 'type'", "event: " + _short(event))
        return event

    # The event stream.

    def _check_events(
        self, step: Step, plan: _Plan, events: list[dict[str, Any]]
    ) -> tuple[dict[str, Any] | None, list[Item]]:
        sent_previous = plan.request.get("previous_response_id")
        last_number: int | None = None
        response_id: str | None = None
        done_items: dict[int, Item] = {}
        for number, event in enumerate(events):
            kind = event["type"]
            where = f"event {number} ({kind})"
            if step.lane is None and "stream_id" in event:
                self._fail(
                    f"{where} carries a stream_id on the default lane",
                    f"stream_id: {event['stream_id']!r}",
                )
            if step.lane is not None and event.get("stream_id") != step.lane:
                self._fail(
                    f"{where} does not carry its lane's stream_id",
                    f"expected {step.lane!r}, got {event.get('stream_id')!r}",
                )
            sequence = event.get("sequence_number")
            if sequence is not None:
                if not isinstance(sequence, int) or isinstance(sequence, bool):
                    self._fail(f"{where} has a sequence_number that is not an integer")
                if last_number is not None and sequence <= last_number:
                    self._fail(
                        f"{where}: sequence numbers do not increase",
                        f"{sequence} follows {last_number}",
                    )
                last_number = sequence
            if kind == "response.created" and number != 0:
                self._fail(f"{where}: response.created is not the first event of the turn")
            if kind == "error":
                self._check_error(where, event)
            if kind in RESPONSE_EVENTS:
                response = event.get("response")
                if not isinstance(response, dict) or not isinstance(response.get("id"), str):
                    self._fail(f"{where} has no response object with an id")
                if response_id is None:
                    response_id = response["id"]
                elif response["id"] != response_id:
                    self._fail(
                        f"{where}: the response id changed within the turn",
                        f"{response['id']!r} after {response_id!r}",
                    )
                if response.get("object", "response") != "response":
                    self._fail(f"{where}: the response object's 'object' is not 'response'")
                if response.get("previous_response_id") != sent_previous:
                    self._fail(
                        f"{where}: the response object does not echo the client's "
                        "previous_response_id",
                        f"sent {sent_previous!r}, the response says "
                        f"{response.get('previous_response_id')!r}",
                    )
            if kind == "response.output_item.done" and isinstance(event.get("item"), dict):
                index = event.get("output_index")
                done_items[index if isinstance(index, int) else len(done_items)] = event["item"]
        first, last = events[0]["type"], events[-1]["type"]
        if first != "response.created" and not (first == "error" and len(events) == 1):
            self._fail(
                "the turn does not start with response.created",
                "a turn is response.created ... terminal event, or one error event",
            )
        if last == "error" or last == "response.failed":
            if not self.check.allow_errors:
                self._fail(
                    f"the turn ended with {last} (pass allow_errors=True to accept errors)",
                    "terminal event: " + _short(events[-1], 600),
                )
            if last == "response.failed":
                failed = events[-1]["response"]
                if failed.get("status") != "failed":
                    self._fail(f"response.failed carries status {failed.get('status')!r}")
                return failed, []
            return None, []
        response = events[-1]["response"]
        if response_id in self.ids:
            self._fail(
                "the response id is not new",
                f"{response_id!r} was already returned by turn {self.ids[response_id]}",
            )
        self.ids[str(response_id)] = self.index or 0
        if response.get("status") != TERMINAL_STATUS[last]:
            self._fail(
                f"{last} carries a response whose status is {response.get('status')!r}",
                f"expected {TERMINAL_STATUS[last]!r}",
            )
        output = response.get("output")
        if not isinstance(output, list) or (not output and done_items):
            # A terminal event may omit the output; the finished items hold it.
            output = [done_items[index] for index in sorted(done_items)]
        if not all(isinstance(item, dict) for item in output):
            self._fail("the response's output holds something that is not an item object")
        if not step.generate:
            if last != "response.completed" or output:
                self._fail(
                    "a warm-up (generate: false) must end with response.completed and no output",
                    f"{last} with {len(output)} output item(s)",
                )
        elif self.check.validate_output:
            self._validate_items(output)
        return response, _copy(output)

    def _check_error(self, where: str, event: dict[str, Any]) -> None:
        status, error = event.get("status"), event.get("error")
        if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 599:
            self._fail(f"{where}: the error event has no HTTP-like 'status'", _short(event))
        if not (
            isinstance(error, dict)
            and isinstance(error.get("type"), str)
            and isinstance(error.get("message"), str)
        ):
            self._fail(
                f"{where}: the error is not in the nested envelope "
                '{"type": "error", "status": ..., "error": {"type", "code", "message", "param"}}',
                _short(event),
            )

    def _validate_items(self, output: list[Item]) -> None:
        models = _sdk_item_models()
        if models is None:
            return
        from pydantic import ValidationError

        for number, item in enumerate(output):
            model = models.get(item.get("type", "message"))
            if model is None:
                self._fail(
                    f"output item {number} has a type the openai SDK does not know: "
                    f"{item.get('type')!r}",
                    _short(item),
                )
            try:
                model.model_validate(item)
            except ValidationError as exc:
                errors = exc.errors(include_url=False)
                shown = [
                    ".".join(str(part) for part in error["loc"]) + ": " + error["msg"]
                    for error in errors[:4]
                ]
                self._fail(
                    f"output item {number} does not validate with the openai SDK's "
                    f"{model.__name__} (pass validate_output=False to skip this check)",
                    "\n".join([*shown, "item: " + _short(item)]),
                )

    # What the handler received.

    def _check_calls(
        self,
        step: Step,
        plan: _Plan,
        events: list[dict[str, Any]],
        calls: list[RecordedCall],
    ) -> None:
        started = events[0]["type"] == "response.created"
        if not step.generate:
            if calls:
                self._fail("the handler was called for a warm-up (generate: false)")
            return
        if len(calls) > 1 or (started and not calls):
            self._fail(f"the handler was called {len(calls)} times for one turn, expected once")
        if not calls:
            return  # refused before the handler ran (allow_errors)
        call = calls[0]
        body = call.body
        if not isinstance(body, dict):
            self._fail("the handler's request body is not a JSON object", _short(body))
        if call.headers.get(RUN_HEADER) != self.token:
            self._fail(
                "the handler's request does not carry the socket handshake's headers",
                f"{RUN_HEADER} was sent on the handshake and is missing on the handler call",
            )
        expected = {key: value for key, value in plan.request.items() if key not in _NOT_FORWARDED}
        expected["stream"] = True
        received = {key: value for key, value in body.items() if key not in _NOT_FORWARDED}
        if received != expected:
            self._fail(
                "the handler's request fields differ from the HTTP request's",
                _diff_fields(expected, received),
            )
        if call.context != plan.context:
            what = "body's input" if call.full_context else "Turn.history()"
            self._fail(
                "the handler did not receive the context an HTTP client with the full "
                f"history sends (compared with the {what})",
                _diff_items(plan.context, call.context),
            )
        sent_previous = plan.request.get("previous_response_id")
        if call.full_context:
            if body.get("previous_response_id") is not None:
                self._fail(
                    "a full-context request carries a previous_response_id",
                    f"previous_response_id: {body['previous_response_id']!r}",
                )
            return
        if self.check.mode == "always":
            self._fail("full_context='always', but the handler got only the new items")
        if sent_previous is None:
            self._fail(
                "a request without previous_response_id reached the handler without "
                "the whole context"
            )
        if body.get("previous_response_id") != sent_previous:
            self._fail(
                "the cache-aware request's previous_response_id differs from the client's",
                f"sent {sent_previous!r}, the handler got {body.get('previous_response_id')!r}",
            )
        if body.get("input") != plan.request["input"]:
            self._fail(
                "the cache-aware request's input is not the new input the client sent",
                _diff_items(_as_items(plan.request["input"]), _as_items(body.get("input"))),
            )

    # Failures.

    def _fail(self, problem: str, details: str = "") -> typing.NoReturn:
        index = self.index
        step = self.steps[index] if index is not None and index < len(self.steps) else None
        lines: list[str] = []
        if self.request is not None and index is not None:
            lines.append("sent: " + _short(self.request, 400))
        if self.events:
            types = [str(event.get("type")) for event in self.events]
            if len(types) > 12:
                types = [*types[:5], f"… {len(types) - 10} more …", *types[-5:]]
            lines.append("received: " + ", ".join(types))
        earlier = self.turns[-8:] if index is None else self.turns[:index][-8:]
        if earlier:
            lines.append("earlier turns:")
            lines.extend("  " + _turn_line(report) for report in earlier)
        raise CompatibilityError(
            problem,
            turn=index,
            step=step,
            steps=len(self.steps),
            details=details,
            context="\n".join(lines),
        )


# Helpers.


def _new_input(step: Step, prefix: list[Item]) -> str | list[Item]:
    """What the client sends this turn: outputs for the tool calls left unanswered, else a
    user message in the step's form."""
    if step.form == "empty":
        return []
    pending = _pending_calls(prefix)
    if pending:
        return [
            {"type": "function_call_output", "call_id": call_id, "output": step.text}
            for call_id in pending
        ]
    if step.form == "string":
        return step.text
    if step.form == "parts":
        content = [{"type": "input_text", "text": step.text}]
        return [{"type": "message", "role": "user", "content": content}]
    if step.form == "developer":
        developer = {"role": "developer", "content": "Answer in one short sentence."}
        return [developer, {"role": "user", "content": step.text}]
    return [{"role": "user", "content": step.text}]


def _pending_calls(items: list[Item]) -> list[str]:
    answered = {item.get("call_id") for item in items if item.get("type") == "function_call_output"}
    pending: list[str] = []
    for item in items:
        call_id = item.get("call_id")
        if (
            item.get("type") == "function_call"
            and isinstance(call_id, str)
            and call_id not in answered
            and call_id not in pending
        ):
            pending.append(call_id)
    return pending


def _as_items(value: Any) -> Any:
    """A request's input as items: a string is one user message, absent is empty."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if value is None:
        return []
    return value


def _copy(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value))


def _error_code(event: dict[str, Any]) -> Any:
    error = event.get("error")
    return error.get("code") if isinstance(error, dict) else None


def find_middleware(app: Any) -> WebSocketModeMiddleware | None:
    """The WebSocketModeMiddleware inside `app`: the app itself, or one reached through
    Starlette's middleware stack and `.app` attributes."""
    node = app
    seen: set[int] = set()
    while node is not None and id(node) not in seen:
        if isinstance(node, WebSocketModeMiddleware):
            return node
        seen.add(id(node))
        if hasattr(node, "build_middleware_stack") and hasattr(node, "middleware_stack"):
            if node.middleware_stack is None:  # Starlette builds it on the first call
                node.middleware_stack = node.build_middleware_stack()
            node = node.middleware_stack
            continue
        node = getattr(node, "app", None)
    return None


@functools.cache
def _sdk_item_models() -> dict[str, Any] | None:
    """The openai SDK's output item models by their `type`, or None without the SDK."""
    try:
        from openai.types.responses import ResponseOutputItem
    except ImportError:
        return None
    union = typing.get_args(ResponseOutputItem)[0]
    models: dict[str, Any] = {}
    for member in typing.get_args(union):
        field = getattr(member, "model_fields", {}).get("type")
        for literal in typing.get_args(field.annotation) if field is not None else ():
            if isinstance(literal, str):
                models[literal] = member
    return models


def _short(value: Any, limit: int = _SHORT) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value, default=repr).decode()
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def _diff_items(expected: list[Item], received: Any) -> str:
    """A short description of how two item lists differ."""
    if not isinstance(received, list):
        return f"expected {len(expected)} items, received {_short(received)}"
    lines = [f"expected {len(expected)} items, the handler received {len(received)}"]
    if len(received) == len(expected) - 1:
        for index in range(len(expected)):
            if received == expected[:index] + expected[index + 1 :]:
                lines.append(f"item {index} is missing: {_short(expected[index])}")
                return "\n".join(lines)
    if len(received) == len(expected) + 1:
        for index in range(len(received)):
            if expected == received[:index] + received[index + 1 :]:
                lines.append(f"item {index} is extra: {_short(received[index])}")
                return "\n".join(lines)
    for index, (want, got) in enumerate(zip(expected, received, strict=False)):
        if want != got:
            lines.append(f"first difference at item {index}:")
            lines.append(f"  expected: {_short(want)}")
            lines.append(f"  received: {_short(got)}")
            return "\n".join(lines)
    shorter, longer = sorted((expected, received), key=len)
    if len(longer) > len(shorter):
        which = "missing" if longer is expected else "extra"
        index = len(shorter)
        lines.append(f"item {index} is {which}: {_short(longer[index])}")
    return "\n".join(lines)


def _diff_fields(expected: dict[str, Any], received: dict[str, Any]) -> str:
    lines = []
    for key in sorted(set(expected) | set(received)):
        if key not in received:
            lines.append(f"{key!r} is missing (expected {_short(expected[key], 120)})")
        elif key not in expected:
            lines.append(f"{key!r} is unexpected: {_short(received[key], 120)}")
        elif expected[key] != received[key]:
            lines.append(
                f"{key!r}: expected {_short(expected[key], 120)}, "
                f"received {_short(received[key], 120)}"
            )
    return "\n".join(lines)


def _turn_line(report: TurnReport) -> str:
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
