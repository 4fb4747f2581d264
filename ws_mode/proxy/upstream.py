"""The proxy's dealings with the upstream: its URL, its httpx settings, the headers that may cross,
and its failures as OpenAI errors (an HTTP error answer, or an SSE ``error`` event mid-stream)."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

import httpx
from starlette.types import Send

from ws_mode.errors import ConfigError
from ws_mode.headers import end_to_end
from ws_mode.protocol import error_body, json_answer
from ws_mode.sse import encode_sse

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_TIMEOUT",
    "REQUEST_DROPPED",
    "UpstreamFailure",
    "answer_headers",
    "check_upstream",
    "log_failure",
]

logger = logging.getLogger("ws_mode.proxy")

DEFAULT_TIMEOUT: Final = httpx.Timeout(600.0, connect=10.0)
"""600 s to wait for each read (a long generation, a gap between events), 10 s to connect."""

DEFAULT_LIMITS: Final = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
"""Connections to the upstream: a proxy holds one per response being streamed."""

REQUEST_DROPPED: Final = (b"host", b"content-length", b"accept-encoding", b"expect")
"""Request headers the proxy sets itself besides the hop-by-hop ones (`ws_mode.headers`): httpx
sets `host` and the body's length, the upstream is asked for an uncompressed answer, and `expect`
was the front server's business."""
# Response headers the front server sets itself (it would send them twice otherwise).
_RESPONSE_DROPPED: Final = (b"date", b"server")
# Encodings httpx decodes without optional packages: an upstream that compresses in spite of
# `accept-encoding: identity` has these undone, so an event stream stays readable.
_DECODED: Final = frozenset({"gzip", "x-gzip", "deflate"})


def check_upstream(upstream: object) -> str:
    """``upstream`` as a normalized http(s) base URL (no trailing slash), or a ConfigError."""
    if not isinstance(upstream, str):
        raise ConfigError(f"upstream must be a URL string, got {type(upstream).__name__}.")
    parts = urlsplit(upstream.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"upstream must be an http:// or https:// URL with a host, got {upstream!r}."
        )
    if parts.query or parts.fragment:
        raise ConfigError(f"upstream must not have a query or a fragment, got {upstream!r}.")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


# Headers.


def answer_headers(response: httpx.Response) -> tuple[list[tuple[bytes, bytes]], bool]:
    """The upstream answer's headers to send to the client, and whether its body is to be
    decompressed (an upstream that compressed anyway, with an encoding httpx undoes)."""
    headers = end_to_end(response.headers.raw, _RESPONSE_DROPPED)
    encodings = [
        value.strip().lower()
        for value in response.headers.get("content-encoding", "").split(",")
        if value.strip() and value.strip().lower() != "identity"
    ]
    decode = bool(encodings) and all(value in _DECODED for value in encodings)
    if decode:
        # Undone here, so the sizes and encoding change.
        dropped = (b"content-encoding", b"content-length")
        headers = [(k, v) for k, v in headers if k.lower() not in dropped]
    return headers, decode


# Failures.


@dataclass(frozen=True, slots=True)
class UpstreamFailure:
    """A failure to reach the upstream, or to read its answer, as the client is told of it:
    a ``server_error`` with an HTTP status and a code (the upstream's address is not in it)."""

    status: int
    code: str
    message: str

    @classmethod
    def of(cls, exc: httpx.RequestError) -> UpstreamFailure:
        """502 for an upstream that cannot be reached or fails, 504 for one that is too slow."""
        name = type(exc).__name__
        if isinstance(exc, httpx.TimeoutException):
            message = f"The upstream Responses server did not answer in time ({name})."
            return cls(504, "upstream_timeout", message)
        if isinstance(exc, httpx.ConnectError | httpx.UnsupportedProtocol):
            message = f"The upstream Responses server could not be reached ({name})."
            return cls(502, "upstream_unreachable", message)
        return cls(
            502, "upstream_error", f"The upstream Responses server failed to answer ({name})."
        )

    def sse_event(self) -> bytes:
        """The failure as an SSE ``error`` event (OpenAI's flat HTTP stream shape), to end an
        event stream with; ``status`` is what the middleware puts on the socket's error event."""
        return encode_sse(
            {
                "type": "error",
                "status": self.status,
                "code": self.code,
                "message": self.message,
                "param": None,
            }
        )

    async def send(self, send: Send) -> None:
        """Answer the client's HTTP request with the failure and an OpenAI error body."""
        body = error_body("server_error", self.code, self.message)
        with contextlib.suppress(Exception):  # the client may have gone meanwhile
            for message in json_answer("http.response", self.status, body):
                await send(message)


def log_failure(exc: httpx.RequestError, request: httpx.Request) -> None:
    """Log a failed upstream request for the operator: its address goes here, never to the
    client."""
    url = request.url.copy_with(username=None, password=None)
    logger.warning("proxying %s %s failed: %r", request.method, url, exc)
