"""The simulated inference replica (`ws_mode.toolkit.fleet`) under uvicorn, over httpx: its usage
is honest about its prefix cache, and its modelled prefill makes time to first token follow the
uncached tokens (a cold prompt waits for all of them, a continuation for its new input only).

Times are compared as ratios of one replica's own waits, never against a wall-clock bound.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tests.servers import serve
from ws_mode.testing._loopback import server_process
from ws_mode.toolkit.fleet import BLOCK_TOKENS, MODEL, Replica, block_hashes, render, replica_app

INSTRUCTIONS = "You are agent " + " ".join(f"i{n}" for n in range(300))


def first_delta(base: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Stream `body`: seconds from sending to the first text delta, and the response."""
    started = time.monotonic()
    first = None
    completed: dict[str, Any] = {}
    with httpx.stream("POST", base + "/v1/responses", json={**body, "stream": True}) as reply:
        for line in reply.iter_lines():
            if '"response.output_text.delta"' in line and first is None:
                first = time.monotonic() - started
            if line.startswith("data:") and '"response.completed"' in line:
                completed = json.loads(line[5:])["response"]
    assert first is not None
    assert completed
    return first, completed


def test_time_to_first_token_follows_the_uncached_tokens() -> None:
    replica = Replica("r", prefill_seconds_per_token=0.004)
    with serve(replica_app(replica)) as base:
        turn = {"model": MODEL, "instructions": INSTRUCTIONS}
        cold, response = first_delta(base, {**turn, "input": "one two three"})
        usage = response["usage"]
        assert usage["input_tokens_details"]["cached_tokens"] == 0
        history = [{"role": "user", "content": "one two three"}, *response["output"]]
        warm, response = first_delta(
            base, {**turn, "input": [*history, {"role": "user", "content": "four"}]}
        )
        usage = response["usage"]
    cached = usage["input_tokens_details"]["cached_tokens"]
    # All but the last partial block and the new input were cached.
    assert usage["input_tokens"] - cached < 2 * BLOCK_TOKENS
    # About 300 tokens of prefill against fewer than 32.
    assert cold > 4 * warm, (cold, warm)
    assert replica.served[0][1] == 0
    assert replica.served[1][1] == cached


def test_prefills_queue_on_a_replica() -> None:
    """Two cold prompts at once: the second's prefill waits for the first's."""
    replica = Replica("r", prefill_seconds_per_token=0.004)
    with serve(replica_app(replica)) as base, ThreadPoolExecutor(2) as pool:
        bodies = [{"model": MODEL, "instructions": f"{n} {INSTRUCTIONS}"} for n in range(2)]
        waits = sorted(ttft for ttft, _ in pool.map(lambda body: first_delta(base, body), bodies))
    assert waits[1] > 1.6 * waits[0], waits


def test_the_cache_names_blocks_by_their_whole_prefix() -> None:
    tokens = render("a b", [{"role": "user", "content": " ".join(["x"] * 40)}])
    other = render("a c", [{"role": "user", "content": " ".join(["x"] * 40)}])
    assert len(block_hashes(tokens)) == len(tokens) // BLOCK_TOKENS
    # One token differs at the start: no block is shared, though the later ones hold the same
    # tokens.
    assert not set(block_hashes(tokens)) & set(block_hashes(other))


def test_a_replica_serves_in_its_own_process_and_says_what_it_served() -> None:
    arguments = ["--name", "replica-x", "--prefill-ms-per-token", "0"]
    with server_process("ws_mode.toolkit.fleet", arguments, ready_path="/health") as child:
        body = {"model": MODEL, "input": "hello there"}
        response = httpx.post(child.base_url + "/v1/responses", json=body).json()
        assert response["output"][0]["content"][0]["text"].startswith("replica-x says ")
        served = httpx.get(child.base_url + "/fleet/served").json()
    assert served == {"name": "replica-x", "served": [[response["usage"]["input_tokens"], 0]]}
