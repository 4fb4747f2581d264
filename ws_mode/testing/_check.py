"""The check: serve an app behind WebSocket mode under a real server and run conversation
programs against it, each on a new socket (`CompatibilityCheck`, `check_conversation`).

Each turn's handler request is compared with what an HTTP client keeping the full history would
have sent (`expected`), its answer with what that HTTP client gets (`answers`), and its events
are checked for protocol validity (`validation`).
"""

from __future__ import annotations

import dataclasses
import secrets
import typing
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypedDict

from .._asgi import ASGIApp
from .._middleware import WebSocketModeMiddleware, find_middlewares
from .._settings import FullContext, Settings
from ._answers import IDS
from ._loopback import ServerName, ServerThread
from ._program import Conversation, Step
from ._recorder import RUN_HEADER, Recorder
from ._report import Coverage, Report


class SDKValidationWarning(UserWarning):
    """The openai SDK is not installed, so output items are not validated with its models."""


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
    compare_answers: bool
    ignore_fields: Collection[str]
    require_history: bool
    strict: bool


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

    `headers` go on the handshake (your auth) and on the kit's HTTP requests.
    `validate_output` checks output items with the openai SDK's models when the SDK is
    installed (a `SDKValidationWarning` says when it is not). `allow_errors=True` accepts
    turns that end in `error` or `response.failed` (still checked for validity); by default
    they fail the check. `turn_timeout` bounds each turn. After each turn the kit sends a
    `response.steer` for an unknown response and waits for its `response.steer.failed`: any
    other frame before it was sent after the turn's terminal event. `settle` adds a wait after
    the last turn, for events a server sends late from a background task.

    `compare_answers` (default on) sends each generating turn's conversation over plain HTTP
    with the full history and requires the same answer: the terminal status (or the error's
    HTTP status) and the output items, ids (`id`, `call_id`) and the fields named in
    `ignore_fields` left out, at any depth. When they differ, HTTP is asked twice more: a
    handler that answers one request differently is reported as not deterministic
    (`NondeterminismError`). `require_history=True` also asks, on each continuation, with the
    new input alone, and fails when the answer is the same (the handler ignores the history).
    `strict=True` requires every field the SDKs require of each event (`sequence_number` on
    every event, the Response model's required fields, ...). `coverage` counts what passing
    programs covered; `summary()` tells it.
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
        compare_answers: bool = True,
        ignore_fields: Collection[str] = (),
        require_history: bool = False,
        strict: bool = False,
    ) -> None:
        if isinstance(app, (str, bytes)) or not callable(app):
            shown = app if isinstance(app, str) else type(app).__name__
            raise TypeError(
                f"CompatibilityCheck needs an ASGI app to serve, not {shown!r}: it runs your app "
                "behind WebSocketModeMiddleware and records what the handler receives. To "
                "check a running endpoint at a URL, use `ws-mode check URL --all`."
            )
        if isinstance(ignore_fields, str) or not all(
            isinstance(name, str) for name in ignore_fields
        ):
            raise ValueError(
                f"ignore_fields must be a collection of field names: {ignore_fields!r}"
            )
        if require_history and not compare_answers:
            raise ValueError("require_history needs compare_answers")
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
        self.compare_answers = compare_answers
        self.ignore_fields = frozenset(ignore_fields)
        self.require_history = require_history
        self.strict = strict
        #: What the passing programs covered.
        self.coverage = Coverage(strict=strict)
        #: Where plain HTTP reaches the handler (for the answer comparison).
        self.http_path = "/v1/responses"
        #: The middleware's mode, when the kit knows it (None with `middleware=`).
        self.mode: FullContext | None = None
        self.base_url = ""
        self._recorder: Recorder | None = None
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
        from . import _validation

        if self.validate_output:
            self.coverage.sdk_validated = _validation.sdk_models_available()
            if not self.coverage.sdk_validated:
                warnings.warn(
                    "ws_mode.testing: the openai SDK is not installed, so output items are not "
                    "validated with its models (pip install openai; validate_output=False "
                    "silences this)",
                    SDKValidationWarning,
                    stacklevel=2,
                )
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
        """The app to serve, with the recorder around the handler, and the socket's path."""
        if self.middleware is not None:
            self._recorder = Recorder(self.app)
            return self.middleware(self._recorder), "/v1/responses"
        found = next(iter(find_middlewares(self.app)), None)  # the outermost
        if found is None:
            self.mode = self.full_context or "always"
            self._recorder = Recorder(self.app)
            wrapped = WebSocketModeMiddleware(
                self._recorder, full_context=self.mode, **self.middleware_options
            )
            self.http_path = wrapped.settings.handler_path
            return wrapped, wrapped.settings.path
        if self.middleware_options:
            raise ValueError(
                "the app already contains a WebSocketModeMiddleware: configure it there, "
                "not with middleware_options"
            )
        original = found.settings
        if isinstance(original.app, Recorder):
            raise RuntimeError("this app's WebSocketModeMiddleware is already under a check")
        self.mode = self.full_context or original.full_context
        self._recorder = Recorder(original.app)
        found.settings = dataclasses.replace(original, app=self._recorder, full_context=self.mode)
        self._embedded = (found, original)
        self.http_path = original.handler_path
        return self.app, original.path

    def _restore(self) -> None:
        if self._embedded is not None:
            found, original = self._embedded
            found.settings = original
            self._embedded = None

    # Checking.

    def run(self, program: Conversation | Sequence[Step]) -> Report:
        """Run `program` on a new socket; raise `CompatibilityError` at the first difference."""
        steps = tuple(program.steps if isinstance(program, Conversation) else program)
        if not steps:
            raise ValueError("a program needs at least one step")
        if self._server is None:
            self.start()
        recorder = self._recorder
        assert recorder is not None
        from ._run import RunOptions, run_program  # imports websockets

        token = secrets.token_hex(8)
        options = RunOptions(
            self.turn_timeout,
            self.settle,
            self.allow_errors,
            self.validate_output,
            self.mode,
            strict=self.strict,
            compare_answers=self.compare_answers,
            ignored=IDS | self.ignore_fields,
            require_history=self.require_history,
            http_path=self.http_path,
            http_headers=self.headers,
            sdk_validated=bool(self.coverage.sdk_validated),
        )
        recorder.active.add(token)
        try:
            report = run_program(
                options,
                recorder,
                token,
                steps,
                base_url=self.base_url,
                path=self.path or "/v1/responses",
                headers={**self.headers, RUN_HEADER: token},
            )
        finally:
            recorder.active.discard(token)
            recorder.take(token)  # forget what a failed run left behind
        self.coverage.add(report)
        return report

    def summary(self) -> str:
        """What the passing programs covered (programs, turns, lanes, steps by kind, wrong
        input, answers compared, whether the openai SDK validated output)."""
        return self.coverage.summary()


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
