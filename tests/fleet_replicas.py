"""Simulated inference replicas for the fleet tests: each a small Starlette app answering
`POST /v1/responses` (JSON or SSE) with a real block-hash prefix cache, as vLLM keeps one.

A request's `instructions` and `input` items are rendered to tokens (`render`: a role and its
text per item, so the items a client sends back render as the replica produced them), cut in
blocks of `BLOCK_TOKENS`; each block is named by a hash chained over every block before it. The
leading blocks already in the replica's cache are its `cached_tokens`; the prompt's blocks and
those of the prompt followed by the answer are then cached (least recently used out past
`max_blocks`). The usage it reports is honest: `input_tokens` the prompt's tokens,
`input_tokens_details.cached_tokens` what its cache held. It also answers what vllm-router asks
of a worker (`GET /health`, `/v1/models`, `/get_server_info`, `/get_model_info`).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

#: Tokens per cached block (vLLM's default block size).
BLOCK_TOKENS = 16
MODEL = "replica-model"


def render(instructions: object, items: list[dict[str, Any]]) -> list[str]:
    """The tokens of a prompt: the instructions, then each message's role and words."""
    tokens: list[str] = []
    if isinstance(instructions, str):
        tokens += ["<system>", *instructions.split()]
    for item in items:
        role = item.get("role", item.get("type", "item"))
        content = item.get("content", "")
        if isinstance(content, list):
            text = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        else:
            text = str(content)
        tokens += [f"<{role}>", *text.split()]
    return tokens


def block_hashes(tokens: list[str]) -> list[bytes]:
    """The chained hash of each full block of `tokens`."""
    hashes: list[bytes] = []
    previous = b""
    for start in range(0, len(tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        block = "\0".join(tokens[start : start + BLOCK_TOKENS]).encode()
        previous = hashlib.blake2b(previous + block, digest_size=16).digest()
        hashes.append(previous)
    return hashes


@dataclass
class Replica:
    """One replica's prefix cache and what it served."""

    name: str
    max_blocks: int = 100_000
    blocks: OrderedDict[bytes, None] = field(default_factory=OrderedDict)
    #: Each request served: its input tokens and how many of them were cached.
    served: list[tuple[int, int]] = field(default_factory=list)

    def prefill(self, tokens: list[str]) -> int:
        """How many leading tokens of `tokens` the cache holds (whole blocks)."""
        cached = 0
        for digest in block_hashes(tokens):
            if digest not in self.blocks:
                break
            self.blocks.move_to_end(digest)
            cached += BLOCK_TOKENS
        return cached

    def keep(self, tokens: list[str]) -> None:
        for digest in block_hashes(tokens):
            self.blocks[digest] = None
            self.blocks.move_to_end(digest)
        while len(self.blocks) > self.max_blocks:
            self.blocks.popitem(last=False)

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        items = body.get("input", [])
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        prompt = render(body.get("instructions"), items)
        cached = self.prefill(prompt)
        words = " ".join(f"w{n}-{secrets.token_hex(2)}" for n in range(24))
        text = f"{self.name} says {words}"
        message = {
            "type": "message",
            "id": "msg_" + secrets.token_hex(8),
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        self.keep(prompt)
        self.keep(prompt + render(None, [message]))
        self.served.append((len(prompt), cached))
        return {
            "id": "resp_" + secrets.token_hex(12),
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": body.get("model") or MODEL,
            "output": [message],
            "usage": {
                "input_tokens": len(prompt),
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": 26,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": len(prompt) + 26,
            },
        }


def _events(response: dict[str, Any]) -> Iterator[bytes]:
    started = {**response, "status": "in_progress", "output": []}
    events = [
        {"type": "response.created", "response": started},
        {"type": "response.completed", "response": response},
    ]
    for number, event in enumerate(events):
        event["sequence_number"] = number
        yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def replica_app(replica: Replica) -> Starlette:
    """The app of one replica."""

    async def responses(request: Request) -> Response:
        body = await request.json()
        response = replica.answer(body)
        if body.get("stream"):
            return StreamingResponse(_events(response), media_type="text/event-stream")
        return JSONResponse(response)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(request: Request) -> Response:
        model = {"id": MODEL, "object": "model", "owned_by": replica.name}
        return JSONResponse({"object": "list", "data": [model]})

    async def info(request: Request) -> Response:
        return JSONResponse({"model_path": MODEL, "served_model_name": MODEL})

    return Starlette(
        routes=[
            Route("/v1/responses", responses, methods=["POST"]),
            Route("/health", health),
            Route("/v1/models", models),
            Route("/get_server_info", info),
            Route("/get_model_info", info),
        ]
    )
