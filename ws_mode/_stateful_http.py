"""Plain HTTP made stateful by the store: `previous_response_id`, `GET` and `DELETE`.

With `store=` and `stateful_http=True`, the middleware serves the stateful parts of OpenAI's
HTTP Responses API in front of a stateless handler, with the same store the sockets use:

- `POST {path}` with `previous_response_id`: the stored conversation is put in front of the
  new input, so the handler gets the whole context, exactly as over the socket; the response
  objects echo `previous_response_id`, and every other byte of the answer passes as the
  handler wrote it. Events are read by the tap the socket uses (`ResponseTap`). Every
  finished response whose request allows storing (`store` is true by default) is stored,
  with or without a parent. A large body is parsed off the event loop, as a large frame is.
- `GET {path}/{id}` answers the stored response object; `DELETE {path}/{id}` forgets it.

Every request runs the `authenticate` hook, and responses are scoped as over the socket: by
the key of its principal, or in one scope every caller shares (`shared_store=True`).
Everything else reaches the app untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import orjson

from ._asgi import Message, Receive, Scope, Send
from ._auth import (
    AuthenticationFailed,
    authenticate,
    challenge,
    failure_code,
    failure_param,
)
from ._budget import ANSWER_FRAME_COPIES, Held, MemoryBudget
from ._cache import decoded_size
from ._client_events import may_store, store_problem, text_input, too_long_id
from ._conversation import conversation_scope
from ._frames import OFF_LOOP_BYTES, HelperDied, HelperUnavailable, in_helper
from ._handler_call import replay_body
from ._items import encode_items, with_input
from ._logs import for_log
from ._persistence import (
    StoreUnavailable,
    failure_at,
    load_chain,
    read_failed,
    read_one,
    start_write,
    store_answered,
    store_scope,
)
from ._protocol import (
    MAX_ID_CHARS,
    SERVER_IS_OVERLOADED,
    TERMINAL_EVENT_BY_STATUS,
    error_body,
    error_type_for_status,
    json_answer,
    memory_budget_message,
    quoted_id,
)
from ._settings import Settings
from ._sse import SSEBlock, SSEBlocks, content_type, is_event_stream
from ._store import ResponseStore, StoredResponse
from ._tap import ResponseTap
from ._turn import body_cost, turn

logger = logging.getLogger(__name__)

#: The size of the pieces a JSON answer held to echo `previous_response_id` is sent in: the
#: server writes each before it takes the next, so what a slow client has not read yet stays
#: with the held answer, counted in the memory budget.
ANSWER_PIECE = 256 * 1024


class StatefulHTTP:
    """The stateful HTTP endpoints of one middleware."""

    def __init__(self, settings: Settings, store: ResponseStore) -> None:
        self.settings = settings
        self.store = store

    def handles(self, scope: Scope) -> bool:
        """Whether `scope` is a request this serves: never a socket turn, which reaches the
        middleware again on its way down from the application's entry and was resolved
        against the connection's cache and the store already."""
        if turn(scope) is not None:
            return False
        path: str = scope["path"]
        base = scope.get("root_path", "") + self.settings.path
        method: str = scope["method"]
        if path == base:
            return method == "POST"
        rest = path[len(base) + 1 :] if path.startswith(base + "/") else ""
        return bool(rest) and "/" not in rest and method in ("GET", "DELETE")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Every request is authorized anew (a revoked credential loses access at once), by the
        # same hook and into the same store scope as a socket.
        settings = self.settings
        try:
            principal = None
            if settings.authenticate is not None:
                principal = await authenticate(settings.authenticate, scope)
            owner = store_scope(principal, settings.principal_key, shared=settings.shared_store)
        except AuthenticationFailed as exc:  # an unkeyed principal too: a 500
            code, param = failure_code(exc), failure_param(exc)  # param: a hook that raised
            await _answer(send, exc.status, code, exc.message, param=param, headers=challenge(exc))
            return
        if scope["method"] == "POST":
            # A principal here always has a key, or there is none (a shared store).
            keys_scope = conversation_scope(principal, settings.principal_key, owner)
            await self._post(scope, receive, send, owner, keys_scope)
            return
        response_id = scope["path"].rsplit("/", 1)[-1]
        if len(response_id) > MAX_ID_CHARS:  # no server issues one: refused unread, unlogged
            refusal = too_long_id("response_id", response_id)
            await _answer(send, 400, refusal.code, refusal.message, param=refusal.param)
            return
        seconds = self.settings.limits.store_read_seconds
        try:
            async with asyncio.timeout(seconds) as timer:
                if scope["method"] == "DELETE":
                    found = await self.store.delete(owner, response_id)
                    record = None
                else:
                    record = await read_one(self.store, owner, response_id)
                    found = record is not None
        except Exception as exc:
            read_failed(
                self.store,
                "the store failed to answer for %s: %s",
                for_log(response_id),
                failure_at(self.store, exc, timer, f"{seconds:g} s (Limits.store_read_seconds)"),
            )
            await _answer(send, 503, "store_unavailable", "The response store is unavailable.")
            return
        store_answered(self.store)
        if not found:
            await _answer(
                send, 404, "not_found", f"No response with id '{quoted_id(response_id)}' found."
            )
        elif record is not None:
            await _json(send, 200, record.response)
        else:
            deleted = {"id": response_id, "object": "response.deleted", "deleted": True}
            await _json(send, 200, orjson.dumps(deleted))

    async def _post(
        self, scope: Scope, receive: Receive, send: Send, owner: str, keys_scope: str
    ) -> None:
        raw = await _body(receive, self.settings.limits.max_message_bytes)
        if raw is None:
            limit = self.settings.limits.max_message_bytes
            message = f"The request is larger than {limit} bytes (Limits.max_message_bytes)."
            await _answer(send, 413, "request_too_large", message)
            return
        try:
            parsed = await _parse(raw)
        except HelperDied:
            message = "The request could not be parsed: the process parsing it ended, twice."
            await _answer(send, 500, "server_error", message)
            return
        if parsed is None:
            await self.settings.app(scope, replay_body(raw, receive), send)  # the app's to refuse
            return
        body, new_items = parsed  # every field but `input`; the input as items, encoded
        problem = store_problem(body.get("store"))
        if problem is not None:
            await _answer(send, 400, "invalid_type", problem, param="store")
            return
        parent_id = body.get("previous_response_id")
        if isinstance(parent_id, str) and len(parent_id) > MAX_ID_CHARS:
            refusal = too_long_id("previous_response_id", parent_id)
            await _answer(send, 400, refusal.code, refusal.message, param=refusal.param)
            return
        chain: list[StoredResponse] = []
        if isinstance(parent_id, str):
            try:
                found = await load_chain(
                    self.store,
                    self.settings.stats,
                    owner,
                    parent_id,
                    read_seconds=self.settings.limits.store_read_seconds,
                    wait=self.settings.limits.store_wait_seconds,
                )
            except StoreUnavailable:
                message = "The response store is unavailable."
                await _answer(send, 503, "store_unavailable", message, param="previous_response_id")
                return
            if found is None:
                message = f"Previous response with id '{quoted_id(parent_id)}' not found."
                await _answer(
                    send, 400, "previous_response_not_found", message, param="previous_response_id"
                )
                return
            chain, found = found, None
        # The records (and the client's body) are let go once the handler's body is built:
        # only their ids are needed after.
        parent, chain_id = (chain[-1].id, chain[0].chain_id) if chain else (None, None)
        keys = self.settings.conversations
        if chain_id is None:
            key = keys.first(keys_scope, body.get("prompt_cache_key"))
        else:  # the latest a record carries (one written before keys carries none)
            stored = [each.conversation_key for each in chain if each.conversation_key]
            key = stored[-1] if stored else keys.of_chain(keys_scope, chain_id)
        extra = keys.fields(keys_scope, key, body)
        if chain:
            request = _full_request({**body, **extra}, chain, new_items)
        elif extra:
            fields = orjson.dumps({**body, **extra})
            request = with_input(fields, [new_items]) if new_items else fields
        else:
            request = raw
        del chain, raw
        # A body rebuilt from the store, and what the handler holds of it, are reserved in the
        # memory budget until the handler returns; refused, the handler is not called.
        held = body_cost(request) if parent is not None else 0
        budget = self.settings.budget
        if not budget.reserve(held):
            message = memory_budget_message("this request", then="Retry shortly.")
            await _answer(send, 503, SERVER_IS_OVERLOADED, message)
            return
        writes: list[asyncio.Task[bool]] = []

        def finished(response: dict[str, Any], output: list[dict[str, Any]]) -> None:
            # Written as the terminal event goes out, so a continuation finds it at once.
            if not may_store(body.get("store"), response):
                return
            record = StoredResponse(
                id=response["id"],
                parent_id=parent,
                chain_id=chain_id if chain_id is not None else response["id"],
                input=new_items,
                output=encode_items(output),
                response=orjson.dumps(response),
                conversation_key=key,
            )
            seconds = self.settings.limits.store_write_seconds
            writes.append(
                start_write(self.store, self.settings.stats, owner, record, seconds=seconds)
            )

        limit = self.settings.limits.max_buffered_answer_bytes
        watcher = _Watcher(send, parent, finished, limit, budget)
        headers = keys.with_key(_without_length(scope.get("headers", ())), key)
        headers.append((b"content-length", str(len(request)).encode()))
        try:
            await self.settings.app(
                {**scope, "headers": headers}, replay_body(request, receive), watcher
            )
        finally:
            del request  # not held while the writes land
            budget.release(held)
        if writes:
            # The answer's end waits for the write, so a continuation finds it at once; the
            # write is the process's, and this request ending early never cancels it.
            await asyncio.wait(writes)


class _Watcher:
    """Passes the handler's answer on as it came, except the response objects, which echo
    `previous_response_id` (the tap decides which events carry one); keeps the finished
    response (`finished(response, output)`).

    An SSE answer passes through block by block (`SSEBlocks`): comments, `id:` and `retry:`
    lines, other events and line ends stay as the handler wrote them; only an event whose
    response object the echo changes gets its data re-encoded (on one `data:` line). A JSON
    answer is re-encoded only when the echo changes it.

    What is held back is bounded by `limit` (`Limits.max_buffered_answer_bytes`): a JSON
    answer is held whole, an SSE event until its blank line. Past it the answer passes on as
    the handler sends it, from what was held, and nothing of it is echoed or stored.

    A JSON answer is held in the memory `budget` from its first byte until it is sent: its
    bytes, then the answer decoded, echoed and stored (`decoded_size` and
    `ANSWER_FRAME_COPIES` times its bytes). It goes out in pieces of `ANSWER_PIECE` bytes, so
    what a client that does not read keeps waiting is the held answer, counted, not a copy in
    the server's write buffer. An answer the budget cannot hold is dropped, and the client
    gets `server_is_overloaded` (503) in its place.
    """

    def __init__(
        self,
        send: Send,
        parent_id: str | None,
        finished: Callable[[dict[str, Any], list[dict[str, Any]]], None],
        limit: int,
        budget: MemoryBudget | None = None,
    ) -> None:
        self._send = send
        self._held = Held(budget)
        self._refused = False
        self._tap = ResponseTap(parent_id)
        self._finished = finished
        self._limit = limit
        self._blocks: SSEBlocks | None = None
        self._json: list[bytes] | None = None
        self._json_bytes = 0
        self._start: Message | None = None

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            kind = content_type(message.get("headers", ()))
            if message["status"] < 300 and is_event_stream(kind):
                self._blocks = SSEBlocks()
                # An echo may change the stream's length.
                message = {**message, "headers": _without_length(message.get("headers", ()))}
            elif message["status"] < 300 and kind.startswith(b"application/json"):
                self._json, self._start = [], message
                return  # sent with the body, whose length may change
            await self._send(message)
        elif message["type"] == "http.response.body" and self._json is not None:
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            if not self._refused:
                if self._held.add(len(chunk)):
                    self._json.append(chunk)
                    self._json_bytes += len(chunk)
                else:
                    self._refused = True  # the rest of the answer is dropped as it comes
                    self._json = []
                    self._held.let_go()
            if self._refused:
                if not more:
                    self._json = None
                    why = memory_budget_message("the handler's answer", then="Retry shortly.")
                    await _answer(self._send, 503, SERVER_IS_OVERLOADED, why)
            elif not more:
                try:
                    body = b"".join(self._json)
                    self._json = None
                    await self._send_json(body)
                finally:
                    self._held.let_go()
            elif self._json_bytes > self._limit:
                held, start = b"".join(self._json), self._start
                assert start is not None
                self._json = self._start = None
                self._give_up()
                try:
                    await self._send(start)
                    await self._send_body(held, more=True)
                finally:
                    self._held.let_go()
        elif message["type"] == "http.response.body" and self._blocks is not None:
            more = message.get("more_body", False)
            blocks = self._blocks
            out = [self._block(block) for block in blocks.feed(message.get("body", b""))]
            if not more or blocks.pending > self._limit:
                out.append(blocks.rest())
                if more:
                    self._blocks = None
                    self._give_up()
            body = b"".join(out)
            if body or not more:
                await self._send({"type": "http.response.body", "body": body, "more_body": more})
        else:
            await self._send(message)

    async def _send_body(self, body: bytes, *, more: bool = False) -> None:
        """Send `body` in pieces of `ANSWER_PIECE` bytes: the server takes the next once it
        has written the last (its flow control), so a client that does not read leaves the rest
        here, counted."""
        sent = 0
        while len(body) - sent > ANSWER_PIECE:
            piece = body[sent : sent + ANSWER_PIECE]
            sent += ANSWER_PIECE
            await self._send({"type": "http.response.body", "body": piece, "more_body": True})
        rest = body[sent:] if sent else body
        await self._send({"type": "http.response.body", "body": rest, "more_body": more})

    def _give_up(self) -> None:
        """What is held passes the bound: the answer passes on as it comes, unechoed, and its
        response is not stored (a continuation of it gets `previous_response_not_found`)."""
        logger.warning(
            "stateful HTTP: the handler's answer holds more than "
            "Limits.max_buffered_answer_bytes (%d) in one piece; passed on as it is, "
            "its response not stored",
            self._limit,
        )

    def _block(self, block: SSEBlock) -> bytes:
        if block.event is None or self._tap.finished:
            return block.raw
        event = self._tap.decode(*block.event)
        if event is None:
            return block.raw  # not JSON: the client's to judge, as without ws_mode
        changed = self._see(event)
        return block.with_data(orjson.dumps(event)) if changed else block.raw

    def _see(self, event: dict[str, Any]) -> bool:
        tap = self._tap
        changed = tap.see(event)
        if tap.response is not None and tap.output is not None:
            self._finished(tap.response, tap.output)
        return changed

    async def _send_json(self, body: bytes) -> None:
        start = self._start
        assert start is not None
        # The answer decoded, echoed and stored, until it is sent.
        if not self._held.add(decoded_size(body) + ANSWER_FRAME_COPIES * len(body)):
            self._held.let_go()
            del body
            why = memory_budget_message("the handler's answer", then="Retry shortly.")
            await _answer(self._send, 503, SERVER_IS_OVERLOADED, why)
            return
        try:
            response = orjson.loads(body)
        except orjson.JSONDecodeError:
            response = None
        if isinstance(response, dict) and isinstance(response.get("id"), str):
            # The event an SSE stream would have ended with (or one that only echoes).
            status = response.get("status") or "completed"
            kind = TERMINAL_EVENT_BY_STATUS.get(status, "response.in_progress")
            if self._see({"type": kind, "response": response}):
                body = orjson.dumps(response)
                headers = _without_length(start.get("headers", ()))
                headers.append((b"content-length", str(len(body)).encode()))
                start = {**start, "headers": headers}
        await self._send(start)
        await self._send_body(body)


def _without_length(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(name, value) for name, value in headers if name.lower() != b"content-length"]


def _parse_request(raw: bytes) -> tuple[dict[str, Any], bytes] | None:
    """A request body's fields but `input`, and its input as items, encoded (a string is one
    user message); None when it is no JSON object. Module-level: large bodies run it in a
    helper process."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict):
        return None
    new_input = body.pop("input", None)
    items = text_input(new_input) if isinstance(new_input, str) else new_input
    try:
        return body, encode_items(items) if isinstance(items, list) else b""
    except orjson.JSONEncodeError:
        return None  # nested too deeply to splice: the app's to judge


async def _parse(raw: bytes) -> tuple[dict[str, Any], bytes] | None:
    """`_parse_request`, off the event loop for a large body, as a large frame is."""
    if len(raw) >= OFF_LOOP_BYTES:
        with contextlib.suppress(HelperUnavailable):
            return await in_helper(_parse_request, raw)
    return _parse_request(raw)


def _full_request(body: dict[str, Any], chain: list[StoredResponse], new_items: bytes) -> bytes:
    """The handler's request: the body without `previous_response_id`, its input the stored
    conversation's items, then the new ones (spliced encoded, copied once)."""
    fields = {k: v for k, v in body.items() if k != "previous_response_id"}
    parts = [part for record in chain for part in (record.input, record.output) if part]
    if new_items:
        parts.append(new_items)
    return with_input(orjson.dumps(fields), parts)


async def _body(receive: Receive, limit: int) -> bytes | None:
    """The request body; None past `limit` bytes (passed on to the app as it is not read)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        chunks.append(chunk)
        if size > limit:
            return None
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _answer(
    send: Send,
    status: int,
    code: str,
    message: str,
    *,
    param: str | None = None,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    kind = error_type_for_status(status)
    await _json(send, status, error_body(kind, code, message, param), headers)


async def _json(
    send: Send, status: int, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    for part in json_answer("http.response", status, body, headers):
        await send(part)
