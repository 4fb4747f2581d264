"""Plain HTTP made stateful by the store: `previous_response_id`, `GET` and `DELETE`.

With `store=` and `stateful_http=True`, the middleware serves the stateful parts of OpenAI's
HTTP Responses API in front of a stateless handler, with the same store the sockets use:

- `POST {path}` with `previous_response_id`: the stored conversation is put in front of the
  new input, so the handler gets the whole context, exactly as over the socket; the response
  echoes `previous_response_id`. Every finished response whose request allows storing
  (`store` is true by default) is stored, with or without a parent.
- `GET {path}/{id}` answers the stored response object; `DELETE {path}/{id}` forgets it.

Responses are scoped as over the socket: by the `authenticate` hook's principal, or by the
bearer token. Everything else reaches the app untouched.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import orjson

from .asgi import Message, Receive, Scope, Send
from .auth import AuthenticationFailed, authenticate, failure_code
from .client_events import text_input
from .handler_call import replay_body
from .items import encode_items
from .persistence import HYDRATE_SECONDS, StoreUnavailable, keep, load_chain, store_scope
from .protocol import RESPONSE_EVENTS, SUCCESS_EVENTS, error_body, json_answer
from .settings import Settings
from .sse import SSEDecoder, encode_sse
from .store import ResponseStore, StoredResponse
from .turn import turn

__all__ = ["StatefulHTTP"]

logger = logging.getLogger(__name__)


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
        try:
            principal = (
                await authenticate(self.settings.authenticate, scope)
                if self.settings.authenticate is not None
                else None
            )
        except AuthenticationFailed as exc:
            await _answer(send, exc.status, failure_code(exc), exc.message)
            return
        owner = store_scope(principal, scope)
        if scope["method"] == "POST":
            await self._post(scope, receive, send, owner)
            return
        response_id = scope["path"].rsplit("/", 1)[-1]
        try:
            async with asyncio.timeout(HYDRATE_SECONDS):
                if scope["method"] == "DELETE":
                    found = await self.store.delete(owner, response_id)
                    record = None
                else:
                    record = (await self.store.get_chain(owner, response_id)).get(response_id)
                    found = record is not None
        except Exception as exc:
            logger.warning("the store failed to answer for %s: %r", response_id, exc)
            await _answer(send, 503, "store_unavailable", "The response store is unavailable.")
            return
        if not found:
            await _answer(send, 404, "not_found", f"No response with id '{response_id}' found.")
        elif record is not None:
            await _json(send, 200, record.response)
        else:
            deleted = {"id": response_id, "object": "response.deleted", "deleted": True}
            await _json(send, 200, orjson.dumps(deleted))

    async def _post(self, scope: Scope, receive: Receive, send: Send, owner: str) -> None:
        raw = await _body(receive, self.settings.limits.max_message_bytes)
        if raw is None:
            limit = self.settings.limits.max_message_bytes
            message = f"The request is larger than {limit} bytes (Limits.max_message_bytes)."
            await _answer(send, 413, "request_too_large", message)
            return
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            await self.settings.app(scope, replay_body(raw, receive), send)  # the app's to refuse
            return
        parent_id = body.get("previous_response_id")
        chain: list[StoredResponse] = []
        if isinstance(parent_id, str):
            try:
                found = await load_chain(self.store, self.settings.stats, owner, parent_id)
            except StoreUnavailable:
                message = "The response store is unavailable."
                await _answer(send, 503, "store_unavailable", message, param="previous_response_id")
                return
            if found is None:
                message = f"Previous response with id '{parent_id}' not found."
                await _answer(
                    send, 400, "previous_response_not_found", message, param="previous_response_id"
                )
                return
            chain = found
        new_input = body.get("input")
        items = text_input(new_input) if isinstance(new_input, str) else new_input
        items = items if isinstance(items, list) else []
        request = _full_request(body, chain, items)
        writes: list[asyncio.Task[None]] = []

        def finished(response: dict[str, Any]) -> None:
            # Written as the terminal event goes out, so a continuation finds it at once.
            if body.get("store") is False:
                return
            outputs = [item for item in response.get("output") or [] if isinstance(item, dict)]
            record = StoredResponse(
                id=response["id"],
                parent_id=chain[-1].id if chain else None,
                chain_id=chain[0].chain_id if chain else response["id"],
                input=encode_items(items),
                output=encode_items(outputs),
                response=orjson.dumps(response),
            )
            writes.append(asyncio.create_task(keep(self.store, self.settings.stats, owner, record)))

        watcher = _Watcher(send, parent_id if chain else None, finished)
        headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(request)).encode()))
        await self.settings.app(
            {**scope, "headers": headers}, replay_body(request, receive), watcher
        )
        if writes:
            await asyncio.gather(*writes)


class _Watcher:
    """Passes the handler's answer on, with `previous_response_id` echoed in its response
    objects, and keeps the finished response."""

    def __init__(
        self, send: Send, parent_id: str | None, finished: Callable[[dict[str, Any]], None]
    ) -> None:
        self._send = send
        self._parent_id = parent_id
        self._finished = finished
        self._decoder: SSEDecoder | None = None
        self._json: list[bytes] | None = None
        self._start: Message | None = None

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            kind = b""
            for name, value in message.get("headers", ()):
                if name.lower() == b"content-type":
                    kind = value.lower()
            if message["status"] < 300 and kind.startswith(b"text/event-stream"):
                self._decoder = SSEDecoder()
            elif message["status"] < 300 and kind.startswith(b"application/json"):
                self._json, self._start = [], message
                return  # sent with the body, whose length changes
            await self._send(message)
        elif message["type"] == "http.response.body" and self._json is not None:
            self._json.append(message.get("body", b""))
            if not message.get("more_body", False):
                await self._send_json(b"".join(self._json))
        elif message["type"] == "http.response.body" and self._decoder is not None:
            out = [
                self._event(kind, data)
                for kind, data in self._decoder.feed(message.get("body", b""))
            ]
            more = message.get("more_body", False)
            await self._send(
                {"type": "http.response.body", "body": b"".join(out), "more_body": more}
            )
        else:
            await self._send(message)

    def _event(self, kind: str | None, data: bytes) -> bytes:
        if kind not in RESPONSE_EVENTS:
            prefix = b"event: " + kind.encode() + b"\n" if kind else b""
            return prefix + b"data: " + data + b"\n\n"
        event = orjson.loads(data)
        response = event.get("response") if isinstance(event, dict) else None
        if not isinstance(response, dict):
            return b"event: " + (kind or "").encode() + b"\ndata: " + data + b"\n\n"
        response["previous_response_id"] = self._parent_id
        if kind in SUCCESS_EVENTS and isinstance(response.get("id"), str):
            self._finished(response)
        return encode_sse(event)

    async def _send_json(self, body: bytes) -> None:
        assert self._start is not None
        try:
            response = orjson.loads(body)
        except orjson.JSONDecodeError:
            response = None
        if isinstance(response, dict) and isinstance(response.get("id"), str):
            response["previous_response_id"] = self._parent_id
            if response.get("status", "completed") in ("completed", "incomplete"):
                self._finished(response)
            body = orjson.dumps(response)
        await _json(self._send, self._start["status"], body)


def _full_request(
    body: dict[str, Any], chain: list[StoredResponse], items: list[dict[str, Any]]
) -> bytes:
    """The handler's request: the body without `previous_response_id`, its input the stored
    conversation's items, then the new ones."""
    if not chain:
        return orjson.dumps(body)
    fields = {k: v for k, v in body.items() if k not in ("previous_response_id", "input")}
    parts = [part for record in chain for part in (record.input, record.output) if part]
    if items:
        parts.append(encode_items(items))
    head = orjson.dumps(fields)[:-1]
    return head + (b"," if fields else b"") + b'"input":[' + b",".join(parts) + b"]}"


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
    send: Send, status: int, code: str, message: str, *, param: str | None = None
) -> None:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    await _json(send, status, error_body(kind, code, message, param))


async def _json(send: Send, status: int, body: bytes) -> None:
    for part in json_answer("http.response", status, body):
        await send(part)
