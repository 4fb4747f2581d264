"""One turn, from a validated `response.create` to its cached response.

The runner resolves `previous_response_id` in the connection's cache, builds the `Turn` and
the handler's request, and runs the in-process handler call (`ws_mode._handler_call`), whose
events flow through the turn's `ResponseStream` to the socket; the stream tells the turn in
flight when the response ended, and a finished one is cached before the client hears it. The
runner also answers `generate: false` warm-ups, starts the work that follows a response
(rendering its output, the `on_response` hook) off the next turn's path, and is the one caller
of the connection's steering (`ws_mode._steering`): it answers steers, and runs the successor
turns steering input calls for. It answers `response.interrupt` too: the running response it
names ends at once (`ResponseStream.interrupt`), its handler call is stopped, and its pending
steering input is returned.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson
from cachetools import LRUCache

from . import _logs as logs
from ._after_response import AfterResponses
from ._asgi import Scope
from ._cache import CachedResponse, ResponseCache
from ._client_events import CreateEvent, InterruptEvent, SteerEvent, may_store
from ._conversation import conversation_scope
from ._events import ResponseStream, lifecycle_events
from ._handler_call import HandlerCall, handler_headers, http_scope
from ._hooks import HookFailed
from ._lanes import Lanes
from ._logs import for_log
from ._persistence import StoreLink, StoreUnavailable
from ._protocol import (
    echoed_settings,
    encode_event,
    error_event,
    hook_failed,
    memory_budget_exceeded,
    not_found,
    quoted_id,
    server_error,
    store_unavailable,
)
from ._records import ConnectionRecord, TurnRecord
from ._settings import Settings
from ._socket import ClientGone, ClientSocket
from ._stack import entry
from ._steering import Outcome, SteerInbox, Steering, accepted_event
from ._tap import Usage
from ._tokens import Tokens
from ._turn import Turn, body_cost, build_body, turn_tools_digest

logger = logging.getLogger(__name__)

# How many distinct tool sets keep their handler-made artifacts per connection.
TOOL_SETS = 64
#: How many ids of the connection's latest failed responses are kept (never cached), so that
#: an interrupt of one is told it ended, not that it is unknown. A few KiB per connection.
FAILED_IDS = 16

#: The message of each `response.interrupt.failed` code.
INTERRUPT_MESSAGES = {
    "response_not_found": "Response with id '{id}' is not running on this connection.",
    "response_already_completed": "Response with id '{id}' has already ended; there is nothing "
    "to interrupt (continue it with response.create).",
    "interrupt_not_supported": "Interrupting responses is switched off on this server; the "
    "response runs to its end.",
}


class TurnRunner:
    """Runs the turns of one connection against its cache.

    The turns' events go out on `socket`, the connection's (`ws_mode._socket.ClientSocket`),
    which checks the credentials before a successor starts; `lanes` hold what each request
    costs until its response is cached.
    """

    def __init__(
        self,
        settings: Settings,
        scope: Scope,
        cache: ResponseCache,
        *,
        socket: ClientSocket,
        lanes: Lanes,
        connection: ConnectionRecord,
    ) -> None:
        self.settings = settings
        self.limits = settings.limits
        self.stats = settings.stats
        self.scope = scope
        self.cache = cache
        self.socket = socket
        self.lanes = lanes
        #: The connection's record, which each turn's record joins (`ws_mode._observe`).
        self.connection = connection
        self.observer = settings.observer
        self.principal: Any = None
        #: The store, when the middleware has one (`store=`), as this connection uses it.
        self.store: StoreLink | None = None
        #: The responses streaming now.
        self.streams: set[ResponseStream] = set()
        # The client's own conversation key headers are never passed on: each turn sets them.
        self._headers = settings.conversations.without_key_headers(handler_headers(scope))
        #: The scope of this connection's conversation keys when its principal has no key.
        self._own_scope = "connection:" + secrets.token_hex(16)
        #: Where turns enter: the whole application when the framework exposes one holding
        #: this middleware (every HTTP middleware a plain POST meets runs, those outside
        #: ws_mode included), else the app the middleware wraps.
        whole = entry(scope, settings)
        self._app = whole if whole is not None else settings.app
        self._handler_path = scope.get("root_path", "") + settings.handler_path
        self._tool_artifacts: LRUCache[bytes | None, dict[str, Any]] = LRUCache(TOOL_SETS)
        #: Work that follows responses, off the next turn's path.
        self.after = AfterResponses(settings)
        #: `response.steer` input, queued into responses and behind them (`ws_mode._steering`).
        self.steering = Steering(
            enabled=settings.steering, limits=settings.limits, budget=settings.budget
        )
        #: The ids of the latest responses that failed (`FAILED_IDS` at most).
        self._failed: deque[str] = deque(maxlen=FAILED_IDS)
        #: The connection drains: a steer is refused and no successor starts; the steering
        #: input queued in a running response goes back (`server_shutting_down`).
        self.draining = False

    async def run(self, create: CreateEvent) -> None:
        """Serve one `response.create`: its events go to the socket, its response to the
        cache; then the successors steering input calls for, on the same lane."""
        # Input queued behind the parent is committed by this create's response.created, or
        # returned if it fails before: kept until then, never dropped on the way.
        request = create
        send = self.socket.send_event
        create, committing = self.steering.prepend_pending(create)
        bytes_in = request.size  # the client's frame; a successor's input came in steers
        while True:
            inbox = self.steering.inbox_for(create)
            outcome = await self._run_one(create, inbox, request, bytes_in)
            bytes_in = 0
            if committing:
                created = outcome is not None and outcome.response_id is not None
                await self.steering.settle(committing, created, create.stream_id, send)
                committing = []
            if outcome is None or inbox is None:
                return
            follow = await self.steering.follow(create, outcome, send, draining=self.draining)
            if follow is None:
                return
            create, committing = follow
            # A successor is work the credentials must allow; refused, its input goes back.
            await self.socket.check_credentials(
                functools.partial(self.steering.settle, committing, False, create.stream_id, send)
            )

    def steer(self, steer: SteerEvent) -> dict[str, Any]:
        """The answer to a `response.steer`: `response.steer.accepted` once its input is queued
        in the response streaming now (numbered among that response's events), else
        `response.steer.failed`."""
        target = steer.previous_response_id
        active = next((s for s in self.streams if s.response_id == target and not s.finished), None)
        node = self.cache.get(target) if active is None else None
        lane = active.stream_id if active is not None else node.stream_id if node else None
        result = self.steering.accept(
            steer,
            active.inbox if active is not None else None,
            lane,
            streaming=active is not None,
            known=node is not None,
            draining=self.draining,
        )
        if isinstance(result, dict):
            return result
        assert active is not None  # accepted: the response is streaming
        return accepted_event(result, lane, active.next_sequence_number())

    def interrupt(self, interrupt: InterruptEvent) -> dict[str, Any] | None:
        """Answer a `response.interrupt`: None once the response it names, streaming now on
        any lane, is interrupted (its turn sends the acceptance, stops the handler and ends the
        response: `ResponseStream.interrupt`); else the `response.interrupt.failed` to send.
        Whichever comes first, the response's end or the interrupt, is what the client sees."""
        target = interrupt.response_id
        # A stream that finished is still here while its end goes out (or the call returns).
        stream = next((s for s in self.streams if s.response_id == target), None)
        if stream is not None and not stream.finished and self.settings.interrupts:
            stream.interrupt()
            return None
        node = self.cache.get(target) if stream is None else None
        lane = stream.stream_id if stream is not None else node.stream_id if node else None
        if not self.settings.interrupts:
            code = "interrupt_not_supported"
        elif (
            stream is not None
            or node is not None
            or target in self._failed
            or self.cache.why_missing(target) is not None  # finished, too large to keep
        ):
            code = "response_already_completed"
        else:
            code = "response_not_found"
        return interrupt_failed_event(code, target, lane)

    async def close(self) -> None:
        """The connection ended: give the work after its responses its grace period; what
        steering input still waits is dropped."""
        await self.after.finish()
        self.steering.close()

    async def _run_one(
        self, create: CreateEvent, inbox: SteerInbox | None, request: CreateEvent, bytes_in: int
    ) -> Outcome | None:
        """One turn (`request` is what the client sent); how its response ended. Its record
        (and span, current meanwhile) spans all of it."""
        record = self.observer.turn_started(
            self.connection,
            stream_id=create.stream_id,
            previous_response_id=create.previous_response_id,
            model=create.fields.get("model"),
            bytes_in=bytes_in,
        )
        try:
            return await self._serve(create, inbox, request, record)
        finally:
            self.observer.turn_ended(record)

    async def _serve(
        self,
        create: CreateEvent,
        inbox: SteerInbox | None,
        request: CreateEvent,
        record: TurnRecord,
    ) -> Outcome | None:
        """The turn `_run_one` records: what it did goes in `record` as it goes."""
        previous: CachedResponse | None = None
        forwarded = False
        if create.previous_response_id is not None:
            previous = self.cache.get(create.previous_response_id)
            if previous is not None:
                self.stats.cache_hits += 1
                record.cache = "hit"
            else:
                self.stats.cache_misses += 1
                record.cache = "miss"
                if self.store is not None:
                    try:
                        previous = await self.store.hydrate(
                            create.previous_response_id, create.stream_id, self.cache
                        )
                    except StoreUnavailable:  # its detail is in the log, not for the client
                        await self._refuse(
                            record,
                            store_unavailable(create.previous_response_id, create.stream_id),
                        )
                        return None
                    if previous is not None:
                        record.cache = "store"
            if previous is not None:
                self.stats.bytes_saved += previous.context_bytes
            else:
                if self.settings.on_cache_miss != "forward":
                    why = self.cache.why_missing(create.previous_response_id)
                    await self._refuse(
                        record, not_found(create.previous_response_id, create.stream_id, why)
                    )
                    return None
                forwarded = True  # the handler resolves the id itself
                record.cache = "forwarded"
        try:
            current, new_fragment, body = self._prepare(create, previous, forwarded, inbox)
        except Exception as exc:
            await self._refuse(record, _unprepared(create, exc))
            return None
        if body is None:
            self.stats.warm_ups += 1
            self.lanes.let_go(request)
            record.warm_up = True
            await self._warm_up(create, current, new_fragment, record)
            return None
        # What the handler call holds of its body, and of a hydrated chain no cache holds, is
        # reserved until the call ends (`_run_handler`); refused, the turn is not run.
        held = body_cost(body, previous, full_context=current.full_context, new_items=create.items)
        if previous is not None and previous.holders == 0:
            held += previous.chain_size
        if not self.settings.budget.reserve(held):
            await self._refuse(record, memory_budget_exceeded("this request", create.stream_id))
            return None
        self.stats.turns += 1
        started = time.perf_counter()  # not loop.time(): uvloop's is cached, in milliseconds
        stream = ResponseStream(
            self.socket,
            _TurnInFlight(self, create, request, current, new_fragment, forwarded),
            stream_id=create.stream_id,
            previous_response_id=create.previous_response_id,
            inbox=inbox,
        )
        headers = self.settings.conversations.with_key(self._headers, current.conversation_key)
        if record.span is not None:  # the turn's trace context goes to the handler
            headers = record.span.handler_headers(headers)
        scope = http_scope(
            self.scope,
            path=self._handler_path,
            headers=headers,
            body_length=len(body),
            extension=current,
        )
        try:
            return await self._run_handler(stream, scope, body, started, inbox, held)
        finally:
            self._note(record, stream)

    async def _run_handler(
        self,
        stream: ResponseStream,
        scope: Scope,
        body: bytes,
        started: float,
        inbox: SteerInbox | None,
        held: int,
    ) -> Outcome:
        """Call the handler and see its response to the end (cached, or failed). `held`,
        reserved in the memory budget, is given back when the call ends, whenever that is, or
        when it is abandoned (a handler that ignores its cancellation:
        `Limits.abandon_handler_seconds`)."""
        self.streams.add(stream)
        max_buffered = self.limits.max_buffered_answer_bytes
        handler = HandlerCall(
            self._app, scope, body, stream, max_buffered=max_buffered, budget=self.settings.budget
        )
        call = handler.start(functools.partial(self.settings.budget.release, held))
        try:
            await self._until_finished(stream, handler, call)
            if stream.interruption is not None:
                await self._interrupted(stream.interruption, handler, call)
            elif stream.steered and not call.done():
                await handler.stop(call)  # what it would still say was cut off for steering
        finally:
            self.streams.discard(stream)
            if stream.response_id is not None and not stream.succeeded:
                self._failed.append(stream.response_id)
            if stream.finished:
                elapsed = time.perf_counter() - started
                self.stats.turn_finished(elapsed, failed=stream.failure is not None)
                if stream.failure is not None:
                    self.stats.error(stream.failure)
            if not call.done():
                if handler.stopped:
                    # The turn is over and the call was told so: it gets a bounded time to
                    # end, never the lane's (the next request starts now).
                    self.after.stopping(handler, call, _turn_name(stream))
                else:
                    # The client has its terminal event; what the handler still does (a
                    # background task, logging) goes on without holding up the lane.
                    self.after.track_call(handler, call, _turn_name(stream))
        if call.done() and not call.cancelled():  # stopped for an interrupt: nothing to read
            try:
                call.result()
            except ClientGone:
                raise
            except Exception:
                # ws_mode's own fault; the lane and the connection go on.
                logger.exception("WebSocket mode turn failed")
                if not stream.finished:
                    await stream.event(server_error("The server failed to run this request."))
        # Without an inbox too: whether it was created decides what becomes of the steering
        # input this create was to commit.
        return Outcome(
            inbox if inbox is not None else SteerInbox(),
            stream.response_id,
            stream.output,
            stream.next_sequence_number(),
            interrupted=stream.interruption is not None,
        )

    async def _interrupted(
        self, frames: list[str], handler: HandlerCall, call: asyncio.Task[None]
    ) -> None:
        """Tell the client its interrupt is accepted, stop the handler, then send the rest of
        the interrupted response's end (`ResponseStream.interrupt`): the lane's next request
        starts after it, with the handler (through the proxy, its upstream request) told to
        stop and, unless it ignores its cancellation, gone."""
        send = self.socket.send_text
        try:
            await send(frames[0])
        finally:
            await handler.stop(call)
        for frame in frames[1:]:
            await send(frame)

    def _note(self, record: TurnRecord, stream: ResponseStream) -> None:
        """Put in `record` how the turn's response ended and what it sent."""
        record.response_id = stream.response_id
        record.steered = stream.steered
        record.interrupted = stream.interruption is not None
        record.bytes_out += stream.bytes_out
        self.connection.bytes_out += stream.bytes_out
        if not stream.finished:
            return  # abandoned
        terminal = stream.tap.terminal
        if terminal is not None:
            # Read once, from the terminal response object decoded anyway; its model is the
            # handler's (or upstream's) word, not the request's.
            model = terminal.get("model")
            record.model = model if isinstance(model, str) else None
            record.usage = usage = Usage.of(terminal)
            if usage is not None:
                continuation = record.previous_response_id is not None
                self.stats.count_tokens(record.model, usage, continuation=continuation)
        response = stream.tap.response
        if response is not None:
            status = response.get("status")
            record.status = status if isinstance(status, str) else "completed"
        else:
            record.failed(stream.failure)

    async def _refuse(self, record: TurnRecord, event: dict[str, Any]) -> None:
        """Answer a turn that cannot run with an error event."""
        record.failed(event["error"]["code"])
        record.bytes_out += len(encode_event(event))  # the connection counts it too
        await self.socket.send_error(event)

    def _prepare(
        self,
        create: CreateEvent,
        previous: CachedResponse | None,
        forwarded: bool,
        inbox: SteerInbox | None,
    ) -> tuple[Turn, bytes, bytes | None]:
        """The turn's Turn, its new items encoded, and the handler's request body (None for a
        warm-up, which calls no handler)."""
        digest = turn_tools_digest(create, previous)
        renderer = self.settings.renderer
        if renderer is not None and previous is not None and previous.tokens is None:
            # A parent made elsewhere (hydrated from the store): render its context once.
            parent = previous
            parent.defer_tokens(lambda: Tokens().extended(renderer(list(parent.context_items()))))
        keys, settings = self.settings.conversations, self.settings
        scope = conversation_scope(self.principal, settings.principal_key, self._own_scope)
        key = keys.of_turn(scope, previous, create.fields.get("prompt_cache_key"))
        current = Turn(
            conversation_key=key,
            previous=previous,
            new_input=create.items,
            stream_id=create.stream_id,
            tools_digest=digest,
            generate=create.generate,
            full_context=_full_context(self.settings.full_context, previous, forwarded),
            cache_aware=self.settings.full_context == "on_miss",
            tool_artifacts=self._tool_artifacts_for(digest),
            principal=self.principal,
            new_tokens=list(renderer(create.new_input)) if renderer is not None else None,
            steering=inbox,
            tools=create.tools,
        )
        new_fragment = create.items.fragment
        if not create.generate:
            return current, new_fragment, None
        body = build_body(
            create,
            previous,
            full_context=current.full_context,
            new_fragment=new_fragment,
            extra=keys.fields(scope, key, create.fields),
        )
        return current, new_fragment, body

    async def _until_finished(
        self, stream: ResponseStream, handler: HandlerCall, call: asyncio.Task[None]
    ) -> None:
        """Wait until the response ended or the handler call returned, whichever is first.
        Past `max_turn_seconds` the call is stopped and the client gets the timeout's error at
        once, whether the handler honours its cancellation or not.

        One future, resolved by whichever comes first (the stream's end, the call's return,
        `max_turn_seconds`): `asyncio.wait` on the call and a task waiting on an event cost a
        task, a future and a pass of the event loop more per turn."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        stream.ended = waiter
        call.add_done_callback(functools.partial(_call_ended, waiter))
        limit = self.limits.max_turn_seconds
        timer = loop.call_later(limit, _wake, waiter) if limit is not None else None
        try:
            if not stream.finished and not call.done():
                await waiter
        finally:
            stream.ended = None
            if timer is not None:
                timer.cancel()
            if not stream.finished and not call.done():
                # Past `max_turn_seconds`, or the turn was abandoned (the client left, a
                # limit): the call is stopped, never waited for (`_run_handler` gives it its
                # bounded time to end).
                handler.stop_now(call)
        if not stream.finished and handler.stopped:
            await stream.event(
                error_event(
                    504,
                    "server_error",
                    "turn_timeout",
                    f"The handler did not finish within {self.limits.max_turn_seconds:g} "
                    "seconds (Limits.max_turn_seconds).",
                )
            )

    async def _warm_up(
        self, create: CreateEvent, current: Turn, new_fragment: bytes, record: TurnRecord
    ) -> None:
        """`generate: false`: prepare the request's state and answer with an empty response.

        The input is validated, encoded and rendered now, so the first generated turn that
        continues from the warm-up finds it all cached. No handler saw it, so nothing has
        authorized its content: it is never written to the store by itself, only with the
        first generated response that continues from it (whose context the handler saw).
        """
        response = warm_up_response(create.fields, create.previous_response_id)
        node = CachedResponse(
            id=response["id"],
            response=response,
            input_items=create.items,
            output_items=[],
            parent=current.previous,
            stream_id=create.stream_id,
            tools_digest=current.tools_digest,
            input_fragment=new_fragment,
            storable=_storable(create, response),
            conversation_key=current.conversation_key,
        )
        self.cache_response(node, current, [], write=False)
        node.tokens  # noqa: B018  (render now: that is what a warm-up is for)
        record.response_id, record.status = response["id"], "completed"
        for event in lifecycle_events(response, in_progress=False):
            if create.stream_id is not None:
                event["stream_id"] = create.stream_id
            text = encode_event(event)
            record.bytes_out += len(text)
            self.connection.bytes_out += len(text)
            await self.socket.send_text(text)

    # State kept across turns.

    def _tool_artifacts_for(self, digest: bytes | None) -> dict[str, Any]:
        artifacts = self._tool_artifacts.get(digest)
        if artifacts is None:
            artifacts = self._tool_artifacts[digest] = {}
        return artifacts

    def cache_response(
        self,
        node: CachedResponse,
        current: Turn,
        output: list[dict[str, Any]],
        *,
        write: bool = True,
    ) -> None:
        """Cache a finished response, and start writing it to the store (with its ancestors
        never written) unless `write` is False (a warm-up); its output is rendered later,
        off the next turn's path."""
        renderer = self.settings.renderer
        prefix, new_tokens = current.prefix_tokens, current.new_tokens
        if renderer is not None and prefix is not None and new_tokens is not None:
            node.defer_tokens(
                lambda: prefix.extended(new_tokens, renderer(output) if output else ())
            )
        self.cache.put(node)
        if write and self.store is not None:
            # Started now, before the terminal event goes out; the process owns the write,
            # so the connection closing never cancels it.
            self.store.write(node)


def interrupt_failed_event(code: str, response_id: str, lane: str | None) -> dict[str, Any]:
    """`response.interrupt.failed` (status 400): nothing was interrupted; on the response's
    lane when it is known."""
    message = INTERRUPT_MESSAGES[code].format(id=quoted_id(response_id))
    event: dict[str, Any] = {
        "type": "response.interrupt.failed",
        "sequence_number": 0,
        "status": 400,
        "response_id": response_id,
        "error": {
            "type": "invalid_request_error",
            "code": code,
            "message": message,
            "param": "response_id",
        },
    }
    if lane is not None:
        event["stream_id"] = lane
    return event


@dataclass(slots=True, eq=False)
class _TurnInFlight:
    """One turn while its handler answers, as its stream's `ResponseOwner`: the response that
    finished is cached before the client hears it did; a failed one drops the parent it
    continued on that parent's own lane."""

    runner: TurnRunner
    create: CreateEvent
    #: The request the client sent, whose cost the lanes hold until the response is cached
    #: (`create` is what runs: it with steering input prepended, or a successor).
    request: CreateEvent
    current: Turn
    new_fragment: bytes
    #: The parent is not cached here: the handler resolves `previous_response_id` itself.
    forwarded: bool

    def response_finished(
        self, response: dict[str, Any], output: list[dict[str, Any]], size: int
    ) -> None:
        create, current, runner = self.create, self.current, self.runner
        node = CachedResponse(
            size=size,
            id=response["id"],
            response=response,
            input_items=create.items,
            output_items=output,
            parent=current.previous,
            stream_id=create.stream_id,
            tools_digest=current.tools_digest,
            artifacts=current.artifacts,
            input_fragment=self.new_fragment,
            remote=self.forwarded,
            storable=_storable(create, response),
            conversation_key=current.conversation_key,
        )
        # What the request held is let go first, so the two never count at once.
        runner.lanes.let_go(self.request)
        runner.cache_response(node, current, output)
        runner.after.start(node, current, response)

    def response_failed(self, response: dict[str, Any] | None) -> None:
        # A failed continuation on the parent's own lane drops the parent
        # (docs/protocol.md, "Conversation state").
        previous = self.current.previous
        if previous is not None and previous.stream_id == self.create.stream_id:
            self.runner.cache.evict(previous.id)
        if response is not None:
            # Not cached, but finished: `on_response` sees it (its usage is billed too).
            self.runner.after.start(None, self.current, response)


def _full_context(mode: str, previous: CachedResponse | None, forwarded: bool) -> bool:
    """Whether a turn's request carries the whole context in `input`."""
    if previous is None:
        return not forwarded
    return mode == "always" and not previous.remote


def _turn_name(stream: ResponseStream) -> str:
    """The turn a handler call served, as the log names it."""
    return f"response {for_log(stream.response_id)}, stream_id {for_log(stream.stream_id)}"


def _wake(waiter: asyncio.Future[None]) -> None:
    """Resolve the future a turn waits on, unless it is done (or cancelled) already."""
    if not waiter.done():
        waiter.set_result(None)


def _call_ended(waiter: asyncio.Future[None], call: asyncio.Task[None]) -> None:
    """The handler call's one done callback: it wakes the turn, and reads the call's outcome
    (if the turn is abandoned just as the call fails, nobody reads it otherwise)."""
    _wake(waiter)
    if not call.cancelled():
        call.exception()


def _unprepared(create: CreateEvent, exc: Exception) -> dict[str, Any]:
    """The error event of a request that could not be turned into a handler call."""
    if isinstance(exc, orjson.JSONEncodeError):
        # orjson reads JSON nested up to 1,024 levels but writes only up to 254.
        return error_event(
            400,
            "invalid_request_error",
            "nested_too_deeply",
            f"The request cannot be re-encoded: {exc}. Nest input, tools and metadata less deeply.",
            stream_id=create.stream_id,
        )
    if isinstance(exc, HookFailed):  # the application's renderer: its error, named
        logs.hook_raised(logger, exc.hook, exc.__cause__, "the turn fails, the socket goes on")
        return hook_failed(exc.hook, create.stream_id)
    logger.error("preparing a WebSocket mode turn failed", exc_info=exc)
    return server_error("The server failed to prepare this request.", stream_id=create.stream_id)


def warm_up_response(fields: dict[str, Any], previous_response_id: str | None) -> dict[str, Any]:
    """The response a `generate: false` warm-up answers with: completed at once, no output,
    no usage, and every field a response object has (the Open Responses schema requires them
    all), the request's settings echoed (`echoed_settings`)."""
    created = int(time.time())
    return {
        "id": "resp_" + secrets.token_hex(16),
        "object": "response",
        "created_at": created,
        "completed_at": created,
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": fields.get("instructions"),
        "model": fields.get("model"),
        "output": [],
        "previous_response_id": previous_response_id,
        "store": fields.get("store") is not False,
        "usage": None,
        "metadata": fields.get("metadata") or {},
        **echoed_settings(fields),
    }


def _storable(create: CreateEvent, response: dict[str, Any]) -> bool:
    """Whether a response may be kept beyond the connection: neither the request nor the
    response object says `store: false` (true by default)."""
    return may_store(create.fields.get("store"), response)
