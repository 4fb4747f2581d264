"""The HTTP side of the load test: the sockets' conversations over plain HTTP, at the same
concurrency.

Client number `index` stands for socket number `index`: one ``httpx.AsyncClient`` whose pool
holds as many keep-alive connections as that socket has lanes, all opened (``GET
/load/ping``, concurrently) before the first turn, so each conversation has its own HTTP/1.1
connection, as a client pool sized to its concurrency would. Each conversation runs the same
chain as the lane it stands for, one ``POST /v1/responses`` (``stream: true``) per turn with
the whole history so far, its SSE body decoded by the core's :class:`~ws_mode._sse.SSEDecoder`;
every turn's output must equal the chain's. The request bodies are encoded once per chain and
turn before the load (:func:`history_bodies`), so the client's JSON encoding is not measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from typing import Any

import httpx
import orjson

from ws_mode._sse import SSEDecoder
from ws_mode.testing._client import decode_event

from ..http_client import DONE, HttpStatusError
from .load_clients import INSTRUCTIONS, TOOL, Chain, Tally
from .load_options import LoadOptions
from .load_server import PING_PATH, SOCKET_PATH

__all__ = ["history_bodies", "run_http_client"]

HEADERS = {"content-type": "application/json", "accept": "text/event-stream"}


def history_bodies(chains: list[Chain]) -> list[list[bytes]]:
    """For each chain, each turn's request body: the whole history up to that turn."""
    bodies: list[list[bytes]] = []
    for chain in chains:
        history: list[dict[str, Any]] = []
        turns: list[bytes] = []
        for new_input, output in zip(chain.inputs, chain.outputs, strict=True):
            history.extend(new_input)
            body = {
                "model": "reference",
                "input": history,
                "tools": [TOOL],
                "instructions": INSTRUCTIONS,
                "stream": True,
            }
            turns.append(orjson.dumps(body))
            history.extend(output)
        bodies.append(turns)
    return bodies


async def _turn(client: httpx.AsyncClient, body: bytes) -> dict[str, Any] | None:
    """One streamed turn: its last event (None when the stream had none)."""
    last: dict[str, Any] | None = None
    async with client.stream("POST", SOCKET_PATH, content=body, headers=HEADERS) as answer:
        if answer.status_code != 200:
            raise HttpStatusError(answer.status_code, await answer.aread())
        decoder = SSEDecoder()
        async for chunk in answer.aiter_bytes():
            for _, data in decoder.feed(chunk):
                if data != DONE:
                    last = decode_event(data)
    return last


async def _conversation(
    client: httpx.AsyncClient,
    where: str,
    chain: Chain,
    bodies: list[bytes],
    options: LoadOptions,
    tally: Tally,
) -> None:
    for step in range(options.turns):
        if tally.stopped:
            return
        started = time.perf_counter()
        try:
            async with asyncio.timeout(options.turn_timeout):
                event = await _turn(client, bodies[step])
        except TimeoutError:
            tally.error("turn_timeout", f"{where} turn {step + 1}")
            return
        except (httpx.HTTPError, HttpStatusError, ValueError) as exc:
            tally.error(f"http:{type(exc).__name__}", f"{where} turn {step + 1}: {exc}")
            return
        tally.latencies.append(time.perf_counter() - started)
        if event is None or event.get("type") != "response.completed":
            tally.error(
                "no_completed_event" if event is None else str(event.get("type")),
                f"{where} turn {step + 1}: {event}",
            )
            return
        output = event["response"]["output"]
        if output != chain.outputs[step]:
            tally.error(
                "wrong_output", f"{where} turn {step + 1}: {output} != {chain.outputs[step]}"
            )
            return
        tally.turns += 1


async def run_http_client(
    index: int,
    base_url: str,
    options: LoadOptions,
    chains: list[Chain],
    bodies: list[list[bytes]],
    tally: Tally,
    gate: asyncio.Semaphore,
    start: asyncio.Event,
    tls: ssl.SSLContext,
) -> None:
    """Client number `index`: open one keep-alive connection per lane socket `index` has (at
    most `gate` clients opening at once), wait for `start`, then run each lane's chain over
    HTTP concurrently. `tls` is one context shared by every client (never used on loopback;
    httpx would otherwise build one per client)."""
    count = options.lanes_of(index)
    tag = f"http client {index}"
    # No keep-alive expiry: a connection waits idle while the other clients connect.
    limits = httpx.Limits(
        max_connections=count, max_keepalive_connections=count, keepalive_expiry=None
    )
    timeout = httpx.Timeout(options.turn_timeout, connect=60.0, pool=options.turn_timeout)
    client = httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout, verify=tls)
    try:
        try:
            async with gate:
                # Concurrent requests on an empty pool each open a connection of their own.
                answers = await asyncio.gather(*(client.get(PING_PATH) for _ in range(count)))
            if any(answer.status_code != 204 for answer in answers):
                raise HttpStatusError(answers[0].status_code, answers[0].content)
        except Exception as exc:
            tally.error(f"connect:{type(exc).__name__}", f"{tag}: {exc}")
            return
        finally:
            tally.settle()
        if tally.stopped:
            return
        tally.connected += count
        await start.wait()
        tally.lanes += count
        variants = [options.variant_of(index, lane) for lane in range(count)]
        await asyncio.gather(
            *(
                _conversation(client, f"{tag} lane {lane}", chains[v], bodies[v], options, tally)
                for lane, v in enumerate(variants)
            )
        )
    except Exception as exc:
        tally.error(f"client:{type(exc).__name__}", f"{tag}: {exc}")
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()
