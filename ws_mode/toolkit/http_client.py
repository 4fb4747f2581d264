"""The tools' HTTP client: JSON calls and streamed Responses turns over one keep-alive pool.

:class:`HttpClient` wraps ``httpx.Client``: :meth:`~HttpClient.get_json` and
:meth:`~HttpClient.post_json` for JSON answers (the benchmark servers' stats routes, a
non-streamed Responses call), :meth:`~HttpClient.stream_events` for a ``stream: true`` call,
whose SSE body the core's :class:`~ws_mode._sse.SSEDecoder` decodes, each event's JSON decoded
like a socket frame (:func:`ws_mode.testing._client.decode_event`). Needs httpx (the ``cli``
extra), imported when a client is made.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from ws_mode._sse import SSEDecoder
from ws_mode.testing._client import decode_event

if TYPE_CHECKING:
    import httpx

__all__ = ["HttpClient", "HttpStatusError", "NotAnEventStream", "describe_error"]

#: The data of the event some servers send after the last one; not an event.
DONE: bytes = b"[DONE]"


def describe_error(envelope: Mapping[str, Any], status: int | None = None) -> str:
    """One line out of an error envelope (a socket ``error`` event or an HTTP error body)."""
    error = envelope.get("error")
    if not isinstance(error, Mapping):
        error = {}
    status = status if status is not None else envelope.get("status")
    code = error.get("code") or error.get("type") or "error"
    message = error.get("message") or "no message"
    where = f" {status}" if status is not None else ""
    return f"{code}{where}: {message}"


class HttpStatusError(Exception):
    """The server answered an unexpected status; ``envelope`` is its error body (as JSON, or
    the start of its text as the message)."""

    def __init__(self, status: int, body: bytes) -> None:
        try:
            envelope = orjson.loads(body)
        except orjson.JSONDecodeError:
            envelope = {"error": {"message": body[:500].decode(errors="replace")}}
        self.status = status
        self.envelope: dict[str, Any] = envelope if isinstance(envelope, dict) else {}
        super().__init__(f"HTTP {status}: {describe_error(self.envelope, status)}")


class NotAnEventStream(Exception):
    """A streamed call answered with something else than ``text/event-stream``."""

    def __init__(self, content_type: str) -> None:
        self.content_type = content_type
        super().__init__(
            f"expected an SSE stream (stream: true), got content-type {content_type!r}"
        )


class HttpClient:
    """One ``httpx.Client`` (connections kept alive between calls); a context manager.

    Paths are relative to ``base_url`` (or whole URLs when it is empty); ``headers`` go with
    every request. Transport failures raise httpx's ``TransportError`` (``TimeoutException``
    among them)."""

    def __init__(
        self,
        base_url: str = "",
        *,
        timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        import httpx

        self.client: httpx.Client = httpx.Client(
            base_url=base_url, timeout=timeout, headers=dict(headers or {})
        )

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def get_json(self, path: str) -> dict[str, Any]:
        """``GET path``: its JSON object; :class:`HttpStatusError` unless a 2xx."""
        return _json(self.client.get(path))

    def post_json(self, path: str, body: Any = None) -> dict[str, Any]:
        """``POST path`` with ``body`` as JSON (no body when None): its JSON object;
        :class:`HttpStatusError` unless a 2xx."""
        answer = self.client.post(path) if body is None else self.client.post(path, json=body)
        return _json(answer)

    def stream_events(self, path: str, body: bytes) -> Iterator[dict[str, Any]]:
        """``POST path`` with the JSON ``body`` of a ``stream: true`` call; each event of the
        SSE answer, as it arrives, to the end of the stream. :class:`HttpStatusError` unless a
        200, :class:`NotAnEventStream`, or ``FrameError`` for an event that is not a JSON
        object."""
        with self.client.stream("POST", path, content=body) as answer:
            if answer.status_code != 200:
                raise HttpStatusError(answer.status_code, answer.read())
            kind = answer.headers.get("content-type", "")
            if not kind.startswith("text/event-stream"):
                raise NotAnEventStream(kind)
            decoder = SSEDecoder()
            for chunk in answer.iter_bytes():
                for _, data in decoder.feed(chunk):
                    if data != DONE:
                        yield decode_event(data)

    def close(self) -> None:
        self.client.close()


def _json(answer: httpx.Response) -> dict[str, Any]:
    if not answer.is_success:
        raise HttpStatusError(answer.status_code, answer.read())
    value: dict[str, Any] = answer.json()
    return value
