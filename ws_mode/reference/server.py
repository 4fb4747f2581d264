"""A stateless reference ``POST /v1/responses`` server around the scripted model.

It answers like OpenAI's HTTP API (one JSON response object, or an SSE stream with
``stream: true``), stores nothing, and resolves ``previous_response_id`` only through the
ws_mode :class:`~ws_mode.turn.Turn` of the request, when it runs behind the middleware.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Final, Protocol

import anyio
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ws_mode.reference.model import (
    ReferenceConfig,
    argument_chunks,
    argument_tokens,
    count_words,
    output_tokens,
    script,
    text_deltas,
)

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
        items_seen: context items the model processed (the whole history on a ws_mode
            continuation, the body's ``input`` otherwise).
    """

    requests: int
    bytes_parsed: int
    items_seen: int

    def __init__(self) -> None:
        """Start with every counter at zero."""
        self.reset()

    def reset(self) -> None:
        """Set every counter back to zero."""
        self.requests = 0
        self.bytes_parsed = 0
        self.items_seen = 0

    def snapshot(self) -> dict[str, int]:
        """The counters as a plain dict."""
        return {
            "requests": self.requests,
            "bytes_parsed": self.bytes_parsed,
            "items_seen": self.items_seen,
        }

    def __repr__(self) -> str:
        """Show the counters."""
        fields = ", ".join(f"{k}={v}" for k, v in self.snapshot().items())
        return f"ReferenceStats({fields})"


class _TurnLike(Protocol):
    """The part of ``ws_mode.turn.Turn`` this server relies on."""

    @property
    def previous(self) -> object | None: ...

    def history(self) -> list[dict[str, Any]]: ...


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


def _lookup_turn(request: Request) -> _TurnLike | None:
    """The ws_mode Turn of this request, or None over plain HTTP."""
    # Imported at call time, so loading this package never depends on the core's import order.
    from ws_mode.turn import turn

    return turn(request)


def _context(request: Request, parsed: _Parsed) -> list[dict[str, Any]]:
    if parsed.previous_response_id is None:
        return parsed.input
    found = _lookup_turn(request)
    if found is None or found.previous is None:
        raise _RequestError(
            f"Previous response with id '{parsed.previous_response_id}' not found.",
            code="previous_response_not_found",
            param="previous_response_id",
        )
    return found.history()


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


def _usage(input_tokens: int, output: list[dict[str, Any]]) -> dict[str, Any]:
    produced = sum(output_tokens(item) for item in output)
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": produced,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + produced,
    }


def _events(
    pending: dict[str, Any], completed: dict[str, Any]
) -> Iterator[tuple[dict[str, Any], int]]:
    """OpenAI's event sequence for a response, without sequence numbers, each with the number
    of simulated tokens it carries (for pacing)."""
    yield {"type": "response.created", "response": pending}, 0
    yield {"type": "response.in_progress", "response": pending}, 0
    for index, item in enumerate(completed["output"]):
        item_id = item["id"]
        if item["type"] == "function_call":
            added = {**item, "arguments": "", "status": "in_progress"}
            yield {"type": "response.output_item.added", "output_index": index, "item": added}, 0
            arguments = item["arguments"]
            for chunk in argument_chunks(arguments):
                delta = {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item_id,
                    "output_index": index,
                    "delta": chunk,
                }
                yield delta, argument_tokens(chunk)
            yield (
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item_id,
                    "output_index": index,
                    "arguments": arguments,
                },
                0,
            )
        else:
            added = {**item, "status": "in_progress", "content": []}
            yield {"type": "response.output_item.added", "output_index": index, "item": added}, 0
            for content_index, part in enumerate(item["content"]):
                where = {"item_id": item_id, "output_index": index, "content_index": content_index}
                empty = {**part, "text": ""}
                yield {"type": "response.content_part.added", **where, "part": empty}, 0
                for token in text_deltas(part["text"]):
                    yield (
                        {
                            "type": "response.output_text.delta",
                            **where,
                            "delta": token,
                            "logprobs": [],
                        },
                        1,
                    )
                yield (
                    {
                        "type": "response.output_text.done",
                        **where,
                        "text": part["text"],
                        "logprobs": [],
                    },
                    0,
                )
                yield {"type": "response.content_part.done", **where, "part": part}, 0
        yield {"type": "response.output_item.done", "output_index": index, "item": item}, 0
    yield {"type": "response.completed", "response": completed}, 0


def _encode_event(event: dict[str, Any]) -> bytes:
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


async def _sse(
    pending: dict[str, Any], completed: dict[str, Any], tokens_per_second: float
) -> AsyncIterator[bytes]:
    """Encode the events as SSE, pacing token-carrying events at ``tokens_per_second``.

    Each token is due at ``start + tokens / rate``; the stream sleeps only when the next one is
    due at least 1 ms ahead, so fast rates sleep once per batch of tokens, not per token. Events
    are buffered between sleeps (and up to 16 KiB) to keep the number of body chunks small.
    """
    interval = 1.0 / tokens_per_second if tokens_per_second else 0.0
    start = time.monotonic()
    emitted = 0
    buffer = bytearray()
    for sequence_number, (event, tokens) in enumerate(_events(pending, completed)):
        if tokens and interval:
            emitted += tokens
            delay = start + emitted * interval - time.monotonic()
            if delay >= _MIN_SLEEP:
                if buffer:
                    yield bytes(buffer)
                    buffer.clear()
                await anyio.sleep(delay)
        event["sequence_number"] = sequence_number
        buffer += _encode_event(event)
        if len(buffer) >= _FLUSH_BYTES:
            yield bytes(buffer)
            buffer.clear()
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
    rate = config.tokens_per_second

    async def responses(request: Request) -> Response:
        stats.requests += 1
        raw = await request.body()
        stats.bytes_parsed += len(raw)
        try:
            parsed = _parse(raw)
            context = _context(request, parsed)
        except _RequestError as error:
            return error.response()
        stats.items_seen += len(context)

        effective = config
        if parsed.tool_calls is not None and parsed.tool_calls != config.tool_calls:
            effective = dataclasses.replace(config, tool_calls=parsed.tool_calls)
        output = script(context, parsed.instructions, parsed.tools, effective)
        usage = _usage(count_words(context) + count_words(parsed.instructions), output)
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
            return StreamingResponse(
                _sse(pending, completed, rate),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache"},
            )
        if rate:
            delay = usage["output_tokens"] / rate
            if delay >= _MIN_SLEEP:
                await anyio.sleep(delay)
        return Response(orjson.dumps(completed), media_type="application/json")

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
