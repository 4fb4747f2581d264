"""The proxy's dealings with the upstream whatever client talks to it: its URL (and the request
URLs built on it, which never leave its origin), the headers that may cross, compressed answers
undone, and its failures as OpenAI errors (an HTTP error answer, or an SSE ``error`` event
mid-stream). The clients themselves are :mod:`ws_mode.proxy._transport`.
"""

from __future__ import annotations

import contextlib
import logging
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote, quote_from_bytes, urlsplit

import httpx

from .._asgi import Send
from .._errors import ConfigError, WSModeError
from .._headers import end_to_end
from .._logs import for_log
from .._protocol import INVALID_REQUEST_TARGET, error_body, json_answer
from .._sse import encode_sse

logger = logging.getLogger("ws_mode.proxy")

DEFAULT_TIMEOUT: Final = httpx.Timeout(600.0, connect=10.0)
"""600 s to wait for each read (a long generation, a gap between events), 10 s to connect."""

DEFAULT_LIMITS: Final = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
"""Connections to the upstream: a proxy holds one per response being streamed."""

REQUEST_DROPPED: Final = (b"host", b"content-length", b"accept-encoding", b"expect")
"""Request headers the proxy sets itself besides the hop-by-hop ones (`ws_mode._headers`): the
client sets `host` and the body's length, the upstream is asked for an uncompressed answer, and
`expect` was the front server's business."""
# Response headers the front server sets itself (it would send them twice otherwise).
_RESPONSE_DROPPED: Final = (b"date", b"server")
# Encodings the proxy undoes (zlib, no optional package): an upstream that compresses in spite
# of `accept-encoding: identity` has these undone, so an event stream stays readable.
_WBITS: Final = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": 0}


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


API_PREFIX: Final = "/v1"
"""The client path prefix an upstream URL with a path stands for."""
# What stays as it is in a forwarded path: the characters of a path segment (RFC 3986) but `@`
# and `%`; every other character, `?`, `#`, `%` and `@` included, is percent-encoded. A path
# that starts with one `/` and keeps no `@` cannot be read as an authority by any parser.
_PATH_SAFE: Final = "/:!$&'()*+,;=~"
# What stays as it is in a forwarded query: the characters of a query, `%` (an escape the
# client wrote); the rest (`#`, spaces, control and non-ASCII bytes) is percent-encoded.
_QUERY_SAFE: Final = b"/?:@!$&'()*+,;=~%"
# Characters no forwarded path may hold: controls, and the backslash some URL parsers read
# as a `/` (WHATWG's, for http and https).
_REFUSED_CHARS: Final = re.compile(r"[\x00-\x1f\x7f\\]")


class TargetRefused(WSModeError, ValueError):
    """A request the proxy does not forward: its path is not one the upstream URL can be built
    on without the URL leaving the upstream's origin (or is not a path a client sends). The
    client gets 400 (``invalid_request_error``, ``invalid_request_target``) and nothing is sent
    upstream; ``reason`` says why."""

    @property
    def reason(self) -> str:
        """Why the request is not forwarded (the error's message)."""
        return str(self)

    async def send(self, send: Send) -> None:
        """Answer the client's HTTP request with 400 and an OpenAI error body."""
        message = f"The proxy does not forward this request: {self.reason}."
        body = error_body("invalid_request_error", INVALID_REQUEST_TARGET, message)
        with contextlib.suppress(Exception):  # the client may have gone meanwhile
            for answer in json_answer("http.response", 400, body):
                await send(answer)


def path_refusal(path: str) -> str | None:
    """Why a client path (decoded, ``root_path`` removed) is not forwarded, or None: it must
    start with a single ``/`` and hold no empty segment (``//``), no ``.`` or ``..`` segment,
    no backslash and no control character."""
    if not path.startswith("/"):
        return "the path does not start with '/'"
    if "//" in path:
        return "the path has an empty segment ('//')"
    if _REFUSED_CHARS.search(path):
        return "the path holds a backslash or a control character"
    if any(segment in (".", "..") for segment in path.split("/")):
        return "the path has a '.' or '..' segment"
    return None


def upstream_url(origin: str, base_path: str, path: str, query: bytes | str = b"") -> str:
    """The upstream URL of a client request to ``path`` (decoded, ``root_path`` removed) with
    ``query`` (the raw query string): ``origin`` (``scheme://host[:port]``) and ``base_path``
    (the upstream URL's path, standing for the client's ``/v1``; empty: paths go unchanged)
    followed by the path, percent-encoded, and the query. :class:`TargetRefused` when the path
    is refused (:func:`path_refusal`) or the URL would not be on ``origin``."""
    reason = path_refusal(path)
    if reason is not None:
        raise TargetRefused(reason)
    try:
        quoted = quote(path, safe=_PATH_SAFE, errors="strict")
    except UnicodeEncodeError:
        raise TargetRefused("the path is not valid text") from None
    if base_path and (path == API_PREFIX or path.startswith(API_PREFIX + "/")):
        target = origin + base_path + quoted[len(API_PREFIX) :]
    else:
        target = origin + quoted
    if query:
        raw = query.encode("utf-8", "surrogatepass") if isinstance(query, str) else query
        target += "?" + quote_from_bytes(raw, safe=_QUERY_SAFE)
    parts = urlsplit(target)
    if f"{parts.scheme}://{parts.netloc}" != origin or not parts.path.startswith("/"):
        raise TargetRefused("the upstream URL would leave the upstream's origin")
    return target


def public_url(url: str) -> str:
    """``url`` without the credentials it may hold, to show or log."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl()


# Headers and bodies.

HANDSHAKE_PROBE_SECONDS: Final = 5.0
"""How long a socket's handshake waits for the upstream's answer to its probe (``HEAD``) before
it is accepted without the upstream's headers."""
_HANDSHAKE_NAMES: Final = frozenset({b"x-models-etag", b"x-reasoning-included"})
_HANDSHAKE_PREFIXES: Final = (b"openai-", b"x-codex-")


def handshake_headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The headers of the upstream's answer to a handshake's probe that go on the socket's
    handshake answer: those a WebSocket mode client reads there (Codex: ``openai-model``,
    ``x-models-etag``, ``x-reasoning-included``, ``x-codex-turn-state``), that is
    ``x-models-etag``, ``x-reasoning-included`` and every ``openai-*`` and ``x-codex-*``.
    The rest (the probe's own ``content-*``, ``allow``, cookies) describe the probe."""
    kept: list[tuple[bytes, bytes]] = []
    for name, value in raw:
        lowered = bytes(name).lower()
        if lowered in _HANDSHAKE_NAMES or lowered.startswith(_HANDSHAKE_PREFIXES):
            kept.append((lowered, bytes(value)))
    return kept


def answer_headers(
    raw: Iterable[tuple[bytes, bytes]],
) -> tuple[list[tuple[bytes, bytes]], BodyDecoder | None]:
    """The upstream answer's headers to send to the client, and the decoder its body goes
    through when the upstream compressed it anyway with encodings the proxy undoes (gzip,
    deflate); other encodings pass through untouched, with their headers."""
    headers = end_to_end(raw, _RESPONSE_DROPPED)
    encodings: list[str] = []
    for name, value in headers:
        if name == b"content-encoding":
            encodings += [
                token
                for token in (part.strip().lower() for part in value.decode("latin-1").split(","))
                if token and token != "identity"
            ]
    if not encodings or not all(token in _WBITS for token in encodings):
        return headers, None
    # Undone here, so the sizes and encoding change.
    dropped = (b"content-encoding", b"content-length")
    return [(k, v) for k, v in headers if k not in dropped], BodyDecoder(encodings)


class BodyDecoder:
    """Undoes a chain of gzip/deflate content encodings, chunk by chunk (the last encoding
    applied is undone first). ``deflate`` is zlib-wrapped, or raw as some servers send it."""

    def __init__(self, encodings: Iterable[str]) -> None:
        self._wbits = [_WBITS[token] for token in reversed(list(encodings))]
        self._stages = [_decompressor(bits) for bits in self._wbits]
        self._started = [False] * len(self._stages)

    def decode(self, chunk: bytes) -> bytes:
        """The decoded bytes of ``chunk`` (possibly none yet)."""
        for index, stage in enumerate(self._stages):
            if not chunk:
                return b""
            try:
                chunk = stage.decompress(chunk)
            except zlib.error:
                if self._started[index] or self._wbits[index] != 0:
                    raise
                # A raw deflate stream (no zlib header): start again without one.
                self._stages[index] = stage = zlib.decompressobj(-zlib.MAX_WBITS)
                chunk = stage.decompress(chunk)
            self._started[index] = True
        return chunk

    def flush(self) -> bytes:
        """What is left once the body has ended."""
        chunk = b""
        for stage in self._stages:
            chunk = (stage.decompress(chunk) if chunk else b"") + stage.flush()
        return chunk


def _decompressor(wbits: int) -> zlib._Decompress:
    # deflate: a zlib header (MAX_WBITS) is expected; raw deflate is caught on the first chunk.
    return zlib.decompressobj(wbits or zlib.MAX_WBITS)


# Failures.


@dataclass(frozen=True, slots=True)
class UpstreamFailure:
    """A failure to reach the upstream, or to read its answer, as the client is told of it:
    a ``server_error`` with an HTTP status and a code (the upstream's address is not in it)."""

    status: int
    code: str
    message: str

    @classmethod
    def timeout(cls, name: str) -> UpstreamFailure:
        """504: the upstream did not connect, or did not answer, in time (``name``: what the
        client library raised)."""
        message = f"The upstream Responses server did not answer in time ({name})."
        return cls(504, "upstream_timeout", message)

    @classmethod
    def unreachable(cls, name: str) -> UpstreamFailure:
        """502: the upstream could not be reached."""
        message = f"The upstream Responses server could not be reached ({name})."
        return cls(502, "upstream_unreachable", message)

    @classmethod
    def broken(cls, name: str) -> UpstreamFailure:
        """502: the upstream failed while answering (a broken connection or answer)."""
        message = f"The upstream Responses server failed to answer ({name})."
        return cls(502, "upstream_error", message)

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


class UpstreamError(Exception):
    """A request to the upstream failed (its client library's error is the ``__cause__``)."""

    def __init__(self, failure: UpstreamFailure, cause: BaseException) -> None:
        super().__init__(failure.message)
        self.failure = failure
        self.cause = cause


def log_failure(error: UpstreamError, method: str, url: str) -> None:
    """Log a failed upstream request for the operator: its address goes here, never to the
    client."""
    logger.warning(
        "proxying %s %s failed: %s", for_log(method), for_log(public_url(url)), for_log(error.cause)
    )
