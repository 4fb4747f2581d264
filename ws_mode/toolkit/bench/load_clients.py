"""The client side of the load test: the expected chains, and the sockets that run them.

:func:`reference_chains` runs each distinct tool-call chain once over plain HTTP with the whole
history (the tools' :class:`~ws_mode.toolkit.http_client.HttpClient`): what every socket's turn
must then give. :func:`run_client` opens one socket (the tools'
:class:`~ws_mode.testing._client.AsyncSocket`, its lanes demultiplexed by ``stream_id``) and runs a
chain on each of its lanes concurrently, counting in a :class:`Tally` what it saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from ws_mode._cache import NODE_OVERHEAD
from ws_mode.testing._client import AsyncSocket, SocketClosed, connect_async

from ..http_client import HttpClient
from .load_options import VARIANTS, LoadError, LoadOptions
from .load_server import SOCKET_PATH

__all__ = ["Chain", "Tally", "first_input", "reference_chains", "run_client", "tool_output"]

TOOL: Final = {
    "type": "function",
    "name": "lookup",
    "description": "Look a step of the task up.",
    "parameters": {
        "type": "object",
        "properties": {"step": {"type": "integer"}, "context_digest": {"type": "string"}},
    },
    "strict": False,
}
INSTRUCTIONS: Final = "Use the lookup tool until you know enough, then answer."


# ----------------------------------------------------------------------------- the chains


def tool_output(variant: int, step: int, size: int) -> str:
    """The client's answer to the model's `step`-th tool call in chain `variant`."""
    head = f"variant {variant} step {step}: "
    filler = "0123456789abcdef" * (size // 16 + 1)
    return (head + filler)[: max(size, len(head))]


def first_input(variant: int) -> list[dict[str, Any]]:
    """The user message that starts chain `variant`."""
    return [{"role": "user", "content": f"Task {variant}: plan the steps and look each one up."}]


@dataclass
class Chain:
    """The expected turns of one chain: each turn's new input and its output items."""

    inputs: list[list[dict[str, Any]]]
    outputs: list[list[dict[str, Any]]]
    cache_bytes: int


def reference_chains(base_url: str, options: LoadOptions) -> list[Chain]:
    """Run each distinct chain once over plain HTTP, with the whole history every turn."""
    chains: list[Chain] = []
    with HttpClient(base_url, timeout=60.0) as http:
        for variant in range(VARIANTS):
            history: list[dict[str, Any]] = []
            chain = Chain([], [], 0)
            new_input = first_input(variant)
            for step in range(options.turns):
                history.extend(new_input)
                body = {"model": "reference", "input": history, "tools": [TOOL]}
                body["instructions"] = INSTRUCTIONS
                response = http.post_json(SOCKET_PATH, body)
                output = response["output"]
                chain.inputs.append(new_input)
                chain.outputs.append(output)
                # What the cache counts for this turn (ws_mode._cache.CachedResponse.size).
                encoded = b",".join(orjson.dumps(item) for item in new_input)
                event = {"type": "response.completed", "sequence_number": 0, "response": response}
                chain.cache_bytes += len(encoded) + len(orjson.dumps(event)) + NODE_OVERHEAD
                history.extend(output)
                if step + 1 < options.turns:
                    call = output[0]
                    if call.get("type") != "function_call":
                        raise LoadError(f"the reference model answered early: {output}")
                    new_input = [
                        {
                            "type": "function_call_output",
                            "call_id": call["call_id"],
                            "output": tool_output(variant, step + 1, options.tool_output_bytes),
                        }
                    ]
            if chain.outputs[-1][0].get("type") != "message":
                raise LoadError("the reference model did not answer on the last turn")
            chains.append(chain)
    return chains


# ----------------------------------------------------------------------------- the clients


@dataclass
class Tally:
    """What the clients saw."""

    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)
    turns: int = 0
    connected: int = 0
    settled: int = 0  # connection attempts that succeeded or failed
    lanes: int = 0
    expected: int = 0
    all_settled: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set at the duration cap: clients stop at their next step (a task cancelled inside
    #: `websockets`' connect() may go on as if it was not).
    stopped: bool = False

    def settle(self) -> None:
        """Count one connection attempt as over (it succeeded or failed)."""
        self.settled += 1
        if self.settled == self.expected:
            self.all_settled.set()

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        if len(self.samples) < 20:
            self.samples.append(f"{kind}: {detail[:300]}")


async def _lane(
    sock: AsyncSocket, tag: str, lane: str | None, chain: Chain, options: LoadOptions, tally: Tally
) -> None:
    where = f"{tag} lane {lane}"
    previous: str | None = None
    for step in range(options.turns):
        if tally.stopped:
            return
        create: dict[str, Any] = {
            "type": "response.create",
            "model": "reference",
            "input": chain.inputs[step],
            "tools": [TOOL],
            "instructions": INSTRUCTIONS,
        }
        if lane is not None:
            create["stream_id"] = lane
        if previous is not None:
            create["previous_response_id"] = previous
        started = time.perf_counter()
        await sock.send(create)
        try:
            async with asyncio.timeout(options.turn_timeout):
                event = (await sock.receive_turn(lane))[-1]
        except TimeoutError:
            tally.error("turn_timeout", f"{where} turn {step + 1}")
            return
        except SocketClosed:
            tally.error("socket_closed", f"{where} turn {step + 1}")
            return
        tally.latencies.append(time.perf_counter() - started)
        if event["type"] == "error":
            tally.error(f"error:{event['error'].get('code')}", f"{where}: {event}")
            return
        response = event["response"]
        if event["type"] != "response.completed":
            tally.error(event["type"], f"{where}: {response.get('status')}")
            return
        if response.get("previous_response_id") != previous:
            tally.error("previous_response_id", f"{where} turn {step + 1}")
        if response["output"] != chain.outputs[step]:
            tally.error(
                "wrong_output",
                f"{where} turn {step + 1}: {response['output']} != {chain.outputs[step]}",
            )
            return
        tally.turns += 1
        previous = response["id"]


async def run_client(
    index: int,
    base_url: str,
    options: LoadOptions,
    chains: list[Chain],
    tally: Tally,
    gate: asyncio.Semaphore,
    start: asyncio.Event,
) -> None:
    """Connection number `index`: open its socket (at most `gate` opening at once), wait for
    `start`, then run a chain on each of its lanes concurrently."""
    count = options.lanes_of(index)
    lanes: list[str | None] = [None, *(f"lane-{lane}" for lane in range(1, count))]
    tag = f"connection {index}"
    try:
        async with gate:
            sock = await connect_async(
                base_url, SOCKET_PATH, open_timeout=60, compression=options.compression
            )
    except Exception as exc:
        tally.error(f"connect:{type(exc).__name__}", f"{tag}: {exc}")
        return
    finally:
        tally.settle()
    if tally.stopped:
        await sock.close()
        return
    tally.connected += 1
    sock.demultiplex(lanes, lambda kind, detail: tally.error(kind, f"{tag}: {detail}"))
    try:
        await start.wait()
        tally.lanes += len(lanes)
        await asyncio.gather(
            *(
                _lane(sock, tag, lane, chains[options.variant_of(index, number)], options, tally)
                for number, lane in enumerate(lanes)
            )
        )
    except Exception as exc:
        tally.error(f"client:{type(exc).__name__}", f"{tag}: {exc}")
    finally:
        with contextlib.suppress(Exception):
            await sock.close()
