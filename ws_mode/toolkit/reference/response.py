"""The reference server's response object and its event stream: OpenAI's response JSON, the
event sequence that streams it, and that sequence paced like a model generating tokens, as SSE
or handed to ws_mode as objects (:class:`HandedEvents`, on a cache-aware socket turn)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, Final

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ws_mode._protocol import echoed_settings, echoed_tool
from ws_mode._sse import encode_sse

from .model import ReferenceConfig, argument_chunks, delta_tokens, text_deltas
from .request import Parsed
from .stats import ReferenceStats

if TYPE_CHECKING:
    from ws_mode._turn import Turn

__all__ = ["MIN_SLEEP", "HandedEvents", "events", "response_object", "sse", "usage"]

MIN_SLEEP: Final = 0.001
"""Below this many seconds, a pause is not taken: the debt is carried forward."""
_FLUSH_BYTES: Final = 16 * 1024  # largest SSE chunk buffered between two sleeps
_DEFAULT_MODEL: Final = "reference"


def response_object(
    parsed: Parsed,
    *,
    response_id: str,
    created_at: int,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    completed_at: int | None = None,
) -> dict[str, Any]:
    """The response object for a request, as OpenAI's API writes it: every field the Open
    Responses schema requires, the request's settings echoed (OpenAI's defaults where the
    request has none)."""
    body = parsed.body
    model = body.get("model")
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "completed_at": completed_at,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": parsed.instructions,
        "model": _DEFAULT_MODEL if model is None else model,
        "output": output,
        "previous_response_id": parsed.previous_response_id,
        "store": body.get("store") is not False,
        "usage": usage,
        "metadata": parsed.metadata,
        **echoed_settings(body),
        "tools": [echoed_tool(tool) for tool in parsed.tools or ()],
    }


def usage(input_tokens: int, produced: int) -> dict[str, Any]:
    """The ``usage`` of a response reading ``input_tokens`` and producing ``produced``."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": produced,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + produced,
    }


def events(
    pending: dict[str, Any], completed: dict[str, Any]
) -> Iterator[tuple[dict[str, Any], int | None]]:
    """OpenAI's event sequence for a response, without sequence numbers, each with the number
    of output tokens it carries (for pacing): an int for a delta, None for any other event."""
    yield {"type": "response.created", "response": pending}, None
    yield {"type": "response.in_progress", "response": pending}, None
    for index, item in enumerate(completed["output"]):
        if item["type"] == "function_call":
            yield from _function_call_events(index, item)
        elif item["type"] == "message":
            yield from _message_events(index, item)
        else:
            yield {"type": "response.output_item.added", "output_index": index, "item": item}, None
            if item["type"] == "compaction":
                # The summary is sampled (opaque: the event carries none of it).
                where = {"item_id": item["id"], "output_index": index}
                yield {"type": "response.compaction.compacting", **where}, None
        yield {"type": "response.output_item.done", "output_index": index, "item": item}, None
    yield {"type": "response.completed", "response": completed}, None


def _function_call_events(
    index: int, item: dict[str, Any]
) -> Iterator[tuple[dict[str, Any], int | None]]:
    """A function call item's events, up to (not including) its ``output_item.done``."""
    added = {**item, "arguments": "", "status": "in_progress"}
    yield {"type": "response.output_item.added", "output_index": index, "item": added}, None
    where = {"item_id": item["id"], "output_index": index}
    arguments = item["arguments"]
    chunks = argument_chunks(arguments)
    for chunk, tokens in zip(chunks, delta_tokens(chunks), strict=True):
        yield {"type": "response.function_call_arguments.delta", **where, "delta": chunk}, tokens
    done = {"type": "response.function_call_arguments.done", **where, "arguments": arguments}
    yield done, None


def _message_events(
    index: int, item: dict[str, Any]
) -> Iterator[tuple[dict[str, Any], int | None]]:
    """A message item's events, up to (not including) its ``output_item.done``."""
    added = {**item, "status": "in_progress", "content": []}
    yield {"type": "response.output_item.added", "output_index": index, "item": added}, None
    for content_index, part in enumerate(item["content"]):
        where = {"item_id": item["id"], "output_index": index, "content_index": content_index}
        empty = {**part, "text": ""}
        yield {"type": "response.content_part.added", **where, "part": empty}, None
        deltas = text_deltas(part["text"])
        for chunk, tokens in zip(deltas, delta_tokens(deltas), strict=True):
            delta = {"type": "response.output_text.delta", **where, "delta": chunk, "logprobs": []}
            yield delta, tokens
        text = part["text"]
        yield {"type": "response.output_text.done", **where, "text": text, "logprobs": []}, None
        yield {"type": "response.content_part.done", **where, "part": part}, None


async def sse(
    pending: dict[str, Any],
    completed: dict[str, Any],
    config: ReferenceConfig,
    stats: ReferenceStats,
) -> AsyncIterator[bytes]:
    """Encode the events as SSE, pacing deltas at ``config.tokens_per_second`` output tokens
    per second, after ``config.time_to_first_token``.

    Each token is due at ``start + tokens / rate``; the stream sleeps only when the next one is
    due at least 1 ms ahead, so fast rates sleep once per batch of tokens, not per token. Events
    are buffered between sleeps (and up to 16 KiB) to keep the number of body chunks small.
    The CPU time spent between pauses counts in ``stats.cpu_seconds``.
    """
    interval = 1.0 / config.tokens_per_second if config.tokens_per_second else 0.0
    start: float | None = None
    emitted = 0
    buffer = bytearray()
    clock = time.thread_time()
    for sequence_number, (event, tokens) in enumerate(events(pending, completed)):
        if tokens is not None:
            if start is None:
                # The first delta: tokens are due from the first token's time on.
                start = time.monotonic() + config.time_to_first_token
            emitted += tokens
            delay = start + emitted * interval - time.monotonic()
            if delay >= MIN_SLEEP:
                chunk = bytes(buffer)
                buffer.clear()
                stats.cpu_seconds += time.thread_time() - clock
                if chunk:
                    yield chunk
                await anyio.sleep(delay)
                clock = time.thread_time()
        event["sequence_number"] = sequence_number
        if event["type"] == "response.completed":
            event["response"]["completed_at"] = int(time.time())
        buffer += encode_sse(event)
        if len(buffer) >= _FLUSH_BYTES:
            chunk = bytes(buffer)
            buffer.clear()
            stats.cpu_seconds += time.thread_time() - clock
            yield chunk
            clock = time.thread_time()
    stats.cpu_seconds += time.thread_time() - clock
    if buffer:
        yield bytes(buffer)


class HandedEvents(Response):
    """The event stream handed to ws_mode as objects (:meth:`ws_mode.Turn.send_event`), paced
    as :func:`sse` paces it, then an empty ``text/event-stream`` answer: what a cache-aware
    handler does on a socket turn, skipping the SSE text ws_mode would decode again.

    The events between two pauses are built first and handed together, so the CPU time
    counted in ``stats.cpu_seconds`` is the model's, not ws_mode's forwarding."""

    def __init__(
        self,
        current: Turn,
        pending: dict[str, Any],
        completed: dict[str, Any],
        config: ReferenceConfig,
        stats: ReferenceStats,
    ) -> None:
        super().__init__(media_type="text/event-stream", headers={"cache-control": "no-cache"})
        self.current = current
        self.pending = pending
        self.completed = completed
        self.config = config
        self.stats = stats

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        config, stats = self.config, self.stats
        interval = 1.0 / config.tokens_per_second if config.tokens_per_second else 0.0
        start: float | None = None
        emitted = 0
        batch: list[dict[str, Any]] = []
        clock = time.thread_time()
        for sequence_number, (event, tokens) in enumerate(events(self.pending, self.completed)):
            if tokens is not None:
                if start is None:
                    start = time.monotonic() + config.time_to_first_token
                emitted += tokens
                delay = start + emitted * interval - time.monotonic()
                if delay >= MIN_SLEEP:
                    stats.cpu_seconds += time.thread_time() - clock
                    await self._hand(batch)
                    await anyio.sleep(delay)
                    clock = time.thread_time()
            event["sequence_number"] = sequence_number
            if event["type"] == "response.completed":
                event["response"]["completed_at"] = int(time.time())
            batch.append(event)
        stats.cpu_seconds += time.thread_time() - clock
        await self._hand(batch)
        await super().__call__(scope, receive, send)

    async def _hand(self, batch: list[dict[str, Any]]) -> None:
        for event in batch:
            await self.current.send_event(event)
        batch.clear()
