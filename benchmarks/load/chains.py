"""The load's tool-call chains: the tool, the inputs, and each distinct chain run once over plain
HTTP with the whole history (:func:`reference_chains`), what every turn of the load must give."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import orjson

from ws_mode._cache import NODE_OVERHEAD

from .options import VARIANTS, LoadError, LoadOptions
from .server import SOCKET_PATH

if TYPE_CHECKING:
    pass


# ----------------------------------------------------------------------------- the chains
# Each distinct tool-call chain runs once over plain HTTP with the whole history
# (`reference_chains`): what every turn of the load must then give.


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
    from ws_mode.toolkit.http_client import (
        HttpClient,  # the clients' imports: see the module's docstring
    )

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
