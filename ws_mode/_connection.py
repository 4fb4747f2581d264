"""One WebSocket mode socket: its receive loop, its sends, its lifetime and its close.

The receive loop parses each frame into a client event; a bad frame gets an error event and
the loop goes on. Creates go to the connection's lanes (`lanes.py`), which run each one
through the turn runner (`turn_runner.py`); a steer or an interrupt goes to the turn runner
too. A watchdog
ends a connection whose client stopped reading; the lifetime limit and a drain end it with
1001 so clients reconnect. Where the socket is in its life is one `SocketState`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from ._asgi import Message, Receive, Scope, Send
from ._auth import AuthenticationFailed, authenticate, failure_code, failure_param
from ._budget import BUDGET_EXTENSION, PARSE_FACTOR, REFUSED_MESSAGE, warn_outside_budget
from ._cache import ResponseCache
from ._client_events import (
    CreateEvent,
    InterruptEvent,
    ProtocolError,
    SteerEvent,
)
from ._frames import held_cost, parse_frame
from ._lanes import Lanes
from ._persistence import StoreLink, store_scope
from ._protocol import (
    SERVER_SHUTTING_DOWN,
    SERVER_SHUTTING_DOWN_MESSAGE,
    encode_event,
    error_event,
    error_type_for_status,
    memory_budget_exceeded,
)
from ._settings import Settings
from ._socket import ClientGone
from ._turn_runner import TurnRunner

logger = logging.getLogger(__name__)

# Close codes (RFC 6455 §7.4.1). 1001 tells clients such as the openai SDK to reconnect.
GOING_AWAY = 1001
#: "Service Restart": the close an ASGI server sends its open sockets as it shuts down
#: (uvicorn's), which the app hears as a disconnect. A server's code: no client sends it.
SERVICE_RESTART = 1012
POLICY_VIOLATION = 1008


class SocketState(enum.Enum):
    """Where a socket is in its life, as Starlette's `WebSocketState`. It only moves forward:
    CONNECTING, OPEN, then DRAINING when the server shuts down, or REFUSING when the
    credentials are refused, then CLOSED. No work starts once it is REFUSING or CLOSED."""

    #: Upgraded; the accept is on its way.
    CONNECTING = "connecting"
    #: Accepted: frames are read, requests run.
    OPEN = "open"
    #: The server shuts down: what runs and waits finishes, new requests are refused.
    DRAINING = "draining"
    #: The credentials were refused: the error goes out, then the close (1008).
    REFUSING = "refusing"
    #: Closed, by either side: a send raises `ClientGone`.
    CLOSED = "closed"


# Why the timer ends a connection (`Connection._expiry`).
_LIFETIME = "lifetime"
_IDLE = "idle"

#: `SocketState.CLOSED` for `send_text`, which looks once per event: a module global is read
#: faster than an enum's attribute.
_CLOSED = SocketState.CLOSED


class Connection:
    """Serves one accepted socket until the client leaves or a limit ends it."""

    def __init__(self, settings: Settings, scope: Scope, receive: Receive, send: Send) -> None:
        self.settings = settings
        self.limits = settings.limits
        self.stats = settings.stats
        self.scope = scope
        self._receive = receive
        self._send = send
        self.cache = ResponseCache(
            max_entries=self.limits.max_cached_responses,
            max_bytes=self.limits.max_cached_bytes,
            budget=settings.budget,
        )
        self.lanes = Lanes(
            self.limits,
            run=self._run_turn,
            refuse=self._refuse,
            ends_lane=(ClientGone,),
            budget=settings.budget,
        )
        #: What the connection did, for its access log line and its span (`ws_mode._observe`).
        self.record = settings.observer.connection_record(scope, scope.get("path", settings.path))
        self.turns = TurnRunner(
            settings, scope, self.cache, socket=self, lanes=self.lanes, connection=self.record
        )
        self._send_gate = _SendGate()
        self._state = SocketState.CONNECTING
        self._send_started: float | None = None
        self._run_task: asyncio.Task[Any] | None = None
        self._active_at = 0.0  # the loop time of the last frame or finished turn
        self._deadline = 0.0  # the loop time the lifetime limit ends the connection
        self._timer: asyncio.TimerHandle | None = None  # when it may next expire
        self._receiving = False  # the receive loop waits for a frame (the timer may end it)
        self._expired: str | None = None  # why the timer ended the receive
        self._authenticated_at = 0.0
        self._owner: str | None = None  # whose stored responses this connection sees
        #: The turns running now (a turn and the successors its steering input calls for).
        self.running = 0

    # The socket.

    async def run(
        self,
        *,
        principal: Any = None,
        owner: str | None = None,
        subprotocol: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """Accept the socket (its answer carrying `headers`) and serve it as `principal`, whose
        stored responses are those of `owner` (`ws_mode._persistence.store_scope`); return
        when it is closed."""
        # The connection's span (when traced) is current from here on, in this task and the
        # lanes' tasks it starts.
        observer = self.settings.observer
        observer.connection_opened(self.record, self.scope)
        try:
            await self._serve(principal, owner, subprotocol, headers)
        finally:
            observer.connection_closed(self.record)

    async def _serve(
        self,
        principal: Any,
        owner: str | None,
        subprotocol: str | None,
        headers: list[tuple[bytes, bytes]] | None,
    ) -> None:
        self.turns.principal, self._owner = principal, owner
        if self.settings.store is not None and owner is not None:
            self.turns.store = StoreLink(self.settings.store, self.stats, owner, self.limits)
        self._authenticated_at = asyncio.get_running_loop().time()
        accept: dict[str, Any] = {"type": "websocket.accept"}
        if subprotocol is not None:
            accept["subprotocol"] = subprotocol
        if headers:
            accept["headers"] = headers
        if BUDGET_EXTENSION in (self.scope.get("extensions") or {}):
            # ws_mode's protocol: what it holds of a message still arriving is counted too.
            accept[BUDGET_EXTENSION] = self.settings.budget
        else:  # said once per process, naming what stays outside and what to run instead
            warn_outside_budget(self._receive, self.scope)
        await self._send(accept)
        if self._state is SocketState.CONNECTING:  # a drain may have come first
            self._state = SocketState.OPEN
        loop = asyncio.get_running_loop()
        self._deadline = loop.time() + self.limits.max_connection_seconds
        self._active_at = loop.time()
        task = self._run_task = asyncio.current_task()
        assert task is not None  # run() is always awaited in a task
        watchdog = asyncio.create_task(self._watch_sends())
        try:
            while True:
                if self._timer is None:
                    # Not armed: the first pass, or it came due while a frame was handled.
                    expired = self._expiry(loop.time())
                    if expired is not None:
                        await self._expire(expired)
                        return
                    self._timer = loop.call_at(self._wake_at(), self._on_timer)
                self._receiving = True
                try:
                    message = await self._receive()
                except asyncio.CancelledError:
                    expired, self._expired = self._expired, None
                    # The timer's cancellation only, as `asyncio.timeout` tells its own apart.
                    if expired is None or task.uncancel() > 0:
                        raise
                    await self._expire(expired)
                    return
                finally:
                    self._receiving = False
                self._active_at = loop.time()
                kind = message["type"]
                if kind == "websocket.receive":
                    await self._on_frame(message)
                elif kind == "websocket.disconnect":
                    # ASGI: 1005 when the client's close frame had no code.
                    code = message.get("code", 1005)
                    by = "server" if code == SERVICE_RESTART else "client"
                    self.record.closed(code, message.get("reason"), by)
                    return
        except ClientGone:
            return
        except asyncio.CancelledError:
            if not watchdog.done():  # it returns once it has closed a stalled connection
                raise
            # The watchdog ended a connection whose client stopped reading.
            task.uncancel()
            return
        finally:
            self._state = SocketState.CLOSED
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            watchdog.cancel()
            await self.lanes.stop()
            await self.turns.close()
            self.cache.clear()

    # The connection's deadlines: its lifetime and its idle time. One timer per connection,
    # moved on only when it comes due, instead of a timeout around each frame's receive (a
    # timer handle made and cancelled per frame).

    def _wake_at(self) -> float:
        """When the connection may next expire (it moves on as frames arrive, never back)."""
        idle = self.limits.max_idle_seconds
        return self._deadline if idle is None else min(self._deadline, self._active_at + idle)

    def _expiry(self, now: float) -> str | None:
        """How the connection has expired at `now` (`_LIFETIME`, `_IDLE`), or None."""
        if now >= self._deadline:
            return _LIFETIME
        idle = self.limits.max_idle_seconds
        if idle is None or now < self._active_at + idle:
            return None
        if self.lanes.tasks():  # a turn in flight is not idleness
            self._active_at = now
            return None
        return _IDLE

    def _on_timer(self) -> None:
        """The timer came due: move it on, or end the receive it interrupts. While a frame is
        handled it stays unarmed; the receive loop checks before it receives again."""
        self._timer = None
        loop = asyncio.get_running_loop()
        expired = self._expiry(loop.time())
        if expired is None:
            self._timer = loop.call_at(self._wake_at(), self._on_timer)
        elif self._receiving and self._run_task is not None:
            self._expired = expired
            self._run_task.cancel()

    async def _expire(self, expired: str) -> None:
        """End the connection for its lifetime limit or its idle time."""
        if expired == _LIFETIME:
            minutes = self.limits.max_connection_seconds / 60
            await self._end(
                "websocket_connection_limit_reached",
                f"Responses websocket connection limit reached ({minutes:g} "
                "minutes). Create a new websocket connection to continue.",
                "connection lifetime limit reached",
            )
        else:
            await self._end(
                "websocket_idle_timeout",
                f"No request for {self.limits.max_idle_seconds:g} seconds "
                "(Limits.max_idle_seconds); the connection is closed. Open a new one to continue.",
                "idle timeout",
            )

    def begin_draining(self) -> None:
        """The server shuts down: from now on no turn starts on this socket (a create or a
        steer is refused with `server_shutting_down`, a queued create too as its turn comes,
        and no successor starts for steering input); the turns running go on."""
        if self._state in (SocketState.CONNECTING, SocketState.OPEN):
            self._state = SocketState.DRAINING
        self.turns.draining = True

    async def drain(self, grace: float) -> int:
        """Refuse new requests (`begin_draining`), let the running turns finish for up to
        `grace` seconds, then close with 1001 so clients reconnect elsewhere. Return how many
        turns the grace cut (still running when it ran out)."""
        self.begin_draining()
        deadline = asyncio.get_running_loop().time() + grace
        while tasks := self.lanes.tasks():
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                break
            await asyncio.wait(tasks, timeout=remaining)
        cut = self.running
        await self.lanes.stop()
        await self._close(GOING_AWAY, "server shutting down")
        return cut

    async def _end(self, code: str, message: str, reason: str) -> None:
        """Tell the client why the connection ends, then close with 1001 so it reconnects.

        The lanes stop first, so the error is the last event before the close."""
        await self.lanes.stop()
        with contextlib.suppress(ClientGone):
            await self.send_error(error_event(400, "invalid_request_error", code, message))
        await self._close(GOING_AWAY, reason)

    async def _close(self, code: int, reason: str) -> None:
        if self._state is SocketState.CLOSED:
            return
        self._state = SocketState.CLOSED
        self.record.closed(code, reason, "server")
        # A client that stopped reading may never let the close frame out: bound the wait,
        # the server drops the connection when the app returns.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.limits.close_timeout_seconds):
                await self._send({"type": "websocket.close", "code": code, "reason": reason})

    async def send_text(self, text: str) -> None:
        """Send one frame; raise `ClientGone` when the client has left or stopped reading."""
        if self._state is _CLOSED:
            raise ClientGone("the WebSocket is closed")
        gate = self._send_gate
        if gate.held:
            await gate.wait()
        else:
            gate.held = True
        # The watchdog reads these: a send that stays pending means a client not reading.
        self._send_started = time.monotonic()
        try:
            await self._send({"type": "websocket.send", "text": text})
        except Exception as exc:  # servers raise OSError or their own errors here
            self._state = _CLOSED
            raise ClientGone("the WebSocket client went away") from exc
        finally:
            self._send_started = None
            if gate.waiters:
                gate.release()
            else:
                gate.held = False

    async def _watch_sends(self) -> None:
        """Disconnect a client that leaves a frame unread for `max_send_stall_seconds`.

        One check per quarter of the limit instead of a timeout per frame: the frames of a
        turn stream at thousands per second, and they should cost next to nothing.
        """
        stall = self.limits.max_send_stall_seconds
        while True:
            await asyncio.sleep(stall / 4)
            started = self._send_started
            if started is None or time.monotonic() - started < stall:
                continue
            # The server's buffer is full and stays full.
            logger.warning("closing a WebSocket mode connection whose client stopped reading")
            await self._close(POLICY_VIOLATION, "client too slow to read its events")
            # The stuck send is in a lane or in the receive loop: end them all. `run()` takes
            # its own cancellation as the end of the connection.
            self.lanes.cancel()
            if self._run_task is not None:
                self._run_task.cancel()
            return

    async def send_event(self, event: dict[str, Any]) -> None:
        """Encode and send one server event (not one of a response's: its stream counts
        those)."""
        text = encode_event(event)
        self.record.bytes_out += len(text)
        await self.send_text(text)

    async def send_error(self, event: dict[str, Any]) -> None:
        """Send an error event of the connection's own, counting it."""
        self.stats.error(event["error"]["code"])
        text = encode_event(event)
        self.record.bytes_out += len(text)
        await self.send_text(text)

    # Frames.

    async def _on_frame(self, message: Message) -> None:
        # The frame is taken out of its message and let go as soon as it is parsed or refused:
        # nothing holds it while the next frame is awaited, nor while an answer waits on a
        # client that stopped reading.
        if message.get(REFUSED_MESSAGE):
            # Fragments the budget could not hold, dropped by the protocol as they came.
            await self.send_error(memory_budget_exceeded("this message"))
            return
        text = message.pop("text", None)
        data = message.pop("bytes", None)
        size = len(text) if text is not None else len(data or b"")
        del data
        self.stats.bytes_received += size
        self.record.bytes_in += size
        if text is None:
            await self.send_error(
                error_event(
                    400,
                    "invalid_request_error",
                    "unsupported_frame",
                    "Binary frames are not supported; send each event as JSON in a text frame.",
                )
            )
            return
        if self._too_large(text):
            del text
            await self.send_error(
                error_event(
                    400,
                    "invalid_request_error",
                    "message_too_large",
                    f"The message is larger than the server's limit of "
                    f"{self.limits.max_message_bytes} bytes (Limits.max_message_bytes).",
                )
            )
            return
        # The memory budget holds what parsing may cost at its peak until the frame is parsed;
        # a frame it cannot hold is refused unread, the connection and its cache kept.
        budget = self.settings.budget
        parsing = len(text) * PARSE_FACTOR
        if not budget.reserve(parsing):
            del text
            await self.send_error(memory_budget_exceeded("this message"))
            return
        event = None
        try:
            try:
                event = await parse_frame(text)
                held = held_cost(text, event) if isinstance(event, CreateEvent) else 0
            finally:
                budget.release(parsing)
                del text
            if isinstance(event, CreateEvent):
                self._submit(event, held)  # credentials checked when it runs
            elif isinstance(event, SteerEvent):
                await self._on_steer(event)
            elif isinstance(event, InterruptEvent):
                await self._on_interrupt(event)
            # A `response.processed` acknowledgement needs no answer.
        except ProtocolError as exc:
            # Its traceback's frames and the error it was raised from (a JSON error keeps the
            # document) hold the frame's text: dropped, as the refusal may wait on its lane or
            # on a client that stopped reading.
            exc.__traceback__ = exc.__context__ = exc.__cause__ = None
            # A create refused before it runs (its fields, its stream_id, a bound of the lanes)
            # leaves its access-log line as a turn that failed.
            if isinstance(event, CreateEvent) or exc.on_lane or exc.code == "invalid_stream_id":
                previous = event.previous_response_id if isinstance(event, CreateEvent) else None
                self._create_refused(exc, size, previous)
            # A busy lane answers it after what runs before it.
            if not self.lanes.refuse_in_order(exc):
                await self.send_error(exc.event())

    def _create_refused(
        self, error: ProtocolError, bytes_in: int, previous_response_id: str | None
    ) -> None:
        """The access-log line of a create refused before it ran, counted among the
        connection's refused creates (not its turns)."""
        observer = self.settings.observer
        record = observer.turn_started(
            self.record,
            stream_id=error.stream_id,
            previous_response_id=previous_response_id,
            model=None,
            bytes_in=bytes_in,
        )
        record.failed(error.code)
        record.bytes_out = len(encode_event(error.event()))
        observer.turn_ended(record, refused=True)

    def _too_large(self, text: str) -> bool:
        limit = self.limits.max_message_bytes
        # Characters never outnumber bytes, and UTF-8 never takes more than 4 per character.
        if len(text) > limit:
            return True
        return len(text) * 4 > limit and len(text.encode("utf-8", "surrogatepass")) > limit

    async def _on_steer(self, steer: SteerEvent) -> None:
        await self.check_credentials()
        await self.send_event(self.turns.steer(steer))

    async def _on_interrupt(self, interrupt: InterruptEvent) -> None:
        # Accepted, the response's turn sends what follows; refused, the refusal goes now.
        await self.check_credentials()
        refusal = self.turns.interrupt(interrupt)
        if refusal is not None:
            await self.send_event(refusal)

    # Requests.

    def _submit(self, create: CreateEvent, cost: int = 0) -> None:
        if self._state is SocketState.DRAINING:
            raise _shutting_down(create)
        self.lanes.submit(create, cost)

    async def check_credentials(
        self, give_back: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Run `authenticate` again when `reauthenticate_seconds` have passed, before work
        starts (a turn, queued or steered; a steer). A refused principal, or one of another
        store scope, gets an error event and a close (1008); `ClientGone` ends the work, as it
        does any work about to start on a socket refusing or closed. `give_back` runs first on
        a refusal: what the refused work held goes back to the client (a successor's steering
        input) while the socket is still open."""
        if not self._takes_work():
            raise ClientGone("the credentials were refused, or the WebSocket is closed")
        settings = self.settings
        hook, every = settings.authenticate, settings.reauthenticate_seconds
        now = asyncio.get_running_loop().time()
        if hook is None or every is None or now - self._authenticated_at < every:
            return
        try:
            principal = await authenticate(hook, self.scope)
            owner = None
            if settings.store is not None:
                owner = store_scope(principal, settings.principal_key, shared=settings.shared_store)
            if owner != self._owner:  # another caller on this socket: the cache is not theirs
                message = "The credentials now name another principal."
                raise AuthenticationFailed(message, status=403)
        except AuthenticationFailed as exc:
            if self._takes_work():  # else refused by another turn's check meanwhile, or closed
                self._state = SocketState.REFUSING
                if give_back is not None:
                    with contextlib.suppress(ClientGone):
                        await give_back()
                kind = error_type_for_status(exc.status)
                code, param = failure_code(exc), failure_param(exc)
                event = error_event(exc.status, kind, code, exc.message, param=param)
                with contextlib.suppress(ClientGone):
                    await self.send_error(event)
                await self.lanes.stop()  # all but the lane this may run in: ClientGone ends it
                await self._close(POLICY_VIOLATION, "credentials no longer accepted")
            raise ClientGone("the credentials were refused") from None
        self.turns.principal = principal
        self._authenticated_at = now

    def _takes_work(self) -> bool:
        """Whether work may start: the socket is neither refusing its credentials nor closed."""
        state = self._state
        return state is not SocketState.REFUSING and state is not SocketState.CLOSED

    async def _run_turn(self, create: CreateEvent) -> None:
        if self._state is SocketState.DRAINING:
            # Queued before the drain began: a drain starts no turn. Answered as a create
            # sent now would be, in its lane's order.
            refusal = _shutting_down(create)
            self._create_refused(refusal, create.size, create.previous_response_id)
            await self.send_error(refusal.event())
            return
        self.running += 1
        try:
            await self.check_credentials()  # as it starts: it may have waited in its lane
            await self.turns.run(create)
        finally:
            self.running -= 1
            self._active_at = asyncio.get_running_loop().time()

    async def _refuse(self, error: ProtocolError) -> None:
        await self.send_error(error.event())


def _shutting_down(create: CreateEvent) -> ProtocolError:
    """The refusal of a create during a drain."""
    return ProtocolError(
        SERVER_SHUTTING_DOWN_MESSAGE,
        code=SERVER_SHUTTING_DOWN,
        status=503,
        type="server_error",
        stream_id=create.stream_id,
    )


class _SendGate:
    """One send at a time on the socket, served in order: a lock whose uncontended taking is
    one attribute (this runs once per event; `asyncio.Lock.acquire` is a coroutine each time).

    Take it with `if gate.held: await gate.wait()` else `gate.held = True`; `release()` hands
    it to the next waiter, if any.
    """

    __slots__ = ("held", "waiters")

    def __init__(self) -> None:
        self.held = False
        self.waiters: deque[asyncio.Future[None]] = deque()

    async def wait(self) -> None:
        """Wait until a `release()` hands the gate over (it is then held for this caller)."""
        future = asyncio.get_running_loop().create_future()
        self.waiters.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # handed over just as this waiter was cancelled: pass it on
            raise

    def release(self) -> None:
        """Hand the gate to the first waiter still waiting, or leave it free."""
        while self.waiters:
            future = self.waiters.popleft()
            if not future.done():
                future.set_result(None)
                return
        self.held = False
