"""The proxy as an ASGI app: :class:`ResponsesProxy` forwards each HTTP request upstream and
streams the answer back, both ways at once, and stops the upstream when the client leaves.

Where a request goes (:meth:`ResponsesProxy.url_for`), the headers that cross, and how upstream
failures reach the client are described in ``docs/proxy.md``; the upstream side of it is
:mod:`ws_mode.proxy._upstream`, the HTTP clients :mod:`ws_mode.proxy._transport`.

At a socket's handshake, :meth:`ResponsesProxy.handshake_headers` (the middleware's
``handshake_headers`` hook) asks the upstream with a ``HEAD`` for the headers a WebSocket mode
client reads on the upgrade's answer.

The upstream request carries the current OpenTelemetry trace context (``traceparent``, when
opentelemetry-api is installed and a span is current: a middleware turn's, or the application's
own instrumentation's), so the upstream's spans join the trace.

A request costs one task at most: the forwarding runs in the server's own task, and a watcher
task (started once the request body has been read) cancels it when the client disconnects. A
turn of :class:`~ws_mode.WebSocketModeMiddleware` (its scope carries ``extensions["ws_mode"]``)
needs no watcher: the middleware cancels the call itself when the turn is abandoned.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import AsyncIterator
from typing import Any, Final
from urllib.parse import urlsplit

import httpx

from .._asgi import Message, Receive, Scope, Send
from .._errors import ConfigError
from .._headers import end_to_end, header
from .._logs import for_log
from .._sse import content_type, is_event_stream
from .._tracing import inject_current
from ._transport import Transport, UpstreamAnswer, transport_for
from ._upstream import (
    DEFAULT_TIMEOUT,
    HANDSHAKE_PROBE_SECONDS,
    REQUEST_DROPPED,
    TargetRefused,
    UpstreamError,
    answer_headers,
    check_upstream,
    handshake_headers,
    log_failure,
    public_url,
    upstream_url,
)

_logger = logging.getLogger("ws_mode.proxy")

_IDENTITY: Final = (b"accept-encoding", b"identity")
#: Codex's sticky-routing token: issued on a handshake's (or a turn's) answer, sent back on the
#: requests that follow.
_TURN_STATE: Final = b"x-codex-turn-state"
_EVENT_BOUNDARIES: Final = (b"\n\n", b"\r\r", b"\r\n\r\n")


class _Exchange:
    """One request's progress, shared with the disconnect watcher."""

    __slots__ = ("answered", "client_left", "task", "watcher")

    def __init__(self, task: asyncio.Task[Any] | None) -> None:
        self.task = task
        self.watcher: asyncio.Task[None] | None = None
        self.answered = False
        self.client_left = False

    def watch(self, receive: Receive) -> None:
        """Listen for the client's departure (its request body has been read)."""
        if self.task is not None and self.watcher is None:
            self.watcher = asyncio.create_task(self._until_disconnect(receive))

    async def _until_disconnect(self, receive: Receive) -> None:
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        except Exception:
            return  # the server's receive() failed: nothing to listen to any more
        if not self.answered and self.task is not None:
            self.client_left = True
            self.task.cancel()  # closes the upstream stream at once

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()


class _ClientGone(Exception):
    """The client went away while its request body was being read."""


class _UpstreamBroke(Exception):
    """The upstream failed after the answer had started; the response is cut short."""


class ResponsesProxy:
    """An ASGI app forwarding every HTTP request to an upstream Responses server.

    Made by :func:`create_proxy`. ``url_for(path, query)`` tells where a client path goes.
    The upstream client (an ``aiohttp.ClientSession``; an ``httpx.AsyncClient`` when aiohttp is
    not installed) is created on lifespan startup (or on the first request when the server runs
    no lifespan) and closed on lifespan shutdown or by ``await proxy.aclose()``; a client passed
    in is used as is and never closed by the proxy.
    """

    def __init__(
        self,
        upstream: str,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        client: Any = None,
    ) -> None:
        self.upstream = check_upstream(upstream)
        parts = urlsplit(self.upstream)
        self._origin = f"{parts.scheme}://{parts.netloc}"
        self._base_path = parts.path
        if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
            raise ConfigError("api_key must be None or a non-empty string.")
        self._authorization = f"Bearer {api_key.strip()}".encode() if api_key else None
        if not isinstance(timeout, httpx.Timeout):
            if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
                raise ConfigError(
                    f"timeout must be a positive number or an httpx.Timeout, got {timeout!r}."
                )
            timeout = httpx.Timeout(float(timeout))
        self.timeout = timeout
        if client is not None and not _is_client(client):
            raise ConfigError(
                "client must be an aiohttp.ClientSession or an httpx.AsyncClient, "
                f"got {type(client).__name__}."
            )
        self._transport: Transport | None = (
            None if client is None else transport_for(client, timeout)
        )
        self._owns_client = client is None

    def __repr__(self) -> str:
        key = ", api_key=***" if self._authorization else ""
        return f"<ResponsesProxy upstream={self.describe()!r}{key}>"

    def describe(self) -> str:
        """The upstream URL without the credentials it may hold, to show or log."""
        return public_url(self.upstream)

    # Where requests go.

    def url_for(self, path: str, query: bytes | str = b"") -> str:
        """The upstream URL of a client request to ``path`` (decoded, as the ASGI scope's
        ``path``; ``root_path`` already removed) with the query string ``query``.

        An upstream URL with a path (``http://host:8000/v1``, ``https://host/api/v1``) stands
        for the client's ``/v1``, like the openai SDK's ``base_url``: ``/v1/responses`` goes to
        ``<upstream>/responses``; a path outside ``/v1`` goes to the upstream's origin unchanged.
        An upstream URL without a path (``http://host:8000``) gets every path unchanged. The
        path is percent-encoded (``@``, ``?``, ``#`` and ``%`` included), and the URL is always
        on the upstream's scheme, host and port: a path that does not start with a single
        ``/``, or holds a ``.`` or ``..`` segment, a backslash or a control character, raises
        :class:`~ws_mode.proxy.TargetRefused` (the client gets 400).
        """
        return upstream_url(self._origin, self._base_path, path, query)

    # The upstream client.

    @property
    def transport(self) -> Transport:
        """The transport requests go through (its client created now if there is none yet)."""
        transport = self._transport
        if transport is None or (self._owns_client and transport.closed):
            transport = self._transport = transport_for(None, self.timeout)
            self._owns_client = True
        return transport

    @property
    def client(self) -> Any:
        """The upstream client: an ``aiohttp.ClientSession``, or an ``httpx.AsyncClient``
        (created now if there is none yet; call it on the server's event loop)."""
        return self.transport.client

    async def aclose(self) -> None:
        """Close the client if the proxy made it; a later request makes a new one."""
        if self._owns_client and self._transport is not None:
            transport, self._transport = self._transport, None
            await transport.aclose()

    # The handshake.

    async def handshake_headers(
        self, scope: Scope, principal: Any = None
    ) -> list[tuple[bytes, bytes]]:
        """The upstream's headers for a socket's handshake answer: a
        ``WebSocketModeMiddleware(proxy, handshake_headers=proxy.handshake_headers)`` hook.

        The upstream is asked once, with a ``HEAD`` request to the socket's path carrying the
        client's handshake headers (as a turn would: its ``Authorization`` or the proxy's
        ``api_key``, its ``x-codex-turn-state``, ``session_id``...); what it answers with
        (``openai-*``, ``x-codex-*``, ``x-models-etag``, ``x-reasoning-included``) goes on the
        handshake's answer, whatever its status. A sticky-routing token the upstream issues
        there (``x-codex-turn-state``, when the client sent none) is added to the socket's
        scope too, so every turn of the socket carries it upstream, as Codex's own requests
        would. An upstream that does not answer within ``HANDSHAKE_PROBE_SECONDS`` (5 s) or
        cannot be reached gives none: the socket opens, and its first turn reports the
        failure. ``principal`` is unused.
        """
        try:
            url, headers = self._target(scope)
        except TargetRefused as exc:
            _logger.warning(
                "no handshake probe for the WebSocket path %s: %s",
                for_log(scope.get("path")),
                exc.reason,
            )
            return []
        try:
            async with asyncio.timeout(HANDSHAKE_PROBE_SECONDS):
                answer = await self.transport.request("HEAD", url, headers, b"", self._origin)
                try:
                    kept = handshake_headers(answer.headers)
                finally:
                    await answer.close()
        except (UpstreamError, TimeoutError, TargetRefused) as exc:
            _logger.warning(
                "the upstream did not answer a WebSocket handshake's probe (HEAD %s): %s; "
                "the socket opens without its headers",
                public_url(url),
                type(exc).__name__,
            )
            return []
        issued = [(name, value) for name, value in kept if name == _TURN_STATE]
        if issued and header(scope, _TURN_STATE) is None:
            scope["headers"] = [*scope.get("headers", ()), issued[0]]
        return kept

    # ASGI.

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "websocket":
            # Only the middleware speaks WebSocket; this refuses the upgrade (HTTP 403).
            await send({"type": "websocket.close", "code": 1000})
        else:
            raise RuntimeError(f"ResponsesProxy cannot serve {kind!r} scopes.")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    self.transport  # noqa: B018  (create the client now, on the server's loop)
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        first = await receive()
        if first["type"] == "http.disconnect":
            return
        in_process = "ws_mode" in (scope.get("extensions") or ())
        state = _Exchange(None if in_process else asyncio.current_task())
        try:
            await self._forward(scope, first, receive, send, state)
        except asyncio.CancelledError:
            if state.client_left and state.task is not None and state.task.uncancel() == 0:
                return  # our own watcher's doing: the client left
            raise
        except _ClientGone:
            return
        finally:
            state.stop()

    async def _forward(
        self, scope: Scope, first: Message, receive: Receive, send: Send, state: _Exchange
    ) -> None:
        method: str = scope["method"]
        try:
            url, headers = self._target(scope)
        except TargetRefused as exc:
            await _refuse(exc, scope, send, state)
            return
        chunk: bytes = first.get("body", b"")
        content: bytes | AsyncIterator[bytes]
        if first.get("more_body", False):
            length = header(scope, b"content-length")
            if length is not None:
                headers.append((b"content-length", length))
            content = _body(chunk, receive, state)
        else:
            content = chunk  # the whole body at once (the middleware's turns): a Content-Length
            state.watch(receive)
        try:
            answer = await self.transport.request(method, url, headers, content, self._origin)
        except TargetRefused as exc:
            await _refuse(exc, scope, send, state)
            return
        except UpstreamError as exc:
            if state.client_left:
                raise _ClientGone from exc  # the body's stream stopped: the client left
            log_failure(exc, method, url)
            state.answered = True
            await exc.failure.send(send)
            return
        try:
            await _answer(answer, send, state, method, url)
        finally:
            await answer.close()

    def _target(self, scope: Scope) -> tuple[str, list[tuple[bytes, bytes]]]:
        """The upstream URL of a request and the headers that go with it."""
        path: str = scope["path"]
        root_path: str = scope.get("root_path", "")
        if root_path and path.startswith(root_path):
            path = path[len(root_path) :] or "/"
        url = self.url_for(path, scope.get("query_string", b""))
        headers = end_to_end(scope.get("headers", ()), REQUEST_DROPPED)
        if self._authorization is not None:
            headers = [(k, v) for k, v in headers if k != b"authorization"]
            headers.append((b"authorization", self._authorization))
        headers.append(_IDENTITY)
        # The current trace context, when a span is current (a turn's, or the application's
        # own instrumentation's): the upstream's spans join the trace.
        return url, inject_current(headers)


async def _answer(
    answer: UpstreamAnswer, send: Send, state: _Exchange, method: str, url: str
) -> None:
    """Stream the upstream's answer to the client, chunk by chunk as it arrives."""
    headers, decoder = answer_headers(answer.headers)
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    event_stream = is_event_stream(content_type(headers))
    tail = b"\n\n"  # the last bytes sent: is the stream between two events?
    try:
        async for chunk in answer.chunks():
            if decoder is not None:
                chunk = decoder.decode(chunk)
            if chunk:
                tail = chunk[-4:] if len(chunk) >= 4 else (tail + chunk)[-4:]
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if decoder is not None and (rest := decoder.flush()):
            await send({"type": "http.response.body", "body": rest, "more_body": True})
    except zlib.error as exc:
        raise _UpstreamBroke(f"the upstream's compressed answer is corrupt: {exc!r}") from exc
    except UpstreamError as exc:
        log_failure(exc, method, url)
        if not (event_stream and tail.endswith(_EVENT_BOUNDARIES)):
            raise _UpstreamBroke(f"the upstream's answer broke off: {exc.cause!r}") from exc
        # Between two events: end the stream with an error event clients understand.
        state.answered = True
        await send({"type": "http.response.body", "body": exc.failure.sse_event()})
        return
    state.answered = True
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _refuse(exc: TargetRefused, scope: Scope, send: Send, state: _Exchange) -> None:
    """Answer a request the proxy does not forward with 400; nothing went upstream."""
    _logger.warning(
        "refused to forward %s %s: %s",
        for_log(scope.get("method")),
        for_log(scope.get("path")),
        exc.reason,
    )
    state.answered = True
    await exc.send(send)


def create_proxy(
    upstream: str,
    *,
    api_key: str | None = None,
    timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
    client: Any = None,
) -> ResponsesProxy:
    """An ASGI app forwarding every HTTP request to the Responses server at ``upstream``.

    ``upstream`` is an http(s) URL. With a path (``http://localhost:8000/v1``) it replaces the
    client's ``/v1`` prefix; without one (``http://localhost:8000``) paths go unchanged (see
    :meth:`ResponsesProxy.url_for`). Requests and answers stream both ways; status and headers
    pass through (hop-by-hop ones aside), and the upstream is asked not to compress.

    ``api_key``: when set, every request carries ``Authorization: Bearer <api_key>`` instead of
    the client's own; when None, the client's ``Authorization`` passes through.
    ``timeout``: seconds (or an ``httpx.Timeout``) for connecting and for each read; an upstream
    that cannot be reached answers 502, one that times out 504, with an OpenAI error body.
    ``client``: an ``aiohttp.ClientSession`` or ``httpx.AsyncClient`` of your own (outgoing
    proxies, TLS, limits, its own timeouts); the proxy never closes it.
    """
    return ResponsesProxy(upstream, api_key=api_key, timeout=timeout, client=client)


def _is_client(client: object) -> bool:
    if isinstance(client, httpx.AsyncClient):
        return True
    try:
        import aiohttp
    except ImportError:
        return False
    return isinstance(client, aiohttp.ClientSession)


# The request body.


async def _body(first: bytes, receive: Receive, state: _Exchange) -> AsyncIterator[bytes]:
    """The request body, streamed up as the client sends it."""
    if first:
        yield first
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            state.client_left = True
            raise _ClientGone
        chunk: bytes = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            state.watch(receive)
            return
