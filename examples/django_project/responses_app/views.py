"""`POST /v1/responses` as ordinary async Django views.

`create_response` is stateless: the whole context is in `input`, on plain HTTP and on every
socket turn alike. `create_cached_response` is cache-aware: behind a middleware with
`full_context="on_miss"`, a continuation whose parent is cached carries only the new items, and
`ws_mode.turn(request)` hands the view what it kept from the previous turn.

Both views are `async def` and stream with an async generator: under ASGI, Django serves an
async iterator chunk by chunk, while a sync iterator would be read to its end first.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

import ws_mode

from .model import Item, Stats, last_question, reply, response_object, sse


def error(status: int, message: str, param: str | None = None) -> JsonResponse:
    """An OpenAI error body; over the socket it becomes an `error` event with this status."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"type": kind, "code": None, "message": message, "param": param}}
    return JsonResponse(body, status=status)


def parse(request: HttpRequest) -> tuple[dict[str, Any], list[Item]] | JsonResponse:
    """The request body and its `input` as a list of items, or the 400 answer."""
    current = ws_mode.turn(request)
    try:
        body = json.loads(request.body)
    except ValueError:
        return error(400, "The body is not valid JSON.")
    if not isinstance(body, dict):
        return error(400, "The body must be a JSON object.")
    items = body.get("input", [])
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        return error(400, "'input' must be a string or an array of items.", "input")
    if body.get("previous_response_id") is not None and current is None:
        # Over plain HTTP this server keeps nothing; on the socket ws_mode resolves the id.
        message = "This server stores no responses: send the whole context in 'input'."
        return error(400, message, "previous_response_id")
    return body, items


def answer(body: dict[str, Any], output: list[Item]) -> HttpResponse:
    """An SSE stream for `stream: true` (always so on socket turns), else one JSON object."""
    response = response_object(body, output)
    if not body.get("stream"):
        return JsonResponse(response)
    streaming = StreamingHttpResponse(sse(response), content_type="text/event-stream")
    streaming["Cache-Control"] = "no-cache"
    streaming["X-Accel-Buffering"] = "no"  # nginx: do not buffer the event stream
    return streaming


@csrf_exempt  # API clients send no CSRF token; authenticate them with a bearer token instead
@require_POST
async def create_response(request: HttpRequest) -> HttpResponse:
    parsed = parse(request)
    if isinstance(parsed, JsonResponse):
        return parsed
    body, items = parsed
    return answer(body, reply(last_question(items), Stats.of(items)))


@csrf_exempt
@require_POST
async def create_cached_response(request: HttpRequest) -> HttpResponse:
    parsed = parse(request)
    if isinstance(parsed, JsonResponse):
        return parsed
    body, items = parsed
    current = ws_mode.turn(request)  # None over plain HTTP
    if current is None or current.full_context:
        # Plain HTTP, a fresh chain, or a parent ws_mode does not have: `input` is everything.
        context = Stats.of(items)
        question = last_question(items)
    else:
        # The fast path: `input` holds only the new items; the rest comes from the cache.
        assert current.previous is not None
        known: Stats | None = current.previous.artifacts.get("stats")
        if known is None:  # a parent this view did not answer (a generate=False warm-up)
            context = Stats.of(current.history())
        else:
            context = known + Stats.of(current.new_input)
        question = last_question(current.new_input) or last_question(current.history())
    output = reply(question, context)
    if current is not None:
        # Kept on this response in the connection's cache; the next turn reads it back.
        current.artifacts["stats"] = context + Stats.of(output)
    return answer(body, output)


@csrf_exempt
@require_POST
async def create_private_response(request: HttpRequest) -> HttpResponse:
    """For logged-in users only. On a socket turn the user is the connection's principal, which
    the `authenticate` hook found at the handshake (no lookup per turn); over plain HTTP it is
    the request's session user, which Django's middleware finds."""
    parsed = parse(request)
    if isinstance(parsed, JsonResponse):
        return parsed
    body, items = parsed
    current = ws_mode.turn(request)
    user = current.principal if current is not None else await request.auser()
    if not user.is_authenticated:
        return error(401, "Log in first.")
    question = f"{user.get_username()}: {last_question(items)}"
    return answer(body, reply(question, Stats.of(items)))
