"""The proxy as an ASGI app: :class:`ResponsesProxy` forwards each HTTP request upstream and
streams the answer back, both ways at once, and stops the upstream when the client leaves.

Where a request goes (:meth:`ResponsesProxy.url_for`), the headers that cross, and how upstream
failures reach the client are described in ``docs/proxy.md``; the upstream side of it is
:mod:`ws_mode.proxy.upstream`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Final
from urllib.parse import quote, urlsplit

import httpx
from starlette.types import Message, Receive, Scope, Send

from ws_mode.errors import ConfigError
from ws_mode.headers import end_to_end, header
from ws_mode.proxy.upstream import (
    DEFAULT_LIMITS,
    DEFAULT_TIMEOUT,
    REQUEST_DROPPED,
    UpstreamFailure,
    answer_headers,
    check_upstream,
    log_failure,
)

__all__ = ["API_PREFIX", "ResponsesProxy", "create_proxy"]

API_PREFIX: Final = "/v1"
"""The client path prefix an upstream URL with a path stands for."""


class _Exchange:
    """One request's progress, shared by the forwarding task and the disconnect watcher."""

    __slots__ = ("answered", "body_read")

    def __init__(self) -> None:
        self.body_read = asyncio.Event()
        self.answered = False


class _ClientGone(Exception):
    """The client went away while its request body was being read."""


class _UpstreamBroke(Exception):
    """The upstream failed after the answer had started; the response is cut short."""


class ResponsesProxy:
    """An ASGI app forwarding every HTTP request to an upstream Responses server.

    Made by :func:`create_proxy`. ``url_for(path, query)`` tells where a client path goes.
    The httpx client is created on lifespan startup (or on the first request when the server
    runs no lifespan) and closed on lifespan shutdown or by ``await proxy.aclose()``; a client
    passed in is used as is and never closed by the proxy.
    """

    def __init__(
        self,
        upstream: str,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        client: httpx.AsyncClient | None = None,
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
        if client is not None and not isinstance(client, httpx.AsyncClient):
            raise ConfigError(f"client must be an httpx.AsyncClient, got {type(client).__name__}.")
        self._client = client
        self._owns_client = client is None

    def __repr__(self) -> str:
        key = ", api_key=***" if self._authorization else ""
        return f"<ResponsesProxy upstream={self.describe()!r}{key}>"

    def describe(self) -> str:
        """The upstream URL without the credentials it may hold, to show or log."""
        parts = urlsplit(self.upstream)
        if "@" not in parts.netloc:
            return self.upstream
        return parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl()

    # Where requests go.

    def url_for(self, path: str, query: bytes | str = b"") -> str:
        """The upstream URL of a client request to ``path`` (``root_path`` already removed).

        An upstream URL with a path (``http://host:8000/v1``, ``https://host/api/v1``) stands
        for the client's ``/v1``, like the openai SDK's ``base_url``: ``/v1/responses`` goes to
        ``<upstream>/responses``; a path outside ``/v1`` goes to the upstream's origin unchanged.
        An upstream URL without a path (``http://host:8000``) gets every path unchanged.
        """
        if self._base_path and (path == API_PREFIX or path.startswith(API_PREFIX + "/")):
            target = self._origin + self._base_path + path[len(API_PREFIX) :]
        else:
            target = self._origin + path
        if isinstance(query, bytes):
            query = query.decode("latin-1")
        return f"{target}?{query}" if query else target

    # The httpx client.

    @property
    def client(self) -> httpx.AsyncClient:
        """The httpx client requests go through (created now if there is none yet)."""
        if self._client is None or (self._owns_client and self._client.is_closed):
            self._client = httpx.AsyncClient(
                timeout=self.timeout, limits=DEFAULT_LIMITS, follow_redirects=False
            )
            self._owns_client = True
        return self._client

    async def aclose(self) -> None:
        """Close the httpx client if the proxy made it; a later request makes a new one."""
        if self._owns_client and self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

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
                    self.client  # noqa: B018  (create it now, on the server's loop)
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = _Exchange()
        forward = asyncio.create_task(self._forward(scope, receive, send, state))
        watch = asyncio.create_task(_until_disconnect(receive, state))
        try:
            await asyncio.wait((forward, watch), return_when=asyncio.FIRST_COMPLETED)
            if not forward.done() and state.answered:
                # The answer went out whole; what is left is closing the upstream response.
                await asyncio.wait((forward,))
        finally:
            for task in (forward, watch):
                task.cancel()  # a client that left closes the upstream stream at once
            await asyncio.gather(forward, watch, return_exceptions=True)
        if forward.done() and not forward.cancelled():
            error = forward.exception()
            if error is not None and not isinstance(error, _ClientGone):
                raise error

    async def _forward(self, scope: Scope, receive: Receive, send: Send, state: _Exchange) -> None:
        request = await self._request(scope, receive, state)
        try:
            response = await self.client.send(request, stream=True)
        except httpx.RequestError as exc:
            log_failure(exc, request)
            await UpstreamFailure.of(exc).send(send)
            state.answered = True
            return
        try:
            await self._answer(response, send, state)
        finally:
            await response.aclose()

    async def _request(self, scope: Scope, receive: Receive, state: _Exchange) -> httpx.Request:
        path: str = scope["path"]
        root_path: str = scope.get("root_path", "")
        if root_path and path.startswith(root_path):
            path = path[len(root_path) :] or "/"
        url = self.url_for(quote(path, safe="/:@!$&'()*+,;=~"), scope.get("query_string", b""))
        headers = end_to_end(scope.get("headers", ()), REQUEST_DROPPED)
        if self._authorization is not None:
            headers = [(k, v) for k, v in headers if k.lower() != b"authorization"]
            headers.append((b"authorization", self._authorization))
        headers.append((b"accept-encoding", b"identity"))
        first = await receive()
        if first["type"] == "http.disconnect":
            raise _ClientGone
        chunk: bytes = first.get("body", b"")
        content: bytes | AsyncIterator[bytes]
        if not first.get("more_body", False):
            state.body_read.set()
            content = chunk  # the whole body at once (the middleware's turns): a Content-Length
        else:
            length = header(scope, b"content-length")
            if length is not None:
                headers.append((b"content-length", length))
            content = _body(chunk, receive, state)
        return self.client.build_request(scope["method"], url, headers=headers, content=content)

    async def _answer(self, response: httpx.Response, send: Send, state: _Exchange) -> None:
        headers, decode = answer_headers(response)
        chunks = response.aiter_bytes() if decode else response.aiter_raw()
        await send(
            {"type": "http.response.start", "status": response.status_code, "headers": headers}
        )
        event_stream = response.headers.get("content-type", "").startswith("text/event-stream")
        tail = b"\n\n"
        try:
            async for chunk in chunks:
                if chunk:
                    tail = (tail + chunk)[-4:]
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.RequestError as exc:
            log_failure(exc, response.request)
            at_boundary = tail.endswith((b"\n\n", b"\r\r", b"\r\n\r\n"))
            if not (event_stream and at_boundary):
                raise _UpstreamBroke(f"the upstream's answer broke off: {exc!r}") from exc
            # Between two events: end the stream with an error event clients understand.
            state.answered = True
            body = UpstreamFailure.of(exc).sse_event()
            await send({"type": "http.response.body", "body": body})
            return
        state.answered = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def create_proxy(
    upstream: str,
    *,
    api_key: str | None = None,
    timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
    client: httpx.AsyncClient | None = None,
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
    ``client``: an httpx.AsyncClient of your own (proxies, TLS, limits); the proxy never closes it.
    """
    return ResponsesProxy(upstream, api_key=api_key, timeout=timeout, client=client)


# The request body and the client's departure.


async def _body(first: bytes, receive: Receive, state: _Exchange) -> AsyncIterator[bytes]:
    """The request body, streamed up as the client sends it."""
    if first:
        yield first
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk: bytes = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            state.body_read.set()
            return


async def _until_disconnect(receive: Receive, state: _Exchange) -> None:
    """Return when the client goes away (listening only once its body has been read)."""
    await state.body_read.wait()
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return
