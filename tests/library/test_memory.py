"""Memory means what it says: one frame costs what its objects cost, and the cache counts
what it keeps. Measured as RSS in a fresh interpreter, so nothing else in the suite counts."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest


def measure(script: str) -> dict[str, Any]:
    """Run `script` in a fresh interpreter; it prints one JSON object, which is returned."""
    prelude = textwrap.dedent(
        """
        import gc, json, resource
        def rss():
            with open("/proc/self/status") as status:
                for line in status:
                    if line.startswith("VmRSS"):
                        return int(line.split()[1]) * 1024
        def peak():
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_frame_of_tiny_items_costs_its_objects_not_gigabytes() -> None:
    """A frame of many tiny input items once left a 4 KiB buffer behind per item when it was
    encoded: 200,000 items cost over 800 MB. Now the peak is the parsed objects (a few hundred
    bytes an item) plus the frame."""
    result = measure(
        """
        import orjson
        from ws_mode._cache import encode_items
        from ws_mode._client_events import parse_client_event
        from ws_mode._turn import build_body
        items = [{"role": "user", "content": "x"} for _ in range(200_000)]
        text = orjson.dumps({"type": "response.create", "input": items}).decode()
        del items
        gc.collect()
        before = peak()
        create = parse_client_event(text)
        fragment = encode_items(create.new_input)
        body = build_body(create, None, full_context=True, new_fragment=fragment)
        print(json.dumps({"frame": len(text), "growth": peak() - before}))
        """
    )
    per_item = result["growth"] / 200_000
    assert per_item < 1000, f"{per_item:.0f} bytes of peak RSS per item"


CACHE_SCRIPT = """
import orjson
from ws_mode._cache import CachedResponse, ResponseCache, decoded_size, encode_items
from ws_mode._client_events import parse_client_event
SHAPE = {shape!r}

def new_items(turn):
    if SHAPE == "tiny":
        return [{{"role": "user", "content": str(turn)}} for _ in range(50)]
    return [{{"type": "function_call_output", "call_id": f"call_{{turn}}", "output": "y" * 4096}}]

def response_text(turn):
    call = {{"type": "function_call", "id": f"fc_{{turn}}", "call_id": f"call_{{turn}}",
             "name": "lookup", "arguments": "{{}}", "status": "completed"}}
    response = {{"id": f"resp_{{turn}}_{{id(call)}}", "object": "response",
                 "status": "completed", "model": "m", "output": [call],
                 "instructions": "Be brief.", "tools": [], "usage": None}}
    return orjson.dumps({{"type": "response.completed", "response": response}}).decode()

caches = [ResponseCache(max_entries=512, max_bytes=1 << 40) for _ in range({sockets})]
gc.collect()
before = rss()
for cache in caches:
    parent = None
    for turn in range({turns}):
        frame = orjson.dumps({{"type": "response.create", "input": new_items(turn)}}).decode()
        create = parse_client_event(frame)
        text = response_text(turn)
        response = orjson.loads(text)["response"]
        node = CachedResponse(
            id=response["id"], response=response, input_items=create.new_input,
            output_items=response["output"], parent=parent,
            input_fragment=encode_items(create.new_input), size=decoded_size(text),
        )
        cache.put(node)
        parent = node
        del create, frame, text, response, node
gc.collect()
print(json.dumps({{"growth": rss() - before, "counted": sum(c.bytes for c in caches)}}))
"""


@pytest.mark.parametrize("shape", ["tool_outputs", "tiny"])
def test_the_cache_counts_what_it_costs(shape: str) -> None:
    """200 sockets x 20 turns: what the caches count is within 1.5x of the RSS they add,
    whether the items are 4 KB tool outputs or tiny messages (which once counted 10x low)."""
    result = measure(CACHE_SCRIPT.format(shape=shape, sockets=200, turns=20))
    ratio = result["growth"] / result["counted"]
    assert 1 / 1.5 <= ratio <= 1.5, f"RSS grew {ratio:.2f}x what the caches count"


STEER_SCRIPT = """
import orjson
from ws_mode._budget import MemoryAccount, MemoryBudget
from ws_mode._client_events import parse_client_event
from ws_mode._limits import Limits
from ws_mode._steering import Steer, SteerInbox, Steering
account = MemoryAccount()
steering = Steering(enabled=True, limits=Limits(max_steer_bytes={bound}),
                    budget=MemoryBudget(1 << 40, account))
items = [{{"role": "user", "content": "x"}} for _ in range(20_000)]
text = orjson.dumps({{"type": "response.steer", "previous_response_id": "resp_1",
                      "input": items}}).decode()
del items
inboxes = [SteerInbox() for _ in range(4)]  # four responses streaming on one connection
gc.collect()
before = rss()
codes = []
for inbox in inboxes:
    for _ in range(16):
        result = steering.accept(parse_client_event(text), inbox, None, streaming=True,
                                 known=False)
        codes.append("accepted" if isinstance(result, Steer) else result["error"]["code"])
gc.collect()
growth = rss() - before
held = account.used
steering.close()
print(json.dumps({{"growth": growth, "held": held, "codes": codes, "after": account.used}}))
"""


def test_pending_steering_input_counts_what_it_costs() -> None:
    """Steering input waiting in responses counts at its decoded size against one bound per
    connection (`Limits.max_steer_bytes`) and the memory budget: 64 steers of tiny messages
    (0.6 MB of JSON each, about 6 MB decoded) once all waited, 16 per response; now what waits
    stays within the bound, the RSS it adds is what the account holds, and closing gives it
    all back."""
    bound = 32 * 1024 * 1024
    result = measure(STEER_SCRIPT.format(bound=bound))
    accepted = result["codes"].count("accepted")
    assert 0 < accepted < len(result["codes"])
    assert set(result["codes"]) == {"accepted", "too_many_pending_steers"}
    assert result["held"] <= bound
    ratio = result["growth"] / result["held"]
    assert 1 / 2 <= ratio <= 2, f"RSS grew {ratio:.2f}x what the account holds"
    assert result["after"] == 0


@pytest.mark.parametrize("content", ['"x"', "str(i)"])
def test_parsing_tiny_items_peaks_within_what_the_budget_reserves(content: str) -> None:
    """The memory budget reserves `PARSE_FACTOR` times a frame's length while it is parsed,
    before anything but its length is known: arrays of tiny items, the worst usual shape,
    peak at 13-14 times their JSON (10-11 once parsed)."""
    result = measure(
        f"""
        import orjson
        from ws_mode._client_events import parse_client_event
        from ws_mode.toolkit.measure import memory, reset_peak_rss
        items = [{{"role": "user", "content": {content}}} for i in range(300_000)]
        text = orjson.dumps({{"type": "response.create", "input": items}}).decode()
        del items
        gc.collect()
        assert reset_peak_rss()  # the peak of building the frame does not count
        before = rss()
        create = parse_client_event(text)
        print(json.dumps({{"frame": len(text), "peak": memory().peak - before}}))
        """
    )
    from ws_mode._budget import PARSE_FACTOR

    factor = result["peak"] / result["frame"]
    assert 8 < factor <= PARSE_FACTOR, f"parsing peaked at {factor:.1f}x the frame"
