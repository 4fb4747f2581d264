"""The reference server's Starlette app: ``POST /v1/responses`` around the scripted model, and
``POST /v1/responses/compact``.

It answers like OpenAI's HTTP API (one JSON response object, or an SSE stream with
``stream: true``), keeps no state of its own, and resolves ``previous_response_id`` only through
the ws_mode :class:`~ws_mode.Turn` of the request, when it runs behind the middleware.
With ``context_management`` a response whose input reaches the compaction threshold starts its
output with a compaction item (:mod:`ws_mode.toolkit.reference.compaction`).

It does the work a real server does per request, on a real tokenizer: parse the body, render
the context to tokens, digest it. Over plain HTTP (and behind ``full_context="always"``) that
work covers the whole history every turn. Behind ``full_context="on_miss"`` a continuation
resumes from what its parent left on the Turn's artifacts and covers the new items only
(:mod:`ws_mode.toolkit.reference.context`); the answer is the same either way.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from typing import TYPE_CHECKING, Any

import anyio
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ws_mode._protocol import error_body

from . import context as _context
from .compaction import compaction_item, compaction_response, refuse_compact_request
from .model import ReferenceConfig, output_tokens, script_from_state
from .request import Parsed, RequestError, parse
from .response import MIN_SLEEP, HandedEvents, response_object, sse, usage
from .stats import ReferenceStats
from .tokenizer import ReferenceTokenizer, default_tokenizer

if TYPE_CHECKING:
    from ws_mode._turn import Turn

__all__ = ["create_app"]


def create_app(config: ReferenceConfig | None = None, *, path: str = "/v1/responses") -> Starlette:
    """Build the reference server: ``POST {path}`` runs the scripted model, ``POST
    {path}/compact`` compacts a context, ``GET /healthz`` answers ``ok``. Its
    :class:`ReferenceStats` are on ``app.state.reference_stats``."""
    if config is None:
        config = ReferenceConfig()
    elif not isinstance(config, ReferenceConfig):
        raise TypeError(f"config must be a ReferenceConfig, got {type(config).__name__}")
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"path must be a string starting with '/', got {path!r}")
    stats = ReferenceStats()
    # Trained now, so the first request does not pay for it (and a missing package shows here).
    tokenizer = default_tokenizer()

    async def responses(request: Request) -> Response:
        stats.requests += 1
        raw = await request.body()
        clock = time.thread_time()
        try:
            response, delay = _respond(request, raw, config, stats, tokenizer)
        finally:
            stats.cpu_seconds += time.thread_time() - clock
        if delay >= MIN_SLEEP:
            await anyio.sleep(delay)
        return response

    async def compaction(request: Request) -> Response:
        stats.requests += 1
        raw = await request.body()
        clock = time.thread_time()
        try:
            compacted = _compact(raw, stats, tokenizer)
        except RequestError as error:
            return error.response()
        finally:
            stats.cpu_seconds += time.thread_time() - clock
        return Response(orjson.dumps(compacted), media_type="application/json")

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[
            Route(path, responses, methods=["POST"]),
            Route(f"{path}/compact", compaction, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ]
    )
    app.state.reference_stats = stats
    return app


def _respond(
    request: Request,
    raw: bytes,
    config: ReferenceConfig,
    stats: ReferenceStats,
    tokenizer: ReferenceTokenizer,
) -> tuple[Response, float]:
    """The response, and how long to wait before sending it (JSON answers only)."""
    stats.bytes_parsed += len(raw)
    try:
        parsed = parse(raw)
        limited = config.rate_limited_model
        if limited is not None and parsed.body.get("model") == limited:
            return _rate_limited(limited), 0.0
        found, context = _read_context(request, parsed, tokenizer)
    except RequestError as error:
        return error.response(), 0.0
    stats.items_seen += context.items_seen
    stats.tokens_rendered += context.tokens_rendered
    stats.resumed += context.resumed

    effective = config
    if parsed.tool_calls is not None and parsed.tool_calls != config.tool_calls:
        effective = dataclasses.replace(config, tool_calls=parsed.tool_calls)
    output = script_from_state(
        context.digest_state,
        context.tool_calls,
        parsed.instructions,
        parsed.tools,
        effective,
        declared=context.declared,
    )
    threshold = parsed.compact_threshold
    if threshold is not None and context.input_tokens >= threshold:
        # Compacted before sampling: the answer reads the compacted context, the same one.
        output = [compaction_item(context.folded), *output]
    if found is not None and found.cache_aware:
        # Only a cache-aware middleware sends a continuation without the context to resume.
        stats.tokens_rendered += _context.save(found, context, output, tokenizer)
    produced = sum(output_tokens(item) for item in output)
    response_id = f"resp_{secrets.token_hex(16)}"
    created_at = int(time.time())
    completed = response_object(
        parsed,
        response_id=response_id,
        created_at=created_at,
        status="completed",
        output=output,
        usage=usage(context.input_tokens, produced),
    )
    if parsed.stream:
        pending = response_object(
            parsed,
            response_id=response_id,
            created_at=created_at,
            status="in_progress",
            output=[],
            usage=None,
        )
        if found is not None and found.cache_aware:
            # A cache-aware socket turn: the events go to ws_mode as objects, no SSE text.
            return HandedEvents(found, pending, completed, config, stats), 0.0
        streaming = StreamingResponse(
            sse(pending, completed, config, stats),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache"},
        )
        return streaming, 0.0
    rate = config.tokens_per_second
    delay = config.time_to_first_token + (produced / rate if rate else 0.0)
    completed["completed_at"] = int(time.time() + delay)
    return Response(orjson.dumps(completed), media_type="application/json"), delay


#: The headers of the rate-limited model's 429, as OpenAI's API sends them.
RATE_LIMIT_HEADERS: dict[str, str] = {
    "retry-after": "20",
    "retry-after-ms": "20000",
    "x-ratelimit-limit-requests": "60",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-reset-requests": "20s",
    "x-ratelimit-limit-tokens": "150000",
    "x-ratelimit-remaining-tokens": "149000",
    "x-ratelimit-reset-tokens": "6ms",
}


def _rate_limited(model: str) -> Response:
    """The 429 of ``ReferenceConfig.rate_limited_model``: OpenAI's error body and its
    rate-limit headers."""
    body = error_body(
        "requests",
        "rate_limit_exceeded",
        f"Rate limit reached for {model} on requests per min (RPM): Limit 60, Used 60, "
        "Requested 1. Please try again in 20s.",
    )
    return Response(body, 429, RATE_LIMIT_HEADERS, media_type="application/json")


def _compact(raw: bytes, stats: ReferenceStats, tokenizer: ReferenceTokenizer) -> dict[str, Any]:
    """The ``response.compaction`` object for a compact request body, its whole context read
    (:mod:`ws_mode.toolkit.reference.compaction`); raises :class:`RequestError` for one OpenAI
    refuses (no ``model``, bad items, an unknown ``previous_response_id``)."""
    # Read here rather than in compaction: reading a context (context.py) builds on compaction.
    stats.bytes_parsed += len(raw)
    parsed = parse(raw)
    refuse_compact_request(parsed)
    context = _context.stateless(parsed.input, parsed.instructions, tokenizer)
    stats.items_seen += context.items_seen
    stats.tokens_rendered += context.tokens_rendered
    return compaction_response(parsed.input, context.folded, context.input_tokens)


def _lookup_turn(request: Request) -> Turn | None:
    """The ws_mode Turn of this request, or None over plain HTTP."""
    # Imported at call time, so loading this package never depends on the core's import order.
    from ws_mode._turn import turn

    return turn(request)


def _read_context(
    request: Request, parsed: Parsed, tokenizer: ReferenceTokenizer
) -> tuple[Turn | None, _context.Context]:
    """The request's Turn and its context, resumed from the parent's artifacts when the
    middleware sent only the new items and the parent left them, from the whole context
    otherwise."""
    found = _lookup_turn(request)
    if parsed.previous_response_id is None:
        return found, _context.stateless(parsed.input, parsed.instructions, tokenizer)
    if found is None or found.previous is None:
        raise RequestError(
            f"Previous response with id '{parsed.previous_response_id}' not found.",
            code="previous_response_not_found",
            param="previous_response_id",
        )
    if not found.full_context:
        resumed = _context.resume(found, parsed.instructions, tokenizer)
        if resumed is not None:
            return found, resumed
    return found, _context.stateless(found.history(), parsed.instructions, tokenizer)
