"""Recipe: a handler that renders a chat template and tokenizes, made cache-aware.

A stateless server renders the whole history through its chat template and tokenizes it on every
request: O(history) per turn, so O(turns²) per conversation. Behind the middleware with
`renderer=` and `full_context="on_miss"`, each item is rendered and tokenized once, when it
arrives (the client's new input, before the handler runs) or after it was produced (the model's
output, while the client runs its tools); the handler finds the whole context's tokens on the
Turn and hands them to the model. Over plain HTTP the same handler renders the whole input, as
before; the tokens, and so the answers, are the same.

The renderer must work item by item: rendering `a + b` gives rendering `a` then rendering `b`.
Chat templates that do so put everything that depends on position (the system prompt, the
generation prompt) outside the items: here the handler adds them around the items' tokens.

Run (needs `pip install tokenizers`, or the `cli` extra, for the stand-in tokenizer):

    uvicorn examples.cache_aware_tokens:app --ws ws_mode.server:BatchingWebSocketProtocol \\
        --ws-max-size 68157440
"""

from __future__ import annotations

import json
import zlib
from array import array
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from examples.fastapi_app import answer
from ws_mode import WebSocketModeMiddleware
from ws_mode.fastapi import CurrentTurn

Item = dict[str, Any]
Tokenize = Callable[[str], list[int]]


class ChatTemplate:
    """A ChatML-style chat template over a tokenizer's `encode`, one item at a time."""

    def __init__(self, tokenize: Tokenize) -> None:
        self.tokenize = tokenize

    def item_text(self, item: Item) -> str:
        """The template's text of one item."""
        kind = item.get("type", "message")
        if kind == "message":
            content = item.get("content")
            if isinstance(content, list):
                content = "\n".join(str(part.get("text", "")) for part in content)
            return f"<|im_start|>{item.get('role')}\n{content}<|im_end|>\n"
        if kind == "function_call":
            call = json.dumps({"name": item.get("name"), "arguments": item.get("arguments")})
            return f"<|im_start|>assistant\n<tool_call>{call}</tool_call><|im_end|>\n"
        if kind == "function_call_output":
            return f"<|im_start|>tool\n{item.get('output')}<|im_end|>\n"
        return f"<|im_start|>{kind}\n{json.dumps(item, sort_keys=True)}<|im_end|>\n"

    def render(self, items: list[Item]) -> list[int]:
        """The token ids of `items`: the middleware's `renderer=`."""
        return [token for item in items for token in self.tokenize(self.item_text(item))]

    def prompt(self, instructions: str | None, items_tokens: Sequence[int]) -> list[int]:
        """The model's whole prompt: the system prompt, the items, the generation prompt."""
        system = self.tokenize(f"<|im_start|>system\n{instructions}<|im_end|>\n")
        return [*(system if instructions else ()), *items_tokens, *self.tokenize(GENERATE)]


GENERATE = "<|im_start|>assistant\n"


def generate(prompt: Sequence[int]) -> str:
    """Stands in for the model: a deterministic answer that depends on every prompt token."""
    checksum = zlib.crc32(array("I", prompt).tobytes())
    return f"I read {len(prompt)} tokens (checksum {checksum:08x})."


def input_items(body: dict[str, Any]) -> list[Item]:
    """`input` as a list of items (a string is one user message)."""
    raw = body.get("input") or []
    return [{"role": "user", "content": raw}] if isinstance(raw, str) else list(raw)


def stand_in_tokenizer() -> Tokenize:
    """The reference server's BPE: replace it with yours (`AutoTokenizer...encode`)."""
    from ws_mode.toolkit.reference import ReferenceTokenizer

    return ReferenceTokenizer().encode


def create_app(tokenize: Tokenize | None = None) -> FastAPI:
    """The app, with `tokenize` (text to token ids) under its chat template."""
    template = ChatTemplate(tokenize or stand_in_tokenizer())
    app = FastAPI()
    # Each item rendered once; the Turn carries the prefix's tokens and the new input's.
    app.add_middleware(WebSocketModeMiddleware, full_context="on_miss", renderer=template.render)

    @app.post("/v1/responses")
    async def create(request: Request, current: CurrentTurn) -> Response:
        body = await request.json()
        tokens = current.tokens() if current is not None else None
        if tokens is None:  # plain HTTP: `input` is the whole history; render all of it
            if body.get("previous_response_id"):
                message = "This server stores no responses: send the whole history."
                error = {"type": "invalid_request_error", "code": None, "message": message}
                return JSONResponse({"error": {**error, "param": "previous_response_id"}}, 400)
            tokens = template.render(input_items(body))
        # A socket turn rendered nothing here: `tokens` came from the middleware's cache.
        prompt = template.prompt(body.get("instructions"), tokens)
        return answer(body, generate(prompt))

    return app


app = create_app()
