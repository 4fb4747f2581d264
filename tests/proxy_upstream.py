"""Upstream servers for the proxy tests, run in their own process.

    python -m tests.proxy_upstream --app storing --port 8123 --key sk-test
    python -m tests.proxy_upstream --app reference --port 8124

`storing` is a tiny Responses server that keeps every response by id and resolves
`previous_response_id` itself (like OpenAI with `store: true`), requires `Authorization:
Bearer <key>` on `/v1/*`, and serves `GET /v1/responses/{id}` and `GET /v1/models`. Its model is
scripted by the request's `metadata` (all strings):

- `tool_calls`: how many function calls to ask for (counted since the last user message)
  before answering; the answer is `items=<context length> last=<last user text>`.
- `gap`: seconds to sleep before each streamed event after the first.
- `delay`: seconds to sleep before answering at all.
- `break_after`: end the SSE stream abruptly (no terminal event) after this many events.

`/debug/*` needs no key: `requests` lists what arrived (method, path, query, headers, body),
`aborted` the ids of streams cut short by a client that left, `gzip` answers gzip-compressed
whatever was asked, `echo` answers with the length and digest of the body it got.
`reference` is `ws_mode.toolkit.reference.create_app()`, stateless.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "storing-model"


def _error(status: int, message: str, code: str | None, param: str | None = None) -> Response:
    body = {
        "error": {"type": "invalid_request_error", "code": code, "message": message, "param": param}
    }
    return JSONResponse(body, status_code=status)


def _items(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    return [item for item in raw if isinstance(item, dict)]


def _user_text(item: dict[str, Any]) -> str | None:
    if item.get("role") != "user":
        return None
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict)).strip()
    return None


def _script(context: list[dict[str, Any]], body: dict[str, Any]) -> list[dict[str, Any]]:
    """The model: function calls while `tool_calls` asks for more, then a text answer."""
    metadata = body.get("metadata") or {}
    wanted = int(metadata.get("tool_calls", "0"))
    last_user = max(
        (i for i, item in enumerate(context) if _user_text(item) is not None), default=-1
    )
    outputs = sum(
        1 for item in context[last_user + 1 :] if item.get("type") == "function_call_output"
    )
    tools = [tool for tool in body.get("tools") or [] if tool.get("type") == "function"]
    if tools and outputs < wanted:
        return [
            {
                "type": "function_call",
                "id": "fc_" + secrets.token_hex(8),
                "call_id": "call_" + secrets.token_hex(8),
                "name": tools[0]["name"],
                "arguments": orjson.dumps({"n": outputs}).decode(),
                "status": "completed",
            }
        ]
    last = _user_text(context[last_user]) if last_user >= 0 else None
    text = f"items={len(context)} last={last}"
    return [
        {
            "type": "message",
            "id": "msg_" + secrets.token_hex(8),
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    ]


def _events(pending: dict[str, Any], completed: dict[str, Any]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": pending},
        {"type": "response.in_progress", "response": pending},
    ]
    for index, item in enumerate(completed["output"]):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            started = {**item, "status": "in_progress", "content": []}
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events.append(
                {"type": "response.output_item.added", "output_index": index, "item": started}
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append({"type": "response.content_part.added", **where, "part": part})
            for word in text.split(" "):
                events.append(
                    {
                        "type": "response.output_text.delta",
                        **where,
                        "delta": word + " ",
                        "logprobs": [],
                    }
                )
            events.append(
                {"type": "response.output_text.done", **where, "text": text, "logprobs": []}
            )
            events.append(
                {"type": "response.content_part.done", **where, "part": item["content"][0]}
            )
        else:
            started = {**item, "status": "in_progress", "arguments": ""}
            events.append(
                {"type": "response.output_item.added", "output_index": index, "item": started}
            )
            where = {"item_id": item["id"], "output_index": index}
            events.append(
                {
                    "type": "response.function_call_arguments.delta",
                    **where,
                    "delta": item["arguments"],
                }
            )
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    **where,
                    "arguments": item["arguments"],
                }
            )
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": completed})
    for number, event in enumerate(events):
        event["sequence_number"] = number
    return events


def create_storing_app(key: str | None) -> Starlette:
    """The storing upstream (see the module's docstring)."""
    stored: dict[str, dict[str, Any]] = {}  # id -> {"response": ..., "context": [...]}
    requests: list[dict[str, Any]] = []
    aborted: list[str] = []

    def authorized(request: Request) -> bool:
        return key is None or request.headers.get("authorization") == f"Bearer {key}"

    async def record(request: Request) -> bytes:
        raw = await request.body()
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = None
        requests.append(
            {
                "method": request.method,
                "path": request.url.path,
                "query": request.url.query,
                "headers": [[k, v] for k, v in request.headers.items()],
                "body": body,
            }
        )
        return raw

    def unauthorized() -> Response:
        return _error(401, "Incorrect API key provided.", "invalid_api_key")

    async def create(request: Request) -> Response:
        raw = await record(request)
        if not authorized(request):
            return unauthorized()
        body = orjson.loads(raw)
        previous_id = body.get("previous_response_id")
        context: list[dict[str, Any]] = []
        if previous_id is not None:
            parent = stored.get(previous_id)
            if parent is None or parent["response"]["status"] != "completed":
                return _error(
                    400,
                    f"Previous response with id '{previous_id}' not found.",
                    "previous_response_not_found",
                    "previous_response_id",
                )
            context = [*parent["context"], *parent["response"]["output"]]
        context = [*context, *_items(body.get("input"))]
        metadata = body.get("metadata") or {}
        if "delay" in metadata:
            await asyncio.sleep(float(metadata["delay"]))
        response_id = "resp_" + secrets.token_hex(12)
        base = {
            "id": response_id,
            "object": "response",
            "created_at": int(time.time()),
            "model": body.get("model") or MODEL,
            "previous_response_id": previous_id,
            "instructions": body.get("instructions"),
            "tools": body.get("tools") or [],
            "tool_choice": body.get("tool_choice", "auto"),
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "store": body.get("store", True),
            "metadata": metadata,
            "error": None,
            "incomplete_details": None,
            "text": {"format": {"type": "text"}},
        }
        output = _script(context, body)
        usage = {"input_tokens": len(context), "output_tokens": 1, "total_tokens": len(context) + 1}
        pending = {**base, "status": "in_progress", "output": [], "usage": None}
        completed = {**base, "status": "completed", "output": output, "usage": usage}
        if not body.get("stream"):
            stored[response_id] = {"response": completed, "context": context}
            return JSONResponse(completed)
        stored[response_id] = {"response": pending, "context": context}
        gap = float(metadata.get("gap", "0"))
        cut = int(metadata["break_after"]) if "break_after" in metadata else None

        async def stream() -> AsyncIterator[bytes]:
            finished = False
            try:
                for number, event in enumerate(_events(pending, completed)):
                    if cut is not None and number == cut:
                        raise RuntimeError("break_after: the upstream dies mid-stream")
                    if number and gap:
                        await asyncio.sleep(gap)
                    if event["type"] == "response.completed":
                        stored[response_id]["response"] = completed
                    data = orjson.dumps(event)
                    yield b"event: " + event["type"].encode() + b"\ndata: " + data + b"\n\n"
                finished = True
            finally:
                if not finished and cut is None:
                    aborted.append(response_id)

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def retrieve(request: Request) -> Response:
        await record(request)
        if not authorized(request):
            return unauthorized()
        found = stored.get(request.path_params["response_id"])
        if found is None:
            response_id = request.path_params["response_id"]
            return _error(404, f"No response found with id '{response_id}'.", None)
        return JSONResponse(found["response"])

    async def models(request: Request) -> Response:
        await record(request)
        if not authorized(request):
            return unauthorized()
        model = {"id": MODEL, "object": "model", "created": 0, "owned_by": "tests"}
        return JSONResponse({"object": "list", "data": [model]})

    async def debug_requests(request: Request) -> Response:
        return JSONResponse(requests)

    async def debug_aborted(request: Request) -> Response:
        return JSONResponse(aborted)

    async def debug_gzip(request: Request) -> Response:
        await record(request)
        body = gzip.compress(orjson.dumps({"compressed": True, "text": "x" * 1000}))
        return Response(body, media_type="application/json", headers={"content-encoding": "gzip"})

    async def debug_echo(request: Request) -> Response:
        raw = await request.body()
        return JSONResponse(
            {
                "length": len(raw),
                "sha256": hashlib.sha256(raw).hexdigest(),
                "transfer_encoding": request.headers.get("transfer-encoding"),
                "content_length": request.headers.get("content-length"),
            }
        )

    return Starlette(
        routes=[
            Route("/v1/responses", create, methods=["POST"]),
            Route("/v1/responses/{response_id}", retrieve, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/debug/requests", debug_requests, methods=["GET"]),
            Route("/debug/aborted", debug_aborted, methods=["GET"]),
            Route("/debug/gzip", debug_gzip, methods=["GET"]),
            Route("/debug/echo", debug_echo, methods=["POST"]),
        ]
    )


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--app", choices=("storing", "reference"), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key")
    args = parser.parse_args()
    if args.app == "storing":
        app: Any = create_storing_app(args.key)
    else:
        from ws_mode.toolkit.reference import create_app

        app = create_app()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
