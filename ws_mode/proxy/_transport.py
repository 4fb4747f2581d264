"""The proxy's HTTP clients: one request upstream, its answer streamed back as raw bytes.

:class:`AiohttpTransport` is the default (``aiohttp``: its C HTTP parser and asyncio streams make
a request about a quarter of httpx's CPU; ``benchmarks/http_clients.py`` measures
it). :class:`HttpxTransport` serves an ``httpx.AsyncClient`` passed as ``client=``, and is the
default when aiohttp is not installed. Both map their library's errors to :class:`UpstreamError`
(502/504 as ``docs/proxy.md`` describes), never follow redirects, never keep cookies, and hand
back the body undecoded (the proxy undoes compression itself: :class:`~ws_mode.proxy._upstream.
BodyDecoder`). Before a byte is sent, each reads the request's URL as its own library will
(yarl, httpx) and refuses it (:class:`~ws_mode.proxy._upstream.TargetRefused`) unless its
scheme, credentials, host and port are the upstream's, read the same way.
"""

from __future__ import annotations

import functools
import http.cookiejar
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol, cast

import httpx

from ._upstream import DEFAULT_LIMITS, TargetRefused, UpstreamError, UpstreamFailure

if TYPE_CHECKING:
    import aiohttp
    import yarl


# Headers aiohttp would add to what the client sent (httpx adds neither).
_NOT_ADDED: Final = ("User-Agent", "Content-Type")

# The longest answer header line accepted (aiohttp's default, 8 KiB, is below httpx's).
_MAX_HEADER: Final = 64 * 1024

Content = bytes | AsyncIterator[bytes]
"""A request body: whole (sent with its length), or streamed as it arrives."""


def aiohttp_installed() -> bool:
    """Whether the default client, aiohttp, can be used."""
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return False
    return True


class UpstreamAnswer(Protocol):
    """The upstream's answer, its body still to read."""

    status: int
    headers: Sequence[tuple[bytes, bytes]]

    def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive, undecoded; :class:`UpstreamError` if it breaks."""
        ...

    async def close(self) -> None:
        """Release the connection: back to the pool when the body was read whole, else closed
        (an upstream still generating sees the client leave)."""


class Transport(Protocol):
    """One upstream client, shared by every request of a proxy."""

    client: Any

    @property
    def closed(self) -> bool:
        """Whether the client was closed."""
        ...

    async def request(
        self,
        method: str,
        url: str,
        headers: list[tuple[bytes, bytes]],
        content: Content,
        origin: str,
    ) -> UpstreamAnswer:
        """Send a request; the answer once its status and headers are in.
        :class:`~ws_mode.proxy._upstream.TargetRefused`, before anything is sent, unless ``url``
        is on ``origin`` (the upstream's ``scheme://[credentials@]host[:port]``) as the client
        library reads both."""
        ...

    async def aclose(self) -> None:
        """Close the client."""


def transport_for(client: object, timeout: httpx.Timeout) -> Transport:
    """The transport of ``client`` (an aiohttp.ClientSession or an httpx.AsyncClient, used as
    is), or of a new client of the proxy's own (aiohttp when installed, else httpx)."""
    if isinstance(client, httpx.AsyncClient):
        return HttpxTransport(client)
    if client is not None:
        return AiohttpTransport(cast("aiohttp.ClientSession", client))
    if aiohttp_installed():
        return AiohttpTransport(AiohttpTransport.new_session(timeout))
    return HttpxTransport(HttpxTransport.new_client(timeout))


# ----------------------------------------------------------------------------- aiohttp


class AiohttpTransport:
    """Requests through an ``aiohttp.ClientSession``."""

    def __init__(self, client: aiohttp.ClientSession) -> None:
        self.client = client

    @staticmethod
    def new_session(timeout: httpx.Timeout) -> aiohttp.ClientSession:
        """The proxy's own session (on the running loop): no cookies, no decompression, no
        environment settings, ``DEFAULT_LIMITS`` connections, ``timeout`` per read and to
        connect."""
        import aiohttp

        connector = aiohttp.TCPConnector(
            limit=DEFAULT_LIMITS.max_connections or 0,
            limit_per_host=0,
            keepalive_timeout=DEFAULT_LIMITS.keepalive_expiry or 5.0,
        )
        return aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=timeout.connect, sock_read=timeout.read
            ),
            cookie_jar=aiohttp.DummyCookieJar(),
            max_line_size=_MAX_HEADER,
            max_field_size=_MAX_HEADER,
            auto_decompress=False,
            skip_auto_headers=_NOT_ADDED,
        )

    @property
    def closed(self) -> bool:
        """Whether the session was closed."""
        return bool(self.client.closed)

    async def request(
        self,
        method: str,
        url: str,
        headers: list[tuple[bytes, bytes]],
        content: Content,
        origin: str,
    ) -> UpstreamAnswer:
        """Send a request; the answer once its status and headers are in (``url`` must be on
        ``origin``, as yarl reads them, or :class:`TargetRefused`)."""
        import aiohttp

        target = _yarl_target(url, origin)
        fields = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers]
        try:
            response = await self.client.request(
                method,
                target,
                headers=fields,
                data=content or None,  # no body: no invented content-type
                allow_redirects=False,
                auto_decompress=False,
                skip_auto_headers=_NOT_ADDED,
                raise_for_status=False,  # the upstream's 4xx/5xx pass through
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamError(_aiohttp_failure(exc), exc) from exc
        return _AiohttpAnswer(response)

    async def aclose(self) -> None:
        """Close the session."""
        await self.client.close()


class _AiohttpAnswer:
    __slots__ = ("headers", "response", "status")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.status = response.status
        self.headers: Sequence[tuple[bytes, bytes]] = response.raw_headers

    async def chunks(self) -> AsyncIterator[bytes]:
        import aiohttp

        content = self.response.content
        try:
            while chunk := await content.readany():
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamError(_aiohttp_failure(exc), exc) from exc

    async def close(self) -> None:
        if self.response.content.is_eof():
            self.response.release()
        else:
            self.response.close()


def _yarl_target(url: str, origin: str) -> yarl.URL:
    """``url`` as aiohttp sends it, refused unless it is on ``origin``."""
    from yarl import URL

    try:
        target = URL(url)
        found = _yarl_origin(target)
    except ValueError:
        raise TargetRefused("the upstream URL is not a valid URL") from None
    if found != _yarl_upstream(origin):
        raise TargetRefused("the upstream URL would leave the upstream's origin")
    return target


def _yarl_origin(url: yarl.URL) -> tuple[object, ...]:
    return (url.scheme, url.raw_user, url.raw_password, url.raw_host, url.port, url.is_absolute())


@functools.lru_cache(maxsize=16)
def _yarl_upstream(origin: str) -> tuple[object, ...]:
    from yarl import URL

    return _yarl_origin(URL(origin))


def _aiohttp_failure(exc: BaseException) -> UpstreamFailure:
    import aiohttp

    name = type(exc).__name__
    if isinstance(exc, TimeoutError):  # aiohttp's connect and read timeouts are TimeoutErrors
        return UpstreamFailure.timeout(name)
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.InvalidURL):
        return UpstreamFailure.unreachable(name)
    return UpstreamFailure.broken(name)


# ----------------------------------------------------------------------------- httpx


class HttpxTransport:
    """Requests through an ``httpx.AsyncClient``."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    @staticmethod
    def new_client(timeout: httpx.Timeout) -> httpx.AsyncClient:
        """The proxy's own client when aiohttp is not installed: no cookies kept."""
        no_cookies = http.cookiejar.CookieJar(
            http.cookiejar.DefaultCookiePolicy(allowed_domains=[])
        )
        return httpx.AsyncClient(
            timeout=timeout, limits=DEFAULT_LIMITS, follow_redirects=False, cookies=no_cookies
        )

    @property
    def closed(self) -> bool:
        """Whether the client was closed."""
        return self.client.is_closed

    async def request(
        self,
        method: str,
        url: str,
        headers: list[tuple[bytes, bytes]],
        content: Content,
        origin: str,
    ) -> UpstreamAnswer:
        """Send a request; the answer once its status and headers are in (``url`` must be on
        ``origin``, as httpx reads them, or :class:`TargetRefused`)."""
        try:
            request = self.client.build_request(method, url, headers=headers, content=content)
        except httpx.InvalidURL:
            raise TargetRefused("the upstream URL is not a valid URL") from None
        if _httpx_origin(request.url) != _httpx_upstream(origin):
            raise TargetRefused("the upstream URL would leave the upstream's origin")
        try:
            response = await self.client.send(request, stream=True)
        except httpx.RequestError as exc:
            raise UpstreamError(_httpx_failure(exc), exc) from exc
        return _HttpxAnswer(response)

    async def aclose(self) -> None:
        """Close the client."""
        await self.client.aclose()


class _HttpxAnswer:
    __slots__ = ("headers", "response", "status")

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.status = response.status_code
        self.headers: Sequence[tuple[bytes, bytes]] = response.headers.raw

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.response.aiter_raw():
                yield chunk
        except httpx.RequestError as exc:
            raise UpstreamError(_httpx_failure(exc), exc) from exc

    async def close(self) -> None:
        await self.response.aclose()


def _httpx_origin(url: httpx.URL) -> tuple[object, ...]:
    return (url.scheme, url.userinfo, url.host, url.port, url.is_absolute_url)


@functools.lru_cache(maxsize=16)
def _httpx_upstream(origin: str) -> tuple[object, ...]:
    return _httpx_origin(httpx.URL(origin))


def _httpx_failure(exc: httpx.RequestError) -> UpstreamFailure:
    name = type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamFailure.timeout(name)
    if isinstance(exc, httpx.ConnectError | httpx.UnsupportedProtocol):
        return UpstreamFailure.unreachable(name)
    return UpstreamFailure.broken(name)
