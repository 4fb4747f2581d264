"""Memory means what it says: one frame costs what its objects cost, and the cache counts
what it keeps. Measured as RSS in a fresh interpreter, so nothing else in the suite counts."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any


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
        from ws_mode.cache import encode_items
        from ws_mode.client_events import parse_client_event
        from ws_mode.turn import build_body
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
