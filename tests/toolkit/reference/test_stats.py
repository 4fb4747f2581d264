"""The reference server's work counters (`ws_mode.toolkit.reference.stats`)."""

from __future__ import annotations

import orjson
from starlette.testclient import TestClient

from tests.toolkit.reference.helpers import USER
from ws_mode.toolkit.reference import ReferenceStats, render_items


def test_stats(client: TestClient) -> None:
    stats = client.app.state.reference_stats  # type: ignore[attr-defined]
    assert isinstance(stats, ReferenceStats)
    zero = {
        "requests": 0,
        "bytes_parsed": 0,
        "items_seen": 0,
        "tokens_rendered": 0,
        "resumed": 0,
        "cpu_seconds": 0.0,
    }
    assert stats.snapshot() == zero
    bodies = [
        orjson.dumps({"input": [USER, USER, USER]}),
        orjson.dumps({"input": "hello", "stream": True}),
        b"not json",
    ]
    for raw in bodies:
        client.post("/v1/responses", content=raw)
    assert stats.requests == 3
    assert stats.bytes_parsed == sum(len(raw) for raw in bodies)
    assert stats.items_seen == 4
    hello = {"role": "user", "content": "hello"}
    assert stats.tokens_rendered == len(render_items([USER, USER, USER, hello]))
    assert stats.resumed == 0
    assert stats.cpu_seconds > 0
    stats.reset()
    assert stats.snapshot() == zero
    assert "requests=0" in repr(stats)


def test_stats_start_at_zero_and_show_every_counter() -> None:
    stats = ReferenceStats()
    assert repr(stats) == (
        "ReferenceStats(requests=0, bytes_parsed=0, items_seen=0, tokens_rendered=0, "
        "resumed=0, cpu_seconds=0.0)"
    )
    other = ReferenceStats()
    assert stats != other  # each app's counters are its own object
    assert len({stats, other}) == 2
