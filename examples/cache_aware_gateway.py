"""Recipe: a gateway that checks the client's input, then calls a hosted model, made cache-aware.

A stateless gateway moderates (or validates, or scans for secrets) every item of `input` on every
request, then forwards the request to a hosted model: O(history) checks per turn, though all but
the new items passed last turn. Behind the middleware with `full_context="on_miss"`, a
continuation reaches the handler with only its new items: the gateway checks those, and sends
the hosted model the whole history (`turn.history()`), which a stateless upstream needs. Over
plain HTTP it checks everything, as before.

One subtlety: a `generate: false` warm-up is answered by the middleware without calling the
handler, so its input was never checked. The handler marks each response it checked (in
`turn.artifacts`) and also checks the input of the unmarked responses before this turn.

Run (needs `pip install httpx`):

    UPSTREAM_URL=https://api.openai.com/v1 UPSTREAM_API_KEY=sk-... \\
        uvicorn examples.cache_aware_gateway:app \\
        --ws ws_mode.server:BatchingWebSocketProtocol --ws-max-size 68157440
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from ws_mode import Turn, WebSocketModeMiddleware
from ws_mode.fastapi import CurrentTurn

Item = dict[str, Any]
#: Checks items; returns why they are refused, or None when they pass.
Moderator = Callable[[list[Item]], Awaitable[str | None]]
CHECKED = "gateway.checked"  # the artifact that marks a response whose input was checked
BLOCKED = ("rm -rf /", "DROP TABLE")


async def keyword_moderator(items: list[Item]) -> str | None:
    """Stands in for a moderation call (a classifier, a hosted moderation endpoint)."""
    for item in items:
        text = item.get("content") or item.get("output") or ""
        if isinstance(text, list):  # content parts
            text = " ".join(str(part.get("text", "")) for part in text)
        for phrase in BLOCKED:
            if phrase in text:
                return f"the input contains {phrase!r}"
    return None


def unchecked(current: Turn) -> list[Item]:
    """The input items of this turn no earlier turn checked: the new input, after the input of
    the responses before it that the handler never saw (warm-ups, responses from a store)."""
    skipped = []
    node = current.previous
    while node is not None and not node.artifacts.get(CHECKED):
        skipped.append(node)
        node = node.parent
    return [item for node in reversed(skipped) for item in node.input_items] + current.new_input


def refusal(reason: str) -> JSONResponse:
    """A 400 with OpenAI's error body; over the socket the client gets it as an error event."""
    error = {"type": "invalid_request_error", "code": "content_policy_violation", "param": "input"}
    return JSONResponse({"error": {**error, "message": f"Refused: {reason}."}}, 400)


def as_items(raw: str | Iterable[Item] | None) -> list[Item]:
    """`input` as a list of items (a string is one user message)."""
    return [{"role": "user", "content": raw}] if isinstance(raw, str) else list(raw or [])


def create_app(
    upstream: str, *, api_key: str | None = None, moderate: Moderator = keyword_moderator
) -> FastAPI:
    """The gateway to the Responses API at `upstream` (a base URL ending in `/v1`)."""
    clients: list[httpx.AsyncClient] = []

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        async with httpx.AsyncClient(base_url=upstream, headers=headers, timeout=600) as client:
            clients.append(client)
            yield

    app = FastAPI(lifespan=lifespan)
    app.add_middleware(WebSocketModeMiddleware, full_context="on_miss")

    @app.post("/v1/responses")
    async def create(request: Request, current: CurrentTurn) -> Response:
        body = await request.json()
        if current is None or current.full_context:
            # Plain HTTP, or a fresh conversation: `input` is all the upstream will see.
            reason = await moderate(as_items(body.get("input")))
        else:
            # A cached parent: only the new items came, and only they need checking. The
            # hosted model, stateless, gets the whole history and no id it could not know.
            reason = await moderate(unchecked(current))
            body["input"] = current.history()
            del body["previous_response_id"]
        if reason is not None:
            return refusal(reason)
        if current is not None and current.cache_aware:
            current.artifacts[CHECKED] = True  # the next turn checks only what comes after
        client = clients[0]
        reply = await client.send(client.build_request("POST", "responses", json=body), stream=True)
        return StreamingResponse(
            reply.aiter_bytes(),
            reply.status_code,
            media_type=reply.headers.get("content-type"),
            background=BackgroundTask(reply.aclose),
        )

    return app


app = create_app(
    os.environ.get("UPSTREAM_URL", "http://127.0.0.1:8001/v1"),
    api_key=os.environ.get("UPSTREAM_API_KEY"),
)
