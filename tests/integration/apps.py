"""Small real FastAPI apps behind `WebSocketModeMiddleware`, for the integration tests.

One FastAPI app serves a stateless `POST /v1/responses`. The request's `model` picks the
handler's behaviour (`HANDLER_NAMES`: scripted, json, error-4xx, error-200, error-500,
raise-before, raise-during, no-terminal, failed, incomplete, sse-error, odd-sse, data-only,
multi-item, background, slow), and `metadata` tunes it:

- `tag`: groups the calls of one test in the `Recorder` (every test uses its own tag);
- `k`: the scripted model asks for a tool while the context holds fewer than `k`
  `function_call_output` items after the last user message (default 2);
- `deltas`, `delay`: how many text deltas the scripted model streams, seconds between events;
- `status`: the status of the `error-4xx` handler's answer.

Every call is recorded (`Recorder`): the body as received, the headers, and, when ws_mode
made the call, a snapshot of `ws_mode.turn(request)` (`previous.id`, `previous.artifacts`,
`new_input`, `history()`, `tools_changed`, `stream_id`); the handler also writes
`turn.artifacts` (`turn_no`, `tag`) so the next turn can read them back. A cache-aware
handler builds its context from `turn.history()` when it got only the new items.

The app is wrapped by several middleware instances, one per socket path, so one server per
test session covers every setting (see `MOUNTS`); each of them sends its turns in-process to
the same `POST /v1/responses`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.middleware.gzip import GZipMiddleware
from starlette.types import ASGIApp

import ws_mode
from ws_mode import Limits, WebSocketModeMiddleware

__all__ = [
    "MOUNTS",
    "Call",
    "IntegrationApp",
    "Recorder",
    "create_app",
    "response_object",
]

#: Socket paths (the SDK's base_url is `base + prefix + "/v1"`) and their middleware settings.
#: The default `""` mount is added with `app.add_middleware(WebSocketModeMiddleware)`.
MOUNTS: dict[str, dict[str, Any]] = {
    "/onmiss": {"full_context": "on_miss"},
    "/small": {"limits": Limits(max_streams=2, max_message_bytes=1000)},
    "/serial": {"limits": Limits(max_in_flight=1)},
    "/short": {"limits": Limits(max_connection_seconds=1)},
    "/single": {"limits": Limits(max_connections=1)},
    "/tiny": {"limits": Limits(max_cached_responses=2)},
    "/browser": {"allowed_origins": ("https://app.example.com", "https://*.trusted.example")},
}

ODD_TEXT = "Grüße — naïve café ✓ 🚀 “quoted” 日本語"

TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look something up.",
    "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}},
    "strict": False,
}


@dataclass
class Call:
    """One call of the handler, as it saw it."""

    tag: str
    model: str
    body: dict[str, Any]
    headers: list[tuple[str, str]]
    turn: dict[str, Any] | None
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    #: How a streaming generator ended: "completed", "cancelled", "closed" or "raised".
    exit: str | None = None
    #: What the app's lifespan put in the state, as the handler's request sees it.
    lifespan_state: Any = None
    #: The size of the request body as received, and the request's path and root_path.
    body_length: int = 0
    path: str = ""
    root_path: str = ""

    def header(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key == name.lower()]


class Recorder:
    """What the handler received; shared between the server's thread and the tests."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.calls: list[Call] = []
        self.middleware_seen: list[str] = []

    def add(self, call: Call) -> None:
        with self._cond:
            self.calls.append(call)
            self._cond.notify_all()

    def finish(self, call: Call, how: str) -> None:
        with self._cond:
            if call.ended is None:
                call.ended = time.monotonic()
                call.exit = how
            self._cond.notify_all()

    def for_tag(self, tag: str) -> list[Call]:
        with self._cond:
            return [call for call in self.calls if call.tag == tag]

    def settled(self, tag: str, count: int, timeout: float = 5.0) -> list[Call]:
        """The calls of `tag` once there are `count` of them and all have ended."""

        def done() -> bool:
            calls = [call for call in self.calls if call.tag == tag]
            return len(calls) >= count and all(call.ended is not None for call in calls)

        assert self.wait_for(done, timeout), f"{count} calls of {tag} did not all end"
        return self.for_tag(tag)

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Wait until `predicate()` holds (it is checked whenever a call starts or ends)."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout)


def as_items(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return list(value)


def tool_outputs_since_user(context: list[dict[str, Any]]) -> int:
    last_user = max(
        (index for index, item in enumerate(context) if item.get("role") == "user"), default=-1
    )
    return sum(1 for item in context[last_user + 1 :] if item.get("type") == "function_call_output")


def response_object(
    body: dict[str, Any],
    *,
    response_id: str,
    status: str,
    output: list[dict[str, Any]],
    created_at: int,
) -> dict[str, Any]:
    """A full response object; it validates as `openai.types.responses.Response`."""
    finished = status == "completed"
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "model": body.get("model") or "scripted",
        "output": output,
        "previous_response_id": body.get("previous_response_id"),
        "instructions": body.get("instructions"),
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice", "auto"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "store": body.get("store", False),
        "temperature": 1.0,
        "top_p": 1.0,
        "truncation": "disabled",
        "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 15,
        }
        if finished
        else None,
        "error": None,
        "incomplete_details": None,
        "metadata": body.get("metadata") or {},
    }


def _chunks(text: str, count: int) -> list[str]:
    count = max(1, min(count, len(text)))
    size = -(-len(text) // count)
    return [text[i : i + size] for i in range(0, len(text), size)]


def _script(context: list[dict[str, Any]], k: int) -> tuple[dict[str, Any], str]:
    """The scripted model's one output item, and the text it streams for it."""
    outputs = tool_outputs_since_user(context)
    if outputs < k:
        arguments = json.dumps({"step": outputs})
        item = {
            "type": "function_call",
            "id": "fc_" + uuid.uuid4().hex,
            "call_id": "call_" + uuid.uuid4().hex[:12],
            "name": "lookup",
            "arguments": arguments,
            "status": "completed",
        }
        return item, arguments
    text = f"Done: received {len(context)} items."
    item = {
        "type": "message",
        "id": "msg_" + uuid.uuid4().hex,
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    return item, text


def turn_events(
    body: dict[str, Any], item: dict[str, Any], text: str, deltas: int
) -> list[dict[str, Any]]:
    """The SSE events of a one-item turn, ending in `response.completed`."""
    response_id = "resp_" + uuid.uuid4().hex
    created_at = int(time.time())
    started = response_object(
        body, response_id=response_id, status="in_progress", output=[], created_at=created_at
    )
    done = response_object(
        body, response_id=response_id, status="completed", output=[item], created_at=created_at
    )
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
    ]
    where: dict[str, Any] = {"item_id": item["id"], "output_index": 0}
    if item["type"] == "function_call":
        events.append(
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**item, "arguments": "", "status": "in_progress"},
            }
        )
        for piece in _chunks(text, deltas):
            events.append(
                {"type": "response.function_call_arguments.delta", **where, "delta": piece}
            )
        events.append(
            {
                "type": "response.function_call_arguments.done",
                **where,
                "arguments": text,
                "name": item["name"],
            }
        )
    else:
        part = {"type": "output_text", "text": "", "annotations": []}
        where = {**where, "content_index": 0}
        events.append(
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**item, "content": [], "status": "in_progress"},
            }
        )
        events.append({"type": "response.content_part.added", **where, "part": part})
        for piece in _chunks(text, deltas):
            events.append(
                {"type": "response.output_text.delta", **where, "delta": piece, "logprobs": []}
            )
        events.append({"type": "response.output_text.done", **where, "text": text, "logprobs": []})
        events.append({"type": "response.content_part.done", **where, "part": item["content"][0]})
    events.append({"type": "response.output_item.done", "output_index": 0, "item": item})
    events.append({"type": "response.completed", "response": done})
    for number, event in enumerate(events):
        event["sequence_number"] = number
    return events


def sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


class Handlers:
    """The behaviours of `POST /v1/responses`, chosen by the request's `model`."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def stream(
        self,
        call: Call,
        events: list[dict[str, Any]],
        *,
        delay: float = 0.0,
        then: Callable[[], AsyncIterator[str]] | None = None,
    ) -> StreamingResponse:
        recorder = self.recorder

        async def generate() -> AsyncIterator[str]:
            how = "raised"
            try:
                for number, event in enumerate(events):
                    if delay and number:
                        await asyncio.sleep(delay)
                    yield sse(event)
                if then is not None:
                    async for chunk in then():
                        yield chunk
                how = "completed"
            except asyncio.CancelledError:
                how = "cancelled"
                raise
            except GeneratorExit:
                how = "closed"
                raise
            finally:
                recorder.finish(call, how)

        return StreamingResponse(generate(), media_type="text/event-stream")

    async def scripted(self, body: dict[str, Any], call: Call, context: list[Any]) -> Response:
        meta = body.get("metadata") or {}
        item, text = _script(context, int(meta.get("k", 2)))
        events = turn_events(body, item, text, int(meta.get("deltas", 3)))
        delay = float(meta.get("delay", 0))
        if body.get("stream"):
            return self.stream(call, events, delay=delay)
        self.recorder.finish(call, "completed")
        return JSONResponse(events[-1]["response"])

    async def json(self, body: dict[str, Any], call: Call, context: list[Any]) -> Response:
        """Answers with one response object even when asked to stream."""
        item, text = _script(context, 0)
        self.recorder.finish(call, "completed")
        return JSONResponse(turn_events(body, item, text, 1)[-1]["response"])

    async def error_4xx(self, body: dict[str, Any], call: Call, context: list[Any]) -> Response:
        status = int((body.get("metadata") or {}).get("status", 400))
        self.recorder.finish(call, "completed")
        error = {
            "type": "invalid_request_error",
            "code": "handler_says_no",
            "message": "The handler refused this request.",
            "param": "input",
        }
        return JSONResponse({"error": error}, status_code=status)

    async def error_200(self, body: dict[str, Any], call: Call, context: list[Any]) -> Response:
        """An error body with status 200, as some OpenAI-compatible proxies answer."""
        self.recorder.finish(call, "completed")
        error = {"type": "server_error", "code": "upstream_error", "message": "Upstream failed."}
        return JSONResponse({"error": error})

    async def error_500(self, body: dict[str, Any], call: Call, context: list[Any]) -> Response:
        self.recorder.finish(call, "completed")
        return PlainTextResponse("upstream exploded", status_code=500)

    async def raise_before(self, body: dict[str, Any], call: Call, context: list[Any]) -> Response:
        self.recorder.finish(call, "raised")
        raise RuntimeError("the handler fails before answering")

    async def raise_during(self, body: dict[str, Any], call: Call, context: list[Any]) -> Response:
        events = turn_events(body, _script(context, 0)[0], "partial answer", 3)[:5]

        async def boom() -> AsyncIterator[str]:
            raise RuntimeError("the handler fails mid-stream")
            yield ""  # pragma: no cover  (makes this an async generator)

        return self.stream(call, events, then=boom)

    async def no_terminal(self, body: dict[str, Any], call: Call, context: list[Any]) -> Response:
        events = turn_events(body, _script(context, 0)[0], "cut short", 3)[:-1]
        return self.stream(call, events)

    async def failed(self, body: dict[str, Any], call: Call, context: list[Any]) -> Response:
        """Streams a turn that ends in `response.failed`."""
        events = turn_events(body, _script(context, 0)[0], "doomed", 2)
        failed = copy.deepcopy(events[-1])
        failed["type"] = "response.failed"
        failed["response"].update(
            status="failed",
            output=[],
            usage=None,
            error={"code": "server_error", "message": "The model failed."},
        )
        return self.stream(call, [*events[:4], failed])

    async def incomplete(self, body: dict[str, Any], call: Call, context: list[Any]) -> Response:
        """Streams a turn that ends in `response.incomplete` (it keeps its output)."""
        events = turn_events(body, _script(context, 0)[0], "cut", 2)
        events[-1]["type"] = "response.incomplete"
        events[-1]["response"].update(
            status="incomplete", incomplete_details={"reason": "max_output_tokens"}
        )
        return self.stream(call, events)

    async def odd_sse(self, body: dict[str, Any], call: Call, context: list[Any]) -> Response:
        """Legal but unusual SSE: a BOM, comments, CRLF, `id:`/`retry:` lines, multi-line
        `data:`, non-ASCII text, a trailing `[DONE]`, and 7-byte chunks cut anywhere."""
        item = {
            "type": "message",
            "id": "msg_" + uuid.uuid4().hex,
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": ODD_TEXT, "annotations": []}],
        }
        parts = ["\ufeff: a comment line\r\n\r\n", "retry: 1000\r\n\r\n"]
        for number, event in enumerate(turn_events(body, item, ODD_TEXT, 6)):
            data = json.dumps(event, indent=1, ensure_ascii=False).split("\n")
            lines = [f"id: {number}", f"event: {event['type']}", *(f"data: {d}" for d in data)]
            parts.append("\r\n".join(lines) + "\r\n\r\n")
        parts.append("data: [DONE]\r\n\r\n")
        encoded = "".join(parts).encode()
        chunks = [encoded[i : i + 7] for i in range(0, len(encoded), 7)]
        recorder = self.recorder

        async def generate() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk
            recorder.finish(call, "completed")

        return StreamingResponse(generate(), media_type="text/event-stream")

    async def data_only(self, body: dict[str, Any], call: Call, context: list[Any]) -> Response:
        """SSE without `event:` lines: the type is only in the data."""
        item, text = _script(context, int((body.get("metadata") or {}).get("k", 2)))
        events = turn_events(body, item, text, 3)
        recorder = self.recorder

        async def generate() -> AsyncIterator[str]:
            for event in events:
                yield f"data: {json.dumps(event)}\n\n"
            recorder.finish(call, "completed")

        return StreamingResponse(generate(), media_type="text/event-stream")

    async def multi_item(self, body: dict[str, Any], call: Call, context: list[Any]) -> Response:
        """A reasoning item (with encrypted_content) and a message; with `omit_output`, the
        terminal response carries no `output` and only `output_item.done` events hold it."""
        meta = body.get("metadata") or {}
        reasoning = {
            "type": "reasoning",
            "id": "rs_" + uuid.uuid4().hex,
            "summary": [{"type": "summary_text", "text": "Thought about it."}],
            "encrypted_content": "gAAAAB" + uuid.uuid4().hex * 4,
        }
        message, text = _script(context, 0)
        events = turn_events(body, message, text, 2)
        for event in events:
            if "output_index" in event:
                event["output_index"] = 1
        events[-1]["response"]["output"] = [] if meta.get("omit_output") else [reasoning, message]
        reasoning_events = [
            {"type": "response.output_item.added", "output_index": 0, "item": reasoning},
            {"type": "response.output_item.done", "output_index": 0, "item": reasoning},
        ]
        events = [*events[:2], *reasoning_events, *events[2:]]
        for number, event in enumerate(events):
            event["sequence_number"] = number
        return self.stream(call, events)

    async def background(self, body: dict[str, Any], call: Call, context: list[Any]) -> Response:
        """The scripted model, plus 1 s of post-response work in a FastAPI background task
        (accounting, logging): the client already has the whole response by then."""
        meta = body.get("metadata") or {}
        item, text = _script(context, int(meta.get("k", 2)))
        response = self.stream(call, turn_events(body, item, text, 2))
        response.background = BackgroundTask(asyncio.sleep, float(meta.get("work", 1.0)))
        return response

    async def sse_error(self, body: dict[str, Any], call: Call, context: list[Any]) -> Response:
        """Streams a flat SSE `error` event, as the HTTP API does, after the turn started."""
        events = turn_events(body, _script(context, 0)[0], "doomed", 2)[:2]
        error = {
            "type": "error",
            "code": "rate_limit_exceeded",
            "message": "Slow down.",
            "param": None,
            "sequence_number": 2,
        }
        return self.stream(call, [*events, error])

    async def slow(self, body: dict[str, Any], call: Call, context: list[Any]) -> Response:
        """Streams deltas forever, one every 50 ms."""
        item, text = _script(context, 0)
        head = turn_events(body, item, text, 1)[:4]

        async def forever() -> AsyncIterator[str]:
            for number in range(len(head), 10**9):
                await asyncio.sleep(0.05)
                yield sse(
                    {
                        "type": "response.output_text.delta",
                        "item_id": item["id"],
                        "output_index": 0,
                        "content_index": 0,
                        "delta": ".",
                        "logprobs": [],
                        "sequence_number": number,
                    }
                )

        return self.stream(call, head, then=forever)


HANDLER_NAMES = {
    "scripted": "scripted",
    "json": "json",
    "error-4xx": "error_4xx",
    "error-500": "error_500",
    "error-200": "error_200",
    "raise-before": "raise_before",
    "raise-during": "raise_during",
    "no-terminal": "no_terminal",
    "slow": "slow",
    "failed": "failed",
    "incomplete": "incomplete",
    "odd-sse": "odd_sse",
    "multi-item": "multi_item",
    "background": "background",
    "data-only": "data_only",
    "sse-error": "sse_error",
}


def _snapshot(current: ws_mode.Turn) -> dict[str, Any]:
    previous = current.previous
    return copy.deepcopy(
        {
            "previous_id": previous.id if previous is not None else None,
            "previous_artifacts": dict(previous.artifacts) if previous is not None else None,
            "new_input": current.new_input,
            "history": current.history(),
            "tools_changed": current.tools_changed,
            "stream_id": current.stream_id,
        }
    )


@dataclass
class IntegrationApp:
    asgi: ASGIApp
    api: FastAPI
    recorder: Recorder


def create_app(*, inner_middleware: bool = False) -> IntegrationApp:
    """The app; with `inner_middleware`, a GZip and a `@app.middleware("http")` middleware
    sit between ws_mode and the routes, as in many real FastAPI apps."""
    recorder = Recorder()
    handlers = Handlers(recorder)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        yield {"started_by": "lifespan"}

    api = FastAPI(lifespan=lifespan)

    @api.post("/v1/responses")
    async def responses(request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw)
        meta = body.get("metadata") or {}
        current = ws_mode.turn(request)
        snapshot = None
        if current is not None:
            snapshot = _snapshot(current)
            previous = current.previous
            turn_no = (previous.artifacts.get("turn_no", 0) if previous is not None else 0) + 1
            current.artifacts["turn_no"] = turn_no
            current.artifacts["tag"] = meta.get("tag", "")
        # A cache-aware handler builds on the Turn when it got only the new items.
        if current is not None and "previous_response_id" in body:
            context = current.history()
        else:
            context = as_items(body.get("input"))
        model = body.get("model") or "scripted"
        call = Call(
            tag=str(meta.get("tag", "")),
            model=model,
            body=copy.deepcopy(body),
            headers=[(key, value) for key, value in request.headers.items()],
            turn=snapshot,
            lifespan_state=getattr(request.state, "started_by", None),
            body_length=len(raw),
            path=request.scope["path"],
            root_path=request.scope.get("root_path", ""),
        )
        recorder.add(call)
        handler = getattr(handlers, HANDLER_NAMES.get(model, "scripted"))
        response: Response = await handler(body, call, context)
        return response

    @api.get("/debug/tasks")
    async def tasks() -> dict[str, Any]:
        """The tasks of the server's event loop (this request's own included)."""
        found = []
        for task in asyncio.all_tasks():
            coro = task.get_coro()
            code = getattr(coro, "cr_code", None)
            found.append(
                {
                    "name": getattr(coro, "__qualname__", repr(coro)),
                    "file": code.co_filename if code is not None else "",
                }
            )
        return {"count": len(found), "tasks": found}

    @api.websocket("/ws/echo")
    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        text = await websocket.receive_text()
        await websocket.send_text("echo: " + text)
        await websocket.close()

    if inner_middleware:
        api.add_middleware(GZipMiddleware, minimum_size=10)

        @api.middleware("http")
        async def seen(request: Request, call_next: Any) -> Any:
            recorder.middleware_seen.append(request.url.path)
            response = await call_next(request)
            response.headers["x-inner"] = "1"
            return response

    api.add_middleware(WebSocketModeMiddleware)
    app: ASGIApp = api
    for prefix, settings in MOUNTS.items():
        app = WebSocketModeMiddleware(
            app, path=prefix + "/v1/responses", handler_path="/v1/responses", **settings
        )
    return IntegrationApp(asgi=app, api=api, recorder=recorder)
