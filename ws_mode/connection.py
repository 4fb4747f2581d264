"""One WebSocket mode socket: its receive loop, lanes, in-flight budget, lifetime and cache.

The receive loop parses each frame into a client event; a bad frame gets an error event and
the loop goes on. Creates go to their lane: first in, first out per `stream_id`, lanes
concurrent, at most `max_in_flight` turns running, the rest queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cachetools import LRUCache
from starlette.types import Message, Receive, Scope, Send

from .cache import CachedResponse, ResponseCache, encode_items
from .client_events import (
    CreateEvent,
    ProtocolError,
    SteerEvent,
    parse_client_event,
    steer_input_problem,
)
from .dispatch import ClientGone, HandlerCall, handler_headers, http_scope
from .protocol import (
    STEER_MESSAGES,
    encode_event,
    error_event,
    server_error,
    steer_failed_event,
)
from .stream import ResponseStream
from .turn import Turn, build_body, tools_digest

if TYPE_CHECKING:
    from .middleware import Settings

__all__ = ["Connection"]

logger = logging.getLogger(__name__)

# Close codes (RFC 6455 §7.4.1). 1001 tells clients such as the openai SDK to reconnect.
GOING_AWAY = 1001
POLICY_VIOLATION = 1008
# How long sending the close frame may take.
CLOSE_TIMEOUT = 1.0
# How many distinct tool sets keep their handler-made artifacts per connection.
TOOL_SETS = 64
# How long post-response work may run on after its connection closed.
AFTER_RESPONSE_GRACE = 5.0


@dataclass(eq=False)
class _Lane:
    stream_id: str | None
    # Creates, and refusals of creates, answered in order.
    queue: deque[CreateEvent | ProtocolError] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None


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
        )
        self._lanes: dict[str | None, _Lane] = {}
        self._named_lanes: set[str] = set()
        self._in_flight = asyncio.Semaphore(self.limits.max_in_flight)
        self._waiting = 0  # creates taken off their lane, waiting for an in-flight slot
        self._streams: set[ResponseStream] = set()
        self._tool_artifacts: LRUCache[bytes | None, dict[str, Any]] = LRUCache(TOOL_SETS)
        self._after: set[asyncio.Task[None]] = set()
        self._send_lock = asyncio.Lock()
        self._closed = False
        self._headers = handler_headers(scope)
        self.principal: Any = None
        self._draining = False
        self._send_started: float | None = None
        self._run_task: asyncio.Task[Any] | None = None
        self._stalled = False
        self._handler_path = scope.get("root_path", "") + settings.handler_path

    # The socket.

    async def run(self, *, principal: Any = None, subprotocol: str | None = None) -> None:
        """Accept the socket and serve it; return when it is closed."""
        self.principal = principal
        accept: dict[str, Any] = {"type": "websocket.accept"}
        if subprotocol is not None:
            accept["subprotocol"] = subprotocol
        await self._send(accept)
        deadline = asyncio.get_running_loop().time() + self.limits.max_connection_seconds
        self._run_task = asyncio.current_task()
        watchdog = asyncio.create_task(self._watch_sends())
        try:
            while True:
                try:
                    async with asyncio.timeout_at(deadline):
                        message = await self._receive()
                except TimeoutError:
                    await self._end_of_life()
                    return
                kind = message["type"]
                if kind == "websocket.receive":
                    await self._on_frame(message)
                elif kind == "websocket.disconnect":
                    return
        except ClientGone:
            return
        except asyncio.CancelledError:
            if not self._stalled:
                raise
            # The watchdog ended a connection whose client stopped reading.
            self._run_task.uncancel()  # type: ignore[union-attr]
            return
        finally:
            self._closed = True
            watchdog.cancel()
            await self._stop_lanes()
            await self._finish_after_response_work()
            self.cache.clear()

    async def drain(self, grace: float) -> None:
        """Refuse new requests, let running and queued turns finish for up to `grace`
        seconds, then close with 1001 so clients reconnect elsewhere."""
        self._draining = True
        deadline = asyncio.get_running_loop().time() + grace
        while tasks := [lane.task for lane in self._lanes.values() if lane.task is not None]:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                break
            await asyncio.wait(tasks, timeout=remaining)
        await self._stop_lanes()
        await self._close(GOING_AWAY, "server shutting down")

    async def _end_of_life(self) -> None:
        minutes = self.limits.max_connection_seconds / 60
        with contextlib.suppress(ClientGone):
            await self.send_error(
                error_event(
                    400,
                    "invalid_request_error",
                    "websocket_connection_limit_reached",
                    f"Responses websocket connection limit reached ({minutes:g} minutes). "
                    "Create a new websocket connection to continue.",
                )
            )
        await self._stop_lanes()
        await self._close(GOING_AWAY, "connection lifetime limit reached")

    async def _close(self, code: int, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        # A client that stopped reading may never let the close frame out: bound the wait,
        # the server drops the connection when the app returns.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await self._send({"type": "websocket.close", "code": code, "reason": reason})

    async def send_text(self, text: str) -> None:
        """Send one frame; raise `ClientGone` when the client has left or stopped reading."""
        if self._closed:
            raise ClientGone("the WebSocket is closed")
        async with self._send_lock:
            # The watchdog reads these: a send that stays pending means a client not reading.
            self._send_started = time.monotonic()
            try:
                await self._send({"type": "websocket.send", "text": text})
            except Exception as exc:  # servers raise OSError or their own errors here
                self._closed = True
                raise ClientGone("the WebSocket client went away") from exc
            finally:
                self._send_started = None

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
            self._stalled = True
            await self._close(POLICY_VIOLATION, "client too slow to read its events")
            # The stuck send is in a lane or in the receive loop: end them all. `run()` takes
            # its own cancellation as the end of the connection.
            for lane in self._lanes.values():
                if lane.task is not None:
                    lane.task.cancel()
            if self._run_task is not None:
                self._run_task.cancel()
            return

    async def send_event(self, event: dict[str, Any]) -> None:
        """Encode and send one server event."""
        await self.send_text(encode_event(event))

    async def send_error(self, event: dict[str, Any]) -> None:
        """Send an error event of the connection's own, counting it."""
        self.stats.error(event["error"]["code"])
        await self.send_text(encode_event(event))

    # Frames.

    async def _on_frame(self, message: Message) -> None:
        text = message.get("text")
        self.stats.bytes_received += (
            len(text) if text is not None else len(message.get("bytes") or b"")
        )
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
        try:
            event = parse_client_event(text)
            if isinstance(event, SteerEvent):
                await self._on_steer(event)
            else:
                self._submit(event)
        except ProtocolError as exc:
            lane = self._lanes.get(exc.stream_id) if exc.on_lane else None
            if lane is not None:
                lane.queue.append(exc)  # the lane is busy: answer after what runs before it
            else:
                await self.send_error(exc.event())

    def _too_large(self, text: str) -> bool:
        limit = self.limits.max_message_bytes
        # Characters never outnumber bytes, and UTF-8 never takes more than 4 per character.
        if len(text) > limit:
            return True
        return len(text) * 4 > limit and len(text.encode("utf-8", "surrogatepass")) > limit

    async def _on_steer(self, steer: SteerEvent) -> None:
        target = steer.previous_response_id
        node = self.cache.get(target)
        active = next((s for s in self._streams if s.response_id == target), None)
        found = node is not None or active is not None
        lane = node.stream_id if node is not None else active.stream_id if active else None
        problem = steer_input_problem(steer.input)
        if problem is not None:
            code, message = "invalid_input", STEER_MESSAGES["invalid_input"].format(detail=problem)
        elif not found:
            code = "response_not_found"
            message = STEER_MESSAGES["response_not_found"].format(id=target)
        else:
            code, message = "steering_not_supported", STEER_MESSAGES["steering_not_supported"]
        await self.send_event(
            steer_failed_event(code, target, steer.input, message, stream_id=lane)
        )

    # Lanes.

    def _submit(self, create: CreateEvent) -> None:
        if self._draining:
            raise ProtocolError(
                "The server is shutting down; reconnect to continue.",
                code="server_shutting_down",
                status=503,
                type="server_error",
                stream_id=create.stream_id,
            )
        lane = self._lanes.get(create.stream_id)
        if lane is None:
            if create.stream_id is not None:
                if (
                    create.stream_id not in self._named_lanes
                    and len(self._named_lanes) >= self.limits.max_streams
                ):
                    raise ProtocolError(
                        f"This connection already uses {self.limits.max_streams} stream_ids, "
                        "the most it may.",
                        code="websocket_stream_limit_reached",
                        param="stream_id",
                        stream_id=create.stream_id,
                    )
                self._named_lanes.add(create.stream_id)
            lane = self._lanes[create.stream_id] = _Lane(create.stream_id)
        if self._queued() >= self.limits.max_queued:
            raise ProtocolError(
                f"Too many requests are waiting on this connection ({self.limits.max_queued}); "
                "wait for responses to finish before sending more.",
                code="too_many_queued_requests",
                param=None,
                status=429,
                stream_id=create.stream_id,
            )
        lane.queue.append(create)
        if lane.task is None:
            lane.task = asyncio.create_task(self._drain(lane))

    def _queued(self) -> int:
        return self._waiting + sum(len(lane.queue) for lane in self._lanes.values())

    async def _drain(self, lane: _Lane) -> None:
        try:
            while lane.queue:
                item = lane.queue.popleft()
                if isinstance(item, ProtocolError):
                    await self.send_error(item.event())
                    continue
                # Still waiting while it waits for a slot: `max_queued` counts it.
                self._waiting += 1
                try:
                    await self._in_flight.acquire()
                finally:
                    self._waiting -= 1
                try:
                    await self._run_turn(item)
                finally:
                    self._in_flight.release()
        except ClientGone:
            pass
        finally:
            lane.task = None
            if not lane.queue and self._lanes.get(lane.stream_id) is lane:
                del self._lanes[lane.stream_id]

    async def _stop_lanes(self) -> None:
        tasks = [lane.task for lane in self._lanes.values() if lane.task is not None]
        for lane in self._lanes.values():
            lane.queue.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._lanes.clear()

    # A turn.

    async def _run_turn(self, create: CreateEvent) -> None:
        previous: CachedResponse | None = None
        forwarded = False
        if create.previous_response_id is not None:
            previous = self.cache.get(create.previous_response_id)
            if previous is not None:
                self.stats.cache_hits += 1
                self.stats.bytes_saved += previous.context_bytes
            else:
                self.stats.cache_misses += 1
                if self.settings.on_cache_miss != "forward":
                    await self.send_error(_not_found(create))
                    return
                forwarded = True  # the handler resolves the id itself
        digest = tools_digest(create.tools)
        renderer = self.settings.renderer
        current = Turn(
            previous=previous,
            new_input=create.new_input,
            stream_id=create.stream_id,
            tools_digest=digest,
            generate=create.generate,
            full_context=_full_context(self.settings.full_context, previous, forwarded),
            tool_artifacts=self._tool_artifacts_for(digest),
            principal=self.principal,
            new_tokens=list(renderer(create.new_input)) if renderer is not None else None,
        )
        new_fragment = encode_items(create.new_input)
        if not create.generate:
            self.stats.warm_ups += 1
            await self._warm_up(create, current, new_fragment)
            return
        self.stats.turns += 1
        started = asyncio.get_running_loop().time()

        def finished(response: dict[str, Any], output: list[dict[str, Any]], size: int) -> None:
            node = CachedResponse(
                size=size,
                id=response["id"],
                response=response,
                input_items=create.new_input,
                output_items=output,
                parent=previous,
                stream_id=create.stream_id,
                tools_digest=digest,
                artifacts=current.artifacts,
                input_fragment=new_fragment,
                remote=forwarded,
            )
            self._remember(node, current, output)
            self._after_response(node, current, response)

        def failed() -> None:
            # A failed continuation on the parent's own lane drops the parent (PROTOCOL.md §4).
            if previous is not None and previous.stream_id == create.stream_id:
                self.cache.evict(previous.id)

        stream = ResponseStream(
            send_text=self.send_text,
            stream_id=create.stream_id,
            previous_response_id=create.previous_response_id,
            on_finished=finished,
            on_failed=failed,
        )
        body = build_body(
            create, previous, full_context=current.full_context, new_fragment=new_fragment
        )
        scope = http_scope(
            self.scope,
            path=self._handler_path,
            headers=self._headers,
            body_length=len(body),
            extension=current,
        )
        self._streams.add(stream)
        call = asyncio.create_task(HandlerCall(self.settings.app, scope, body, stream).run())
        # If the turn is abandoned just as the call fails, nobody reads the outcome here.
        call.add_done_callback(_retrieve)
        try:
            await self._until_finished(stream, call)
        finally:
            self._streams.discard(stream)
            if stream.finished:
                elapsed = asyncio.get_running_loop().time() - started
                self.stats.turn_finished(elapsed, failed=stream.failure is not None)
                if stream.failure is not None:
                    self.stats.error(stream.failure)
        if not call.done():
            # The client has its terminal event; what the handler still does (a background
            # task, logging) goes on without holding up the lane.
            self._keep(call)
            return
        try:
            call.result()
        except ClientGone:
            raise
        except Exception:
            # ws_mode's own fault; the lane and the connection go on.
            logger.exception("WebSocket mode turn failed")
            if not stream.finished:
                await stream.event(server_error("The server failed to run this request."))

    async def _until_finished(self, stream: ResponseStream, call: asyncio.Task[None]) -> None:
        """Wait until the response ended or the handler call returned, whichever is first."""
        ended = asyncio.create_task(stream.ended.wait())
        try:
            await asyncio.wait(
                (call, ended),
                timeout=self.limits.max_turn_seconds,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            ended.cancel()
            if not stream.finished and not call.done():
                # Past `max_turn_seconds`, or the turn was abandoned (the client left, a limit).
                call.cancel()
                await asyncio.gather(call, return_exceptions=True)
        if not stream.finished and call.cancelled():
            await stream.event(
                error_event(
                    504,
                    "server_error",
                    "turn_timeout",
                    f"The handler did not finish within {self.limits.max_turn_seconds:g} "
                    "seconds (Limits.max_turn_seconds).",
                )
            )

    async def _warm_up(self, create: CreateEvent, current: Turn, new_fragment: bytes) -> None:
        """`generate: false`: prepare the request's state and answer with an empty response.

        The input is validated, encoded and rendered now, so the first generated turn that
        continues from the warm-up finds it all cached.
        """
        fields = create.fields
        response: dict[str, Any] = {
            "id": "resp_" + secrets.token_hex(16),
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": fields.get("model"),
            "output": [],
            "previous_response_id": create.previous_response_id,
            "instructions": fields.get("instructions"),
            "tools": fields.get("tools") or [],
            "tool_choice": fields.get("tool_choice", "auto"),
            "parallel_tool_calls": fields.get("parallel_tool_calls", True),
            "store": fields.get("store", False),
            "metadata": fields.get("metadata") or {},
            "usage": None,
            "error": None,
            "incomplete_details": None,
        }
        node = CachedResponse(
            id=response["id"],
            response=response,
            input_items=create.new_input,
            output_items=[],
            parent=current.previous,
            stream_id=create.stream_id,
            tools_digest=current.tools_digest,
            input_fragment=new_fragment,
        )
        self._remember(node, current, [])
        node.tokens  # noqa: B018  (render now: that is what a warm-up is for)
        created = {**response, "status": "in_progress"}
        events: list[dict[str, Any]] = [
            {"type": "response.created", "sequence_number": 0, "response": created},
            {"type": "response.completed", "sequence_number": 1, "response": response},
        ]
        for event in events:
            if create.stream_id is not None:
                event["stream_id"] = create.stream_id
            await self.send_event(event)

    # State kept across turns.

    def _tool_artifacts_for(self, digest: bytes | None) -> dict[str, Any]:
        artifacts = self._tool_artifacts.get(digest)
        if artifacts is None:
            artifacts = self._tool_artifacts[digest] = {}
        return artifacts

    def _remember(self, node: CachedResponse, current: Turn, output: list[dict[str, Any]]) -> None:
        """Cache a finished response; its output is rendered later, off the next turn's path."""
        renderer = self.settings.renderer
        prefix, new_tokens = current.prefix_tokens, current.new_tokens
        if renderer is not None and prefix is not None and new_tokens is not None:
            node.defer_tokens(
                lambda: prefix.extended(new_tokens, renderer(output) if output else ())
            )
        self.cache.put(node)

    def _after_response(
        self, node: CachedResponse, current: Turn, response: dict[str, Any]
    ) -> None:
        """Start the work that follows a finished response, without waiting for it."""
        if self.settings.renderer is None and self.settings.on_response is None:
            return
        self._keep(asyncio.create_task(self._run_after_response(node, current, response)))

    def _keep(self, task: asyncio.Task[None]) -> None:
        """Track work that outlives its turn, so the connection can finish it on close."""
        self._after.add(task)
        task.add_done_callback(_log_failure)
        task.add_done_callback(self._after.discard)

    async def _run_after_response(
        self, node: CachedResponse, current: Turn, response: dict[str, Any]
    ) -> None:
        await asyncio.sleep(0)  # let the terminal event go out first
        try:
            node.tokens  # noqa: B018  (render the output now, while the client runs its tools)
            hook = self.settings.on_response
            if hook is not None:
                result = hook(current, response)
                if inspect.isawaitable(result):
                    await result
        except Exception:
            logger.exception("post-response work failed for %s", node.id)

    async def _finish_after_response_work(self) -> None:
        if not self._after:
            return
        _done, pending = await asyncio.wait(set(self._after), timeout=AFTER_RESPONSE_GRACE)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


def _full_context(mode: str, previous: CachedResponse | None, forwarded: bool) -> bool:
    """Whether a turn's request carries the whole context in `input`."""
    if previous is None:
        return not forwarded
    return mode == "always" and not previous.remote


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


def _log_failure(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is not None and not isinstance(error, ClientGone):
        logger.error("work after a response failed", exc_info=error)


def _not_found(create: CreateEvent) -> dict[str, Any]:
    return error_event(
        400,
        "invalid_request_error",
        "previous_response_not_found",
        f"Previous response with id '{create.previous_response_id}' not found.",
        param="previous_response_id",
        stream_id=create.stream_id,
    )
