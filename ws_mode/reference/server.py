"""A reference ``POST /v1/responses`` server around the scripted model.

It answers like OpenAI's HTTP API (one JSON response object, or an SSE stream with
``stream: true``), keeps no state of its own, and resolves ``previous_response_id`` only through
the ws_mode :class:`~ws_mode.turn.Turn` of the request, when it runs behind the middleware.

It does the work a real server does per request, on a real tokenizer: parse the body, render
the context to tokens, digest it. Over plain HTTP (and behind ``full_context="always"``) that
work covers the whole history every turn. Behind ``full_context="on_miss"`` a continuation
resumes from what its parent left on the Turn's artifacts and covers the new items only
(:mod:`ws_mode.reference.context`); the answer is the same either way.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import anyio
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ws_mode.reference import context as _context
from ws_mode.reference.model import (
    ReferenceConfig,
    argument_chunks,
    delta_tokens,
    output_tokens,
    script_from_state,
    text_deltas,
)
from ws_mode.reference.tokenizer import ReferenceTokenizer, default_tokenizer

if TYPE_CHECKING:
    from ws_mode.turn import Turn

__all__ = ["ReferenceStats", "create_app"]

_MIN_SLEEP: Final = 0.001  # below this, deltas are sent at once and the debt carried forward
_FLUSH_BYTES: Final = 16 * 1024  # largest SSE chunk buffered between two sleeps
_DEFAULT_MODEL: Final = "reference"
_OVERRIDE_KEY: Final = "reference_tool_calls"


class ReferenceStats:
    """Work counters of one reference app, kept on ``app.state.reference_stats``.

    Attributes:
        requests: ``POST`` requests received (failed ones included).
        bytes_parsed: request body bytes JSON-decoded.
        items_seen: context items the handler looked at: the whole context on a stateless
            request, only the new items on a continuation resumed from its parent's artifacts.
        tokens_rendered: tokens the handler rendered itself (context items, instructions, and
            the output kept for the next turn); not those a middleware ``renderer`` made.
        resumed: requests answered from the parent's artifacts instead of the whole context.
        cpu_seconds: CPU time of the handler's own work (parse, render, digest, script, event
            encoding), measured on the thread that runs it; streaming pauses are not counted.
    """

    requests: int
    bytes_parsed: int
    items_seen: int
    tokens_rendered: int
    resumed: int
    cpu_seconds: float

    def __init__(self) -> None:
        """Start with every counter at zero."""
        self.reset()

    def reset(self) -> None:
        """Set every counter back to zero."""
        self.requests = 0
        self.bytes_parsed = 0
        self.items_seen = 0
        self.tokens_rendered = 0
        self.resumed = 0
        self.cpu_seconds = 0.0

    def snapshot(self) -> dict[str, int | float]:
        """The counters as a plain dict."""
        return {
            "requests": self.requests,
            "bytes_parsed": self.bytes_parsed,
            "items_seen": self.items_seen,
            "tokens_rendered": self.tokens_rendered,
            "resumed": self.resumed,
            "cpu_seconds": self.cpu_seconds,
        }

    def __repr__(self) -> str:
        """Show the counters."""
        fields = ", ".join(f"{k}={v}" for k, v in self.snapshot().items())
        return f"ReferenceStats({fields})"


class _RequestError(Exception):
    """A request the server refuses, with OpenAI's error body."""

    def __init__(self, message: str, *, code: str | None, param: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param

    def response(self) -> Response:
        body = {
            "error": {
                "type": "invalid_request_error",
                "code": self.code,
                "message": self.message,
                "param": self.param,
            }
        }
        return Response(orjson.dumps(body), status_code=400, media_type="application/json")


def _invalid_type(param: str, expected: str, value: object) -> _RequestError:
    return _RequestError(
        f"Invalid type for '{param}': expected {expected}, but got {_json_type(value)} instead.",
        code="invalid_type",
        param=param,
    )


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


@dataclass(frozen=True)
class _Parsed:
    """The fields of a request body the server uses."""

    body: dict[str, Any]
    input: list[dict[str, Any]]
    previous_response_id: str | None
    instructions: str | None
    tools: list[dict[str, Any]] | None
    metadata: dict[str, str]
    tool_calls: int | None
    stream: bool


def _optional(body: dict[str, Any], key: str, kind: type, expected: str) -> Any:
    """``body[key]`` if present and not null (``None`` otherwise), checked to be a ``kind``."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise _invalid_type(key, expected, value)
    return value


def _parse(raw: bytes) -> _Parsed:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _RequestError(
            f"We could not parse the JSON body of your request: {exc}.",
            code="invalid_json",
            param=None,
        ) from None
    if not isinstance(body, dict):
        raise _RequestError(
            f"The request body must be a JSON object, but got {_json_type(body)}.",
            code="invalid_type",
            param=None,
        )

    raw_input = body.get("input")
    items: list[dict[str, Any]]
    if raw_input is None:
        items = []
    elif isinstance(raw_input, str):
        items = [{"role": "user", "content": raw_input}]
    elif isinstance(raw_input, list):
        for index, item in enumerate(raw_input):
            if not isinstance(item, dict):
                raise _invalid_type(f"input[{index}]", "an object", item)
        items = raw_input
    else:
        raise _invalid_type("input", "a string or an array of input items", raw_input)

    tools = _optional(body, "tools", list, "an array of tools")
    if tools is not None:
        for index, tool in enumerate(tools):
            if not isinstance(tool, dict):
                raise _invalid_type(f"tools[{index}]", "an object", tool)

    metadata = _optional(body, "metadata", dict, "an object") or {}
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise _invalid_type(f"metadata.{key}", "a string", value)
    tool_calls: int | None = None
    if _OVERRIDE_KEY in metadata:
        try:
            tool_calls = int(metadata[_OVERRIDE_KEY])
        except ValueError:
            tool_calls = -1
        if tool_calls < 0:
            raise _RequestError(
                f"Invalid value for 'metadata.{_OVERRIDE_KEY}': expected a string holding an "
                f"integer >= 0, got {metadata[_OVERRIDE_KEY]!r}.",
                code="invalid_value",
                param=f"metadata.{_OVERRIDE_KEY}",
            )

    _optional(body, "model", str, "a string")
    _optional(body, "parallel_tool_calls", bool, "a boolean")
    _optional(body, "store", bool, "a boolean")
    _optional(body, "max_output_tokens", int, "an integer")
    return _Parsed(
        body=body,
        input=items,
        previous_response_id=_optional(body, "previous_response_id", str, "a string"),
        instructions=_optional(body, "instructions", str, "a string"),
        tools=tools,
        metadata=metadata,
        tool_calls=tool_calls,
        stream=bool(_optional(body, "stream", bool, "a boolean")),
    )


def _lookup_turn(request: Request) -> Turn | None:
    """The ws_mode Turn of this request, or None over plain HTTP."""
    # Imported at call time, so loading this package never depends on the core's import order.
    from ws_mode.turn import turn

    return turn(request)


def _read_context(
    request: Request, parsed: _Parsed, tokenizer: ReferenceTokenizer
) -> tuple[Turn | None, _context.Context]:
    """The request's Turn and its context, resumed from the parent's artifacts when the
    middleware sent only the new items and the parent left them, from the whole context
    otherwise."""
    found = _lookup_turn(request)
    if parsed.previous_response_id is None:
        return found, _context.stateless(parsed.input, parsed.instructions, tokenizer)
    if found is None or found.previous is None:
        raise _RequestError(
            f"Previous response with id '{parsed.previous_response_id}' not found.",
            code="previous_response_not_found",
            param="previous_response_id",
        )
    if not found.full_context:
        resumed = _context.resume(found, parsed.instructions, tokenizer)
        if resumed is not None:
            return found, resumed
    return found, _context.stateless(found.history(), parsed.instructions, tokenizer)


def _default(body: dict[str, Any], key: str, default: Any) -> Any:
    value = body.get(key)
    return default if value is None else value


def _response_object(
    parsed: _Parsed,
    *,
    response_id: str,
    created_at: int,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    body = parsed.body
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": parsed.instructions,
        "max_output_tokens": body.get("max_output_tokens"),
        "model": _default(body, "model", _DEFAULT_MODEL),
        "output": output,
        "parallel_tool_calls": _default(body, "parallel_tool_calls", True),
        "previous_response_id": parsed.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": _default(body, "store", False),
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": _default(body, "tool_choice", "auto"),
        "tools": parsed.tools if parsed.tools is not None else [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": parsed.metadata,
    }


def _usage(input_tokens: int, produced: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": produced,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + produced,
    }


def _events(
    pending: dict[str, Any], completed: dict[str, Any]
) -> Iterator[tuple[dict[str, Any], int | None]]:
    """OpenAI's event sequence for a response, without sequence numbers, each with the number
    of output tokens it carries (for pacing): an int for a delta, None for any other event."""
    yield {"type": "response.created", "response": pending}, None
    yield {"type": "response.in_progress", "response": pending}, None
    for index, item in enumerate(completed["output"]):
        item_id = item["id"]
        if item["type"] == "function_call":
            added = {**item, "arguments": "", "status": "in_progress"}
            yield (
                {"type": "response.output_item.added", "output_index": index, "item": added},
                None,
            )
            arguments = item["arguments"]
            chunks = argument_chunks(arguments)
            for chunk, tokens in zip(chunks, delta_tokens(chunks), strict=True):
                delta = {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item_id,
                    "output_index": index,
                    "delta": chunk,
                }
                yield delta, tokens
            yield (
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item_id,
                    "output_index": index,
                    "arguments": arguments,
                },
                None,
            )
        else:
            added = {**item, "status": "in_progress", "content": []}
            yield (
                {"type": "response.output_item.added", "output_index": index, "item": added},
                None,
            )
            for content_index, part in enumerate(item["content"]):
                where = {"item_id": item_id, "output_index": index, "content_index": content_index}
                empty = {**part, "text": ""}
                yield {"type": "response.content_part.added", **where, "part": empty}, None
                deltas = text_deltas(part["text"])
                for text, tokens in zip(deltas, delta_tokens(deltas), strict=True):
                    yield (
                        {
                            "type": "response.output_text.delta",
                            **where,
                            "delta": text,
                            "logprobs": [],
                        },
                        tokens,
                    )
                yield (
                    {
                        "type": "response.output_text.done",
                        **where,
                        "text": part["text"],
                        "logprobs": [],
                    },
                    None,
                )
                yield {"type": "response.content_part.done", **where, "part": part}, None
        yield {"type": "response.output_item.done", "output_index": index, "item": item}, None
    yield {"type": "response.completed", "response": completed}, None


def _encode_event(event: dict[str, Any]) -> bytes:
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


async def _sse(
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
    for sequence_number, (event, tokens) in enumerate(_events(pending, completed)):
        if tokens is not None:
            if start is None:
                # The first delta: tokens are due from the first token's time on.
                start = time.monotonic() + config.time_to_first_token
            emitted += tokens
            delay = start + emitted * interval - time.monotonic()
            if delay >= _MIN_SLEEP:
                chunk = bytes(buffer)
                buffer.clear()
                stats.cpu_seconds += time.thread_time() - clock
                if chunk:
                    yield chunk
                await anyio.sleep(delay)
                clock = time.thread_time()
        event["sequence_number"] = sequence_number
        buffer += _encode_event(event)
        if len(buffer) >= _FLUSH_BYTES:
            chunk = bytes(buffer)
            buffer.clear()
            stats.cpu_seconds += time.thread_time() - clock
            yield chunk
            clock = time.thread_time()
    stats.cpu_seconds += time.thread_time() - clock
    if buffer:
        yield bytes(buffer)


def create_app(config: ReferenceConfig | None = None, *, path: str = "/v1/responses") -> Starlette:
    """Build the reference server: ``POST {path}`` runs the scripted model, ``GET /healthz``
    answers ``ok``. Its :class:`ReferenceStats` are on ``app.state.reference_stats``."""
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
            response, delay = _respond(request, raw)
        finally:
            stats.cpu_seconds += time.thread_time() - clock
        if delay >= _MIN_SLEEP:
            await anyio.sleep(delay)
        return response

    def _respond(request: Request, raw: bytes) -> tuple[Response, float]:
        """The response, and how long to wait before sending it (JSON answers only)."""
        stats.bytes_parsed += len(raw)
        try:
            parsed = _parse(raw)
            found, context = _read_context(request, parsed, tokenizer)
        except _RequestError as error:
            return error.response(), 0.0
        stats.items_seen += context.items_seen
        stats.tokens_rendered += context.tokens_rendered
        stats.resumed += context.resumed

        effective = config
        if parsed.tool_calls is not None and parsed.tool_calls != config.tool_calls:
            effective = dataclasses.replace(config, tool_calls=parsed.tool_calls)
        output = script_from_state(
            context.digest_state, context.tool_calls, parsed.instructions, parsed.tools, effective
        )
        if found is not None:
            stats.tokens_rendered += _context.save(found, context, output, tokenizer)
        produced = sum(output_tokens(item) for item in output)
        usage = _usage(context.input_tokens, produced)
        response_id = f"resp_{secrets.token_hex(16)}"
        created_at = int(time.time())
        completed = _response_object(
            parsed,
            response_id=response_id,
            created_at=created_at,
            status="completed",
            output=output,
            usage=usage,
        )
        if parsed.stream:
            pending = _response_object(
                parsed,
                response_id=response_id,
                created_at=created_at,
                status="in_progress",
                output=[],
                usage=None,
            )
            streaming = StreamingResponse(
                _sse(pending, completed, config, stats),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache"},
            )
            return streaming, 0.0
        rate = config.tokens_per_second
        delay = config.time_to_first_token + (produced / rate if rate else 0.0)
        return Response(orjson.dumps(completed), media_type="application/json"), delay

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[
            Route(path, responses, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ]
    )
    app.state.reference_stats = stats
    return app
