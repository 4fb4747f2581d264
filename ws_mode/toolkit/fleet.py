"""A simulated inference replica with a prefix cache: what a fleet's router sends turns to.

Each replica is a small Starlette app answering ``POST /v1/responses`` (JSON, or SSE with
``stream``) with a real block-hash prefix cache, as vLLM keeps one. A request's
``instructions`` and ``input`` items are rendered to tokens (:func:`render`: a role and its
words per item, so the items a client sends back render as the replica produced them), cut in
blocks of :data:`BLOCK_TOKENS`; each block is named by a hash chained over every block before it
(:func:`block_hashes`). The leading blocks already in the replica's cache are its
``cached_tokens``; the prompt's blocks and those of the prompt followed by the answer are then
cached (least recently used out past ``max_blocks``). The usage it reports is honest:
``input_tokens`` the prompt's tokens, ``input_tokens_details.cached_tokens`` what its cache held.

Prefill is modelled: before its first output (the first ``response.output_text.delta`` of a
stream, the body of a JSON answer) a replica waits ``prefill_seconds_per_token`` for each
uncached token, so time to first token shows what the cache saved. A replica prefills at that
rate in all, as a GPU's compute is shared by the requests it batches: prefills queue, one after
another (first come, first served), so prefill work one request could have skipped delays the
others too. It also answers what the
routers ask of a worker (``GET /health``, ``/health_generate``, ``/v1/models``,
``/get_server_info``, ``/get_model_info``).

:func:`replica_app` builds one replica's app (served in a thread by the test suite);
``python -m ws_mode.toolkit.fleet --name NAME --fd N`` serves one in a child process of
:func:`~ws_mode.testing._loopback.server_process` (the lab's fleet benchmark), with
``GET /fleet/served`` answering what it served.

:func:`router` runs a real router in front of replicas, each routing by a request header when it
has one: vLLM's (``vllm-router --policy consistent_hash``, the header ``x-session-id``; without it
the whole request is hashed) and SGLang's (``smg launch --policy manual``, the header
``x-smg-routing-key``; without it a worker at random). Both install from PyPI
(``vllm-router``, ``sglang-router``); :func:`router_binary` finds them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ws_mode.testing._loopback import HOST, add_child_arguments, serve_inherited, stop_process

#: Tokens per cached block (vLLM's default block size).
BLOCK_TOKENS: Final = 16
#: The model every replica serves.
MODEL: Final = "replica-model"
#: Words of each answer (after the replica's name and "says").
ANSWER_WORDS: Final = 24


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
    """The chained hash of each full block of ``tokens``."""
    hashes: list[bytes] = []
    previous = b""
    for start in range(0, len(tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        block = "\0".join(tokens[start : start + BLOCK_TOKENS]).encode()
        previous = hashlib.blake2b(previous + block, digest_size=16).digest()
        hashes.append(previous)
    return hashes


@dataclass
class Replica:
    """One replica: its prefix cache, its modelled prefill time and what it served."""

    name: str
    #: Seconds of prefill per uncached prompt token, waited before the first output.
    prefill_seconds_per_token: float = 0.0
    max_blocks: int = 100_000
    blocks: OrderedDict[bytes, None] = field(default_factory=OrderedDict)
    #: Each request served: its input tokens and how many of them were cached.
    served: list[tuple[int, int]] = field(default_factory=list)
    #: Held while a request's prefill runs: one at a time.
    prefilling: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def prefill(self, seconds: float) -> None:
        """Wait ``seconds`` of prefill, after the prefills queued before it."""
        if seconds > 0:
            async with self.prefilling:
                await asyncio.sleep(seconds)

    def cached_prefix(self, tokens: list[str]) -> int:
        """How many leading tokens of ``tokens`` the cache holds (whole blocks)."""
        cached = 0
        for digest in block_hashes(tokens):
            if digest not in self.blocks:
                break
            self.blocks.move_to_end(digest)
            cached += BLOCK_TOKENS
        return cached

    def keep(self, tokens: list[str]) -> None:
        """Cache the blocks of ``tokens``, the least recently used out past ``max_blocks``."""
        for digest in block_hashes(tokens):
            self.blocks[digest] = None
            self.blocks.move_to_end(digest)
        while len(self.blocks) > self.max_blocks:
            self.blocks.popitem(last=False)

    def answer(self, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
        """The completed response to ``body`` and the prefill seconds it models (its uncached
        tokens times ``prefill_seconds_per_token``); the cache then holds its prompt and
        answer."""
        items = body.get("input", [])
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        prompt = render(body.get("instructions"), items)
        cached = self.cached_prefix(prompt)
        words = " ".join(f"w{n}-{secrets.token_hex(2)}" for n in range(ANSWER_WORDS))
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
        response = {
            "id": "resp_" + secrets.token_hex(12),
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": body.get("model") or MODEL,
            "output": [message],
            "usage": {
                "input_tokens": len(prompt),
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": ANSWER_WORDS + 2,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": len(prompt) + ANSWER_WORDS + 2,
            },
        }
        return response, (len(prompt) - cached) * self.prefill_seconds_per_token


def _sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


async def _events(
    replica: Replica, response: dict[str, Any], prefill: float
) -> AsyncIterator[bytes]:
    """The response's stream: created, the prefill wait, then its message's events."""
    message = response["output"][0]
    part = message["content"][0]
    item = {"output_index": 0, "item_id": message["id"]}
    in_part = {**item, "content_index": 0}
    started = {**response, "status": "in_progress", "output": []}
    yield _sse({"type": "response.created", "response": started, "sequence_number": 0})
    await replica.prefill(prefill)
    events: list[dict[str, Any]] = [
        {"type": "response.output_item.added", **item, "item": {**message, "content": []}},
        {"type": "response.content_part.added", **in_part, "part": {**part, "text": ""}},
        {"type": "response.output_text.delta", **in_part, "delta": part["text"]},
        {"type": "response.output_text.done", **in_part, "text": part["text"]},
        {"type": "response.content_part.done", **in_part, "part": part},
        {"type": "response.output_item.done", **item, "item": message},
        {"type": "response.completed", "response": response},
    ]
    for number, event in enumerate(events, start=1):
        yield _sse({**event, "sequence_number": number})


def replica_app(replica: Replica) -> Starlette:
    """The app of one replica."""

    async def responses(request: Request) -> Response:
        body = await request.json()
        response, prefill = replica.answer(body)
        if body.get("stream"):
            stream = _events(replica, response, prefill)
            return StreamingResponse(stream, media_type="text/event-stream")
        await replica.prefill(prefill)
        return JSONResponse(response)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(request: Request) -> Response:
        model = {"id": MODEL, "object": "model", "owned_by": replica.name}
        return JSONResponse({"object": "list", "data": [model]})

    async def info(request: Request) -> Response:
        return JSONResponse({"model_path": MODEL, "served_model_name": MODEL})

    async def served(request: Request) -> Response:
        return JSONResponse({"name": replica.name, "served": replica.served})

    return Starlette(
        routes=[
            Route("/v1/responses", responses, methods=["POST"]),
            Route("/health", health),
            Route("/health_generate", health),
            Route("/v1/models", models),
            Route("/get_server_info", info),
            Route("/get_model_info", info),
            Route("/fleet/served", served),
        ]
    )


#: The routers :func:`router` runs: their executables (the first found) and the header each
#: routes by.
ROUTERS: Final[dict[str, tuple[tuple[str, ...], str]]] = {
    "vllm-router": (("vllm-router",), "x-session-id"),
    "sglang-router": (("smg", "sglang-router"), "x-smg-routing-key"),
}
#: How long a router may take to answer ``GET /health``.
ROUTER_START_SECONDS: Final = 60.0


def router_binary(kind: str) -> str | None:
    """The path of ``kind``'s executable (a key of :data:`ROUTERS`), None if not installed."""
    return next(filter(None, map(shutil.which, ROUTERS[kind][0])), None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def router_command(kind: str, worker_urls: Sequence[str], port: int) -> list[str]:
    """The command line of ``kind`` routing by its header in front of ``worker_urls``, on
    loopback ``port``; its metrics on a port of their own (both default to a fixed one, which
    a second router running at once would find taken)."""
    binary = router_binary(kind)
    if binary is None:
        raise FileNotFoundError(f"{kind} is not installed (pip install {kind})")
    metrics = ["--prometheus-host", HOST, "--prometheus-port", str(_free_port())]
    where = ["--host", HOST, "--port", str(port)]
    if kind == "vllm-router":
        policy = ["--policy", "consistent_hash", "--log-level", "warning"]
        return [binary, "--worker-urls", *worker_urls, *policy, *where, *metrics]
    policy = ["--policy", "manual", "--log-level", "error"]
    return [binary, "launch", "--worker-urls", *worker_urls, *policy, *where, *metrics]


@contextlib.contextmanager
def router(kind: str, worker_urls: Sequence[str], *options: str) -> Iterator[str]:
    """Run ``kind`` (a key of :data:`ROUTERS`) in front of ``worker_urls``, with ``options``
    added to its command line; yield its base URL once it answers ``GET /health``. It is
    terminated (killed if it lingers) when the block exits."""
    port = _free_port()
    command = [*router_command(kind, worker_urls, port), *options]
    base = f"http://{HOST}:{port}"
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log
        )
        try:
            _wait_healthy(base, process, log)
            yield base
        finally:
            stop_process(process)


def _wait_healthy(base: str, process: subprocess.Popen[bytes], log: Any) -> None:
    import httpx

    deadline = time.monotonic() + ROUTER_START_SECONDS
    while True:
        if process.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"the router exited: {log.read()[-2000:]!r}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the router did not answer {base}/health")
        time.sleep(0.05)


def main(argv: Sequence[str] | None = None) -> None:
    """Serve one replica on the socket :func:`~ws_mode.testing._loopback.server_process`
    passed down."""
    parser = argparse.ArgumentParser(prog="python -m ws_mode.toolkit.fleet", description=__doc__)
    parser.add_argument("--name", required=True, help="the replica's name (its answers say it)")
    parser.add_argument(
        "--prefill-ms-per-token",
        type=float,
        default=0.0,
        help="modelled prefill time per uncached prompt token, in milliseconds (default 0)",
    )
    add_child_arguments(parser)
    arguments = parser.parse_args(argv)
    replica = Replica(arguments.name, arguments.prefill_ms_per_token / 1000)
    serve_inherited(replica_app(replica), arguments)


if __name__ == "__main__":
    main()
