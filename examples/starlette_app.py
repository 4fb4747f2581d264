"""A Starlette Responses server (no FastAPI) that gains WebSocket mode from its middleware list.

The handler is an ordinary, stateless `POST /v1/responses`: it reads the whole context from
`input`, streams Server-Sent Events when the body says `stream: true` and answers one JSON
response object otherwise. It knows nothing of sockets. A small scripted "model", loaded in the
lifespan, calls the first function tool the request offers, then answers in text.

Run:   uvicorn examples.starlette_app:app --ws ws_mode.server:BatchingWebSocketProtocol \\
           --ws-max-size 68157440
Try:   python examples/client_sdk.py --base-url http://127.0.0.1:8000/v1 "What time is it?"

Set EXAMPLE_API_KEY to make the handler require `Authorization: Bearer <key>`; over the socket
the handshake's headers reach the handler on every turn, so the same check guards both.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ws_mode import WebSocketModeMiddleware

Item = dict[str, Any]


class ScriptedModel:
    """Stands in for a real model: it calls a tool once per user message, then answers."""

    def __init__(self, name: str = "scripted-1") -> None:
        self.name = name

    def reply(self, items: list[Item], tools: list[Item]) -> list[Item]:
        """The output items for this context."""
        since_user: list[Item] = []
        question = ""
        for item in items:
            if item.get("type", "message") == "message" and item.get("role") == "user":
                since_user, question = [], text_of(item)
            else:
                since_user.append(item)
        outputs = [
            item["output"] for item in since_user if item.get("type") == "function_call_output"
        ]
        functions = [tool for tool in tools if tool.get("type") == "function"]
        if functions and not outputs:
            return [
                {
                    "type": "function_call",
                    "id": "fc_" + secrets.token_hex(12),
                    "call_id": "call_" + secrets.token_hex(12),
                    "name": functions[0]["name"],
                    "arguments": json.dumps({"question": question}),
                    "status": "completed",
                }
            ]
        answer = f"You asked {question!r}"
        if outputs:
            answer += f" and the tool said {outputs[-1]!r}"
        answer += f"; I saw {len(items)} items of context."
        return [
            {
                "type": "message",
                "id": "msg_" + secrets.token_hex(12),
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": answer, "annotations": []}],
            }
        ]


def text_of(item: Item) -> str:
    """The text of a message item, whether its content is a string or a list of parts."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict)
        ).strip()
    return ""


def error(status: int, message: str, param: str | None = None) -> JSONResponse:
    """An OpenAI error body; over the socket it becomes an `error` event with this status."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"type": kind, "code": None, "message": message, "param": param}}
    return JSONResponse(body, status_code=status)


def response_object(body: dict[str, Any], output: list[Item], model: str) -> dict[str, Any]:
    """A finished response object for `body`, as `POST /v1/responses` returns it."""
    words = sum(len(text_of(item).split()) for item in output if item["type"] == "message")
    return {
        "id": "resp_" + secrets.token_hex(16),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": body.get("model") or model,
        "output": output,
        "previous_response_id": None,  # a stateless handler never has one
        "instructions": body.get("instructions"),
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice", "auto"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "store": False,
        "metadata": body.get("metadata") or {},
        "usage": {
            "input_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": words,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": words,
        },
        "error": None,
        "incomplete_details": None,
    }


def events(response: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The streaming events of a finished response: lifecycle, items, text deltas."""
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    yield {"type": "response.created", "response": started}
    yield {"type": "response.in_progress", "response": started}
    for index, item in enumerate(response["output"]):
        where: dict[str, Any] = {"output_index": index, "item_id": item["id"]}
        if item["type"] == "function_call":
            yield {
                "type": "response.output_item.added",
                "output_index": index,
                "item": {**item, "arguments": "", "status": "in_progress"},
            }
            yield {
                "type": "response.function_call_arguments.delta",
                **where,
                "delta": item["arguments"],
            }
            yield {
                "type": "response.function_call_arguments.done",
                **where,
                "name": item["name"],
                "arguments": item["arguments"],
            }
        else:
            text = text_of(item)
            part = {"type": "output_text", "text": "", "annotations": []}
            where["content_index"] = 0
            yield {
                "type": "response.output_item.added",
                "output_index": index,
                "item": {**item, "content": [], "status": "in_progress"},
            }
            yield {"type": "response.content_part.added", **where, "part": part}
            for number, word in enumerate(text.split(" ")):
                delta = word if number == 0 else " " + word
                yield {
                    "type": "response.output_text.delta",
                    **where,
                    "delta": delta,
                    "logprobs": [],
                }
            yield {"type": "response.output_text.done", **where, "text": text, "logprobs": []}
            yield {"type": "response.content_part.done", **where, "part": {**part, "text": text}}
        yield {"type": "response.output_item.done", "output_index": index, "item": item}
    yield {"type": "response.completed", "response": response}


async def sse(response: dict[str, Any]) -> AsyncIterator[str]:
    """Server-Sent Events: `event: <type>` and `data: <json>`, numbered from 0, no [DONE]."""
    for number, event in enumerate(events(response)):
        event["sequence_number"] = number
        yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


def authorized(request: Request, api_key: str | None) -> bool:
    return api_key is None or request.headers.get("authorization") == f"Bearer {api_key}"


async def create_response(request: Request, api_key: str | None = None) -> Response:
    if not authorized(request, api_key):
        return error(401, "Incorrect API key provided.")
    try:
        body = await request.json()
    except ValueError:
        return error(400, "The body is not valid JSON.")
    if not isinstance(body, dict):
        return error(400, "The body must be a JSON object.")
    raw_input = body.get("input", [])
    if isinstance(raw_input, str):
        raw_input = [{"type": "message", "role": "user", "content": raw_input}]
    if not isinstance(raw_input, list) or not all(isinstance(item, dict) for item in raw_input):
        return error(400, "'input' must be a string or an array of items.", "input")
    if body.get("previous_response_id") is not None:
        # Stateless: HTTP clients send the whole context. On the socket, ws_mode resolves the
        # id from its cache and calls this handler with the whole context instead.
        message = "This server stores no responses: send the whole context in 'input'."
        return error(400, message, "previous_response_id")
    calls = {item.get("call_id") for item in raw_input if item.get("type") == "function_call"}
    for item in raw_input:  # as OpenAI's API: an output must answer a call of this context
        if item.get("type") == "function_call_output" and item.get("call_id") not in calls:
            call_id = item.get("call_id")
            message = f"No tool call found for function call output with call_id {call_id}."
            return error(400, message, "input")
    tools = body.get("tools") or []
    # Lifespan state reaches socket turns too: ws_mode copies the socket scope's `state`.
    # Servers without lifespan support (daphne) never fill it: fall back to a fresh model.
    model: ScriptedModel | None = getattr(request.state, "model", None)
    if model is None:
        model = ScriptedModel(name="scripted-1-without-lifespan")
    response = response_object(body, model.reply(raw_input, tools), model.name)
    if body.get("stream"):
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy buffering
        return StreamingResponse(sse(response), media_type="text/event-stream", headers=headers)
    return JSONResponse(response)


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
    yield {"model": ScriptedModel()}  # load the model once; handlers find it on request.state


def create_app(api_key: str | None = None) -> Starlette:
    """The app; with `api_key`, every call must carry `Authorization: Bearer <api_key>`."""

    async def endpoint(request: Request) -> Response:
        return await create_response(request, api_key)

    return Starlette(
        routes=[Route("/v1/responses", endpoint, methods=["POST"])],
        # The socket at /v1/responses; plain HTTP and everything else pass through untouched.
        middleware=[Middleware(WebSocketModeMiddleware)],
        lifespan=lifespan,
    )


app = create_app(api_key=os.environ.get("EXAMPLE_API_KEY"))
