"""The in-process HTTP call: one turn sent to the wrapped app, its answer turned into events.

No socket and no loopback hop: the app is called as an ASGI application with a synthetic
`http` scope. Its answer is read as it is sent: an SSE stream is decoded incrementally and
each event handed on at once; a JSON response object becomes the lifecycle events an SSE
stream would have carried; a 4xx/5xx becomes one error event with the handler's status, its
error body, and its rate-limit and retry headers (`error.headers`, `ws_mode._headers`).

An answer read whole is held in the memory budget (`Limits.max_memory_bytes`) from its first
byte until its events are sent or dropped (`answer_cost`); one the budget cannot hold fails the
turn with `server_is_overloaded`.

The call runs in a task of its own on a leash (`Leash`): ws_mode stops it by cancelling it,
and a handler that ignores the cancellation is abandoned (`HandlerCall.abandon`): what it still
sends goes nowhere, and the next cancellation (the event loop's own, as the server exits) ends
its task at once instead of reaching a handler that would swallow it again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable
from typing import Any, Protocol

import orjson

from ._asgi import ASGIApp, Message, Receive, Scope
from ._budget import ANSWER_FRAME_COPIES, Held, MemoryBudget
from ._cache import decoded_size
from ._events import lifecycle_events
from ._headers import end_to_end, error_headers, header
from ._logs import for_log
from ._protocol import error_event, server_error
from ._socket import ClientGone
from ._sse import SSEDecoder, content_type, is_event_stream
from ._turn import turn_of

logger = logging.getLogger(__name__)

# Headers the synthetic request sets itself, and `accept-encoding` (a compressing middleware
# inside would compress the event stream).
_SET_HERE = (b"accept-encoding", b"content-length", b"content-type", b"accept", b"host")


class EventSink(Protocol):
    """Where the events of one handler call go (the connection's response stream)."""

    finished: bool
    #: Sends one frame to the client (raising `ClientGone` when it left).
    send_text: Callable[[str], Awaitable[None]]

    def frame(self, event_type: str | None, data: bytes) -> str | dict[str, Any]:
        """An event of the handler's SSE stream (the `event:` field, or None, and the data):
        the frame that forwards it as it is, or an event to go through `event` (the one
        decoded, or an error when it is no JSON object)."""

    def frame_object(self, event: dict[str, Any] | bytes) -> str | dict[str, Any]:
        """An event the handler handed as an object or encoded JSON (`Turn.send_event`): as
        `frame` gives."""

    async def event(self, event: dict[str, Any], *, from_handler: bool = False) -> None:
        """An event as an object: one `frame` gave (`from_handler`), or one ws_mode built
        (from a JSON answer, or an error)."""

    async def refuse(self, what: str) -> None:
        """End the response with `server_is_overloaded`: the memory budget cannot hold
        `what`. A refusal, not a failure of the conversation: what the client continued from
        stays cached."""


def answer_cost(body: bytes) -> int:
    """What turning an answer read whole (`body`, a JSON response object or an error) into
    events holds at once, beside the body itself: the answer decoded (the cache's estimate,
    `decoded_size`) and one event's frame at a time, `ANSWER_FRAME_COPIES` times the body (the
    events carry the response object: the terminal one all of it, a message's text events its
    text again)."""
    return decoded_size(body) + ANSWER_FRAME_COPIES * len(body)


def handler_headers(ws_scope: Scope) -> list[tuple[bytes, bytes]]:
    """The handshake's headers the handler should see on every turn, plus the fixed ones."""
    headers = end_to_end(ws_scope.get("headers", []), _SET_HERE)
    host = header(ws_scope, b"host")
    if host is not None:
        headers.insert(0, (b"host", host))
    headers.append((b"content-type", b"application/json"))
    headers.append((b"accept", b"text/event-stream"))
    return headers


def http_scope(
    ws_scope: Scope,
    *,
    path: str,
    headers: list[tuple[bytes, bytes]],
    body_length: int,
    extension: object,
) -> Scope:
    """The synthetic `http` scope of one turn, modelled on the socket's handshake."""
    scheme = "https" if ws_scope.get("scheme") in ("wss", "https") else "http"
    extensions = dict(ws_scope.get("extensions") or {})
    extensions.pop("websocket.http.response", None)
    extensions["ws_mode"] = extension
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": scheme,
        "path": path,
        "raw_path": path.encode(),
        "root_path": ws_scope.get("root_path", ""),
        "query_string": ws_scope.get("query_string", b""),
        "headers": [*headers, (b"content-length", str(body_length).encode())],
        "client": ws_scope.get("client"),
        "server": ws_scope.get("server"),
        "extensions": extensions,
    }
    if "state" in ws_scope:
        scope["state"] = dict(ws_scope["state"])
    if "app" in ws_scope:
        scope["app"] = ws_scope["app"]  # Starlette's `request.app`, when ws_mode sits inside it
    return scope


#: The coroutines of abandoned handlers whose task the event loop ended (it cancels every task
#: as it closes): kept, never closed nor finalized, for a handler that ignores its cancellation
#: ignores `GeneratorExit` too, which Python would report ("coroutine ignored GeneratorExit").
#: The process is ending; its end frees them.
_LEFT_BEHIND: list[Coroutine[Any, Any, Any]] = []


class Leash(Coroutine[Any, Any, None]):
    """A handler call's coroutine as its task runs it: every step is the call's own until it is
    cut (`cut`); from then on, the next cancellation its task meets ends the task at once,
    without reaching the call, which is left behind (`_LEFT_BEHIND`). Python cannot kill a coroutine
    that swallows `CancelledError`; this is how its task still ends (an event loop that closes
    cancels its tasks and waits for them: it would wait for ever)."""

    __slots__ = ("_coro", "cut_off")

    def __init__(self, coro: Coroutine[Any, Any, None]) -> None:
        self._coro = coro
        #: Abandoned: the next cancellation ends the task.
        self.cut_off = False

    def cut(self) -> None:
        """Abandon the call: the next cancellation of its task ends the task."""
        self.cut_off = True

    def send(self, value: Any) -> Any:
        return self._coro.send(value)

    def __next__(self) -> Any:
        return self._coro.send(None)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        error = typ if val is None and isinstance(typ, BaseException) else val
        if self.cut_off and isinstance(error, asyncio.CancelledError):
            _LEFT_BEHIND.append(self._coro)
            raise error
        return self._coro.throw(error if error is not None else typ)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, None]:
        return self

    def __iter__(self) -> Leash:
        return self

    def __getattr__(self, name: str) -> Any:
        """The call's coroutine as asyncio and debuggers read it (`cr_code`, `cr_frame`,
        `__qualname__`: a task's repr, `get_stack()`, tools that find tasks by their code)."""
        if name.startswith("cr_") or name in ("__qualname__", "__name__"):
            return getattr(self._coro, name)
        raise AttributeError(name)


class HandlerCall:
    """One call of the wrapped app; a fresh object per turn, like Starlette's responders."""

    def __init__(
        self,
        app: ASGIApp,
        scope: Scope,
        body: bytes,
        sink: EventSink,
        *,
        max_buffered: int,
        budget: MemoryBudget | None = None,
    ) -> None:
        self.app = app
        self.scope = scope
        self.body = body
        self.sink = sink
        # An error or JSON answer is read whole, and a streamed one event by event; past this
        # size (`Limits.max_buffered_answer_bytes`) the handler is misbehaving.
        self.max_buffered = max_buffered
        #: Where an answer read whole is reserved while it is held (None: not counted).
        self.budget = budget
        self._held = Held(budget)
        #: The budget could not hold the answer: it was dropped, the turn is refused.
        self._refused = False
        self.status: int | None = None
        self._streaming = False
        self._content_type = b""
        #: The headers of an answer read whole (an error's rate limits go on its event).
        self._headers: Iterable[tuple[bytes, bytes]] = ()
        self._decoder = SSEDecoder()
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._body_sent = False
        self._complete = False
        self._disconnected = asyncio.Event()
        self._client_gone = False
        #: The handler handed an event before it started its answer: that stood for a
        #: `200 text/event-stream` start, and the start it sends later changes nothing.
        self._start_implied = False
        #: ws_mode stopped the call (the turn is over for the client): what it still sends or
        #: hands goes nowhere, and its failure is no turn's.
        self.stopped = False
        #: ws_mode stopped waiting for it (`abandon`).
        self.abandoned = False
        self._leash: Leash | None = None
        self._release: Callable[[], None] | None = None

    def start(self, release: Callable[[], None] | None = None) -> asyncio.Task[None]:
        """Run the call in a task of its own, on its leash. `release` lets go of what the call
        holds (its request in the memory budget): called once, when the task ends or when the
        call is abandoned, whichever is first."""
        self._release = release
        self._leash = leash = Leash(self.run())
        task: asyncio.Task[None] = asyncio.create_task(leash)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        self.let_go()

    def let_go(self) -> None:
        """Let go of what the call holds, once."""
        release, self._release = self._release, None
        if release is not None:
            release()

    async def run(self) -> None:
        """Call the app and hand its answer to the sink. Cancel the task to abandon it."""
        turn = turn_of(self.scope)
        if turn is not None:
            turn.bind_events(self.hand_event)
        try:
            try:
                await self.app(self.scope, self.receive, self.send)
            except Exception as exc:
                if self.stopped:
                    # Stopped by ws_mode (the turn is over): how it ended is nobody's business.
                    logger.debug("a stopped handler call raised", exc_info=True)
                    return
                if self._client_gone:
                    # The app saw the client leave through our send() and gave up; not a fault.
                    raise ClientGone("the WebSocket client went away") from exc
                logger.exception("the handler raised while answering a WebSocket mode turn")
                self._drop_answer()
                if not self.sink.finished:
                    await self.sink.event(
                        server_error(f"The handler failed: {type(exc).__name__}.")
                    )
                return
            finally:
                # Whatever still waits on `receive()` (a disconnect listener) learns the call
                # ended.
                self._disconnected.set()
                if turn is not None:
                    turn.bind_events(None)
            await self._finish()
        finally:
            self._drop_answer()  # sent, dropped, or the call cancelled

    async def stop(self, task: asyncio.Task[None]) -> None:
        """Stop the call running in `task` (the turn is over: the response was cut short, for
        steering or an interrupt, or timed out): the app's `receive()` reports
        `http.disconnect`, a listener waiting on it hears it first, then the task is cancelled
        (through `ws_mode.proxy` that closes the upstream request) and given one pass of the
        loop to end. It does not wait longer: a handler that ignores the cancellation is its
        caller's to abandon (`ws_mode._after_response.AfterResponses.stopping`)."""
        if task.done():
            return
        self._disconnected.set()
        try:
            await asyncio.sleep(0)  # one pass of the loop: a disconnect listener wakes first
        finally:
            self.stop_now(task)
        await asyncio.sleep(0)  # one pass: a handler that honours the cancellation ends

    def stop_now(self, task: asyncio.Task[None]) -> None:
        """`stop` without a pass of the loop (for a caller being cancelled itself): the
        disconnect and the cancellation at once; what the call still sends goes nowhere."""
        self.stopped = True
        self._disconnected.set()
        if not task.done():
            task.cancel()

    def abandon(self) -> None:
        """Stop waiting for a call that ignored its cancellation: what it sends goes nowhere,
        what it holds is let go, and the next cancellation of its task (the event loop's, as
        the server exits) ends the task at once (`Leash`)."""
        self.stopped = self.abandoned = True
        self._disconnected.set()
        if self._leash is not None:
            self._leash.cut()
        self.let_go()
        self._drop_answer()  # what it read of its answer: its task may never end

    async def receive(self) -> Message:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        # Returning `http.disconnect` early would make frameworks cut streams short: wait
        # until the turn is abandoned.
        await self._disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if self.stopped:
            return  # the turn is over: nothing reaches the client any more
        kind = message["type"]
        if kind == "http.response.body":
            if self._complete:
                return
            if self.status is None:
                raise RuntimeError(
                    "Expected ASGI message 'http.response.start', but got 'http.response.body'."
                )
            if not message.get("more_body", False):
                self._complete = True
                # Past the response, `receive()` reports the disconnect (ASGI spec).
                self._disconnected.set()
            if self.sink.finished:
                return  # what follows the terminal event reaches nobody
            body: bytes = message.get("body", b"")
            if self._streaming:
                # The chunk's events in one pass: each one awaits only its own send (`_forward`
                # inlined: a coroutine less per event).
                sink = self.sink
                frame, send_text = sink.frame, sink.send_text
                try:
                    for event_type, data in self._decoder.feed(body):
                        if sink.finished:
                            break
                        framed = frame(event_type, data)
                        if isinstance(framed, str):
                            await send_text(framed)
                        else:
                            await sink.event(framed, from_handler=True)
                except ClientGone:
                    self._client_gone = True
                    raise
                if self._decoder.pending > self.max_buffered:
                    # An event that never ends (no blank line): the handler is misbehaving.
                    raise RuntimeError(
                        "An event of the handler's answer is larger than ws_mode accepts."
                    )
            elif body and not self._refused:
                self._buffered += len(body)
                if self._buffered > self.max_buffered:
                    raise RuntimeError("The handler's answer is larger than ws_mode accepts.")
                if not self._held.add(len(body)):
                    self._refused = True  # the rest of the answer is dropped as it comes
                    self._drop_answer()
                    return
                self._buffer.append(body)
        elif kind == "http.response.start":
            if self._start_implied:
                return
            if self.status is not None:
                raise RuntimeError("The handler sent 'http.response.start' twice.")
            self.status = int(message["status"])
            self._content_type = content_type(message.get("headers", ()))
            self._streaming = self.status < 300 and is_event_stream(self._content_type)
            if not self._streaming:
                self._headers = message.get("headers", ())
        # Other messages (trailers, extensions we did not offer) carry nothing for the client.

    async def hand_event(self, event: dict[str, Any] | bytes) -> None:
        """An event the handler handed as an object or encoded JSON (`Turn.send_event`),
        forwarded in order with its answer's SSE: no SSE text, and an object is encoded once."""
        if self._complete or self.stopped:
            return
        if self.status is None:
            self.status = 200
            self._streaming = self._start_implied = True
        elif not self._streaming:
            raise RuntimeError(
                "Turn.send_event() was called after an answer that is not an event stream."
            )
        sink = self.sink
        if sink.finished:
            return  # what follows the terminal event reaches nobody
        try:
            await self._forward(sink.frame_object(event))
        except ClientGone:
            self._client_gone = True
            raise

    async def _forward(self, framed: str | dict[str, Any]) -> None:
        """Send what the sink's `frame` or `frame_object` gave: a frame as it is, an event
        through the sink's `event`."""
        if isinstance(framed, str):
            await self.sink.send_text(framed)
        else:
            await self.sink.event(framed, from_handler=True)

    def _drop_answer(self) -> None:
        """Let go of the answer read whole, and of its reservation."""
        self._buffer = []
        self._held.let_go()

    async def _finish(self) -> None:
        if self.sink.finished or self.stopped:
            return
        if self._refused:
            await self.sink.refuse("the handler's answer to this request")
            return
        if self.status is None:
            logger.warning("the handler returned without answering a WebSocket mode turn")
            await self.sink.event(server_error("The handler returned without answering."))
            return
        if self._streaming:
            logger.warning("the handler's event stream ended before a terminal event")
            await self.sink.event(
                server_error("The handler's event stream ended before a terminal event.")
            )
            return
        if len(self._buffer) > 1 and not self._held.add(self._buffered):
            self._drop_answer()  # no room to join its chunks
            await self.sink.refuse("the handler's answer to this request")
            return
        body = b"".join(self._buffer)
        self._buffer = []  # the chunks go: the body holds them (one chunk is the body itself)
        self._held.let_go(self._held.size - len(body))  # the chunks joined: the body is all
        # The answer decoded and its events' frames, one at a time, until they are sent.
        if not self._held.add(answer_cost(body)):
            self._drop_answer()
            del body
            await self.sink.refuse("the handler's answer to this request")
            return
        if self.status >= 300:
            if self.status >= 500:
                logger.warning(
                    "the handler answered a WebSocket mode turn with HTTP %d: %s",
                    self.status,
                    for_log(body),
                )
            await self.sink.event(_error_from_answer(self.status, body, self._headers))
            return
        try:
            response = orjson.loads(body)
        except orjson.JSONDecodeError:
            response = None
        if (
            isinstance(response, dict)
            and isinstance(response.get("error"), dict)
            and not isinstance(response.get("output"), list)
        ):
            # An error body sent with a 2xx status is still an error.
            logger.warning(
                "the handler answered HTTP %d with an error body: %s",
                self.status,
                for_log(body),
            )
            await self.sink.event(_error_from_answer(500, body, self._headers))
            return
        if not (
            isinstance(response, dict)
            and isinstance(response.get("id"), str)
            and isinstance(response.get("output", []), list)
        ):
            logger.warning(
                "the handler answered HTTP %d with %s, neither an event stream "
                "(text/event-stream) nor a response object (application/json): %s",
                self.status,
                for_log(self._content_type) if self._content_type else "no content-type",
                for_log(body),
            )
            await self.sink.event(
                server_error("The handler answered with neither an event stream nor a response.")
            )
            return
        # The body is decoded: only the answer decoded and its frames stay held.
        del body
        if self._held.size > self._buffered:
            self._held.let_go(self._buffered)
        for event in lifecycle_events(response):
            await self.sink.event(event)
            if self.sink.finished:
                return


def _error_from_answer(
    status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]]
) -> dict[str, Any]:
    """The error event for a handler's 4xx/5xx answer, keeping its error body and, in
    `error.headers`, the rate-limit and retry headers it came with."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        payload = None
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        shown = body[:500].decode("utf-8", "replace").strip()
        error = {"message": shown} if shown else {}

    def text(key: str) -> str | None:
        value = error.get(key)
        return value if isinstance(value, str) else None

    event = error_event(
        status,
        text("type") or ("invalid_request_error" if status < 500 else "server_error"),
        text("code"),
        text("message") or f"The handler answered HTTP {status}.",
        param=text("param"),
    )
    kept = error_headers(headers)
    if kept:
        event["error"]["headers"] = kept
    return event


def replay_body(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives an app `body` as the whole request first, then whatever
    `receive` gives (the disconnect): for a middleware that read the body itself."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
