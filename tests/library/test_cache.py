"""Tests of cached response nodes and the per-connection LRU."""

from __future__ import annotations

import copy
import logging
from collections import OrderedDict
from typing import Any

import orjson
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)

from ws_mode._cache import (
    VALUE_OVERHEAD,
    CachedResponse,
    ResponseCache,
    decoded_size,
    encode_items,
)


def message(text: str, role: str = "user") -> dict[str, Any]:
    return {"type": "message", "role": role, "content": text}


def node(
    id: str,
    parent: CachedResponse | None = None,
    *,
    inputs: list[dict[str, Any]] | None = None,
    outputs: list[dict[str, Any]] | None = None,
) -> CachedResponse:
    return CachedResponse(
        id=id,
        response={"id": id, "object": "response", "status": "completed"},
        input_items=inputs if inputs is not None else [message(f"in {id}")],
        output_items=outputs if outputs is not None else [message(f"out {id}", "assistant")],
        parent=parent,
    )


def decoded(fragments: list[bytes]) -> list[dict[str, Any]]:
    """The items of a list of encoded fragments, as the request body would hold them."""
    result: list[dict[str, Any]] = orjson.loads(b"[" + b",".join(fragments) + b"]")
    return result


# --- nodes ----------------------------------------------------------------------------------


def test_encode_items_has_no_brackets() -> None:
    items = [message("a"), {"type": "function_call", "arguments": "{}"}]
    encoded = encode_items(items)
    assert not encoded.startswith(b"[")
    assert orjson.loads(b"[" + encoded + b"]") == items
    assert encode_items([]) == b""


def test_chain_runs_from_the_root() -> None:
    root = node("r")
    child = node("c", root)
    grandchild = node("g", child)
    assert grandchild.chain() == [root, child, grandchild]
    assert root.chain() == [root]
    assert [root.depth, child.depth, grandchild.depth] == [1, 2, 3]


def test_context_items_and_fragments_agree() -> None:
    root = node("r", inputs=[message("hi")], outputs=[{"type": "reasoning", "summary": []}])
    empty = node("e", root, inputs=[], outputs=[])
    leaf = node(
        "l",
        empty,
        inputs=[{"type": "function_call_output", "call_id": "c", "output": "42"}],
        outputs=[message("done", "assistant"), message("more", "assistant")],
    )
    expected = [
        message("hi"),
        {"type": "reasoning", "summary": []},
        {"type": "function_call_output", "call_id": "c", "output": "42"},
        message("done", "assistant"),
        message("more", "assistant"),
    ]
    assert list(leaf.context_items()) == expected
    assert decoded(leaf.context_fragments()) == expected
    assert all(leaf.context_fragments())
    assert empty.context_fragments() == root.context_fragments()


def test_given_input_fragment_is_used() -> None:
    items = [message("x")]
    fragment = encode_items(items)
    built = CachedResponse(
        id="a",
        response={},
        input_items=items,
        output_items=[],
        parent=None,
        input_fragment=fragment,
    )
    assert built.input_fragment is fragment
    assert built.artifacts == {}
    assert built.size > len(fragment)


def test_size_counts_the_items_encoded_and_decoded() -> None:
    small = node("s", inputs=[message("x")], outputs=[])
    large = node("l", inputs=[message("x" * 1000)], outputs=[])
    assert large.size - small.size == 2 * 999  # the characters, once encoded, once decoded


def test_decoded_size_counts_a_cost_per_value() -> None:
    """Many tiny values cost far more than their characters; one long string barely more."""
    tiny = b",".join([b'{"role":"user","content":"x"}'] * 100)
    separators = 100 * 2 + 100 + 99  # two `:` and one `,` per item, a `,` between items
    assert decoded_size(tiny) == len(tiny) + VALUE_OVERHEAD * (separators + 1)
    assert decoded_size(tiny) > 10 * len(tiny)
    long = b'{"output":"' + b"y" * 4096 + b'"}'
    assert decoded_size(long) == len(long) + 2 * VALUE_OVERHEAD
    assert decoded_size(long.decode()) == decoded_size(long)
    assert decoded_size(b"") == 0


# --- the cache --------------------------------------------------------------------------------


def test_node_larger_than_max_bytes_is_not_cached(caplog: pytest.LogCaptureFixture) -> None:
    cache = ResponseCache(max_entries=10, max_bytes=2000)
    kept = node("kept")
    assert cache.put(kept)
    huge = node("huge", inputs=[message("x" * 5000)])
    assert huge.size > 2000
    with caplog.at_level(logging.WARNING, logger="ws_mode._cache"):
        assert not cache.put(huge)
    assert "huge" not in cache
    assert cache.get("huge") is None
    assert cache.get("kept") is kept
    assert len(cache) == 1
    assert cache.bytes == kept.size
    assert cache.evictions == 0
    assert "not cached" in caplog.text


def test_node_of_exactly_max_bytes_fills_the_cache() -> None:
    first = node("first")
    cache = ResponseCache(max_entries=10, max_bytes=first.size)
    assert cache.put(first)
    second = node("other")
    assert second.size == first.size
    assert cache.put(second)
    assert list(iter_ids(cache)) == ["other"]
    assert cache.evictions == 1


def test_evicted_parent_stays_reachable_from_its_child() -> None:
    cache = ResponseCache(max_entries=1, max_bytes=10**6)
    parent = node("p")
    child = node("c", parent)
    cache.put(parent)
    cache.put(child)
    assert "p" not in cache
    assert cache.get("c") is child
    assert [item["content"] for item in child.context_items()] == ["in p", "out p", "in c", "out c"]
    assert decoded(child.context_fragments()) == list(child.context_items())


def test_get_marks_recent_and_contains_does_not() -> None:
    cache = ResponseCache(max_entries=2, max_bytes=10**6)
    cache.put(node("a"))
    cache.put(node("b"))
    assert "a" in cache  # no effect on the order
    cache.put(node("c"))
    assert list(iter_ids(cache)) == ["b", "c"]
    assert cache.get("b") is not None
    cache.put(node("d"))
    assert list(iter_ids(cache)) == ["b", "d"]
    assert cache.evictions == 2


def test_evict_and_clear() -> None:
    cache = ResponseCache(max_entries=5, max_bytes=10**6)
    cache.put(node("a"))
    cache.put(node("b"))
    cache.evict("a")
    cache.evict("a")
    cache.evict("never")
    assert cache.evictions == 1
    assert "a" not in cache
    cache.clear()
    assert len(cache) == 0
    assert cache.bytes == 0


def test_put_same_id_replaces() -> None:
    cache = ResponseCache(max_entries=5, max_bytes=10**6)
    cache.put(node("a"))
    cache.put(node("b"))
    newer = node("a", inputs=[message("again")])
    assert cache.put(newer)
    assert cache.get("a") is newer
    assert len(cache) == 2
    assert cache.bytes == newer.size + node("b").size
    assert cache.evictions == 0
    assert list(iter_ids(cache)) == ["b", "a"]


def iter_ids(cache: ResponseCache) -> list[str]:
    """The cached ids, least recently used first, read without touching the order."""
    survivor = copy.copy(cache._entries)
    survivor._report = lambda node: None  # the copy's pops are not the cache's evictions
    order: list[str] = []
    while survivor:
        order.append(survivor.popitem()[0])
    assert sorted(order) == sorted(cache._entries)
    return order


# --- the state machine --------------------------------------------------------------------------


class CacheMachine(RuleBasedStateMachine):
    """Random puts, gets and evictions against an OrderedDict model of the LRU."""

    held = Bundle("held")

    def __init__(self) -> None:
        super().__init__()
        self.cache = ResponseCache(max_entries=1, max_bytes=1)
        self.model: OrderedDict[str, int] = OrderedDict()
        self.evictions = 0
        self.max_entries = 1
        self.max_bytes = 1
        self.count = 0
        # Every node ever built, cached or not, with the items its context should hold.
        self.contexts: dict[str, list[dict[str, Any]]] = {}
        self.nodes: dict[str, CachedResponse] = {}

    @initialize(max_entries=st.integers(1, 8), max_bytes=st.integers(600, 6000))
    def configure(self, max_entries: int, max_bytes: int) -> None:
        self.cache = ResponseCache(max_entries=max_entries, max_bytes=max_bytes)
        self.max_entries = max_entries
        self.max_bytes = max_bytes

    def held_bytes(self) -> int:
        """The sizes of the cached nodes and of every ancestor they keep in memory."""
        held: dict[str, int] = {}
        for id in self.model:
            walk: CachedResponse | None = self.nodes[id]
            while walk is not None and walk.id not in held:
                held[walk.id] = walk.size
                walk = walk.parent
        return sum(held.values())

    def _evict_lru(self) -> None:
        self.model.popitem(last=False)
        self.evictions += 1

    def _put(self, parent: CachedResponse | None, inputs: int, outputs: int) -> CachedResponse:
        self.count += 1
        id = f"resp_{self.count}"
        built = node(
            id,
            parent,
            inputs=[message("i" * inputs)] if inputs else [],
            outputs=[{"type": "function_call", "arguments": "o" * outputs}] if outputs else [],
        )
        evictions = self.cache.evictions
        stored = self.cache.put(built)
        self.nodes[id] = built
        if built.chain_size > self.max_bytes:
            # Its conversation cannot fit even alone: not cached, nothing evicted for it,
            # and a later miss says why.
            assert not stored
            assert self.cache.evictions == evictions
            assert self.cache.why_missing(id) is not None
        else:
            self.model[id] = built.size
            while len(self.model) > self.max_entries:
                self._evict_lru()
            # The byte bound counts what cached nodes keep alive: their evicted ancestors too.
            while self.held_bytes() > self.max_bytes:
                self._evict_lru()
            # The newest response is never evicted to make room for its own conversation.
            assert stored
            assert id in self.model
        self.contexts[id] = [
            *(self.contexts[parent.id] if parent is not None else []),
            *built.input_items,
            *built.output_items,
        ]
        return built

    @rule(target=held, inputs=st.integers(0, 3000), outputs=st.integers(0, 3000))
    def put_root(self, inputs: int, outputs: int) -> CachedResponse:
        return self._put(None, inputs, outputs)

    @rule(target=held, parent=held, inputs=st.integers(0, 1500), outputs=st.integers(0, 1500))
    def put_child(self, parent: CachedResponse, inputs: int, outputs: int) -> CachedResponse:
        # The parent may be cached or already evicted: both must work.
        return self._put(parent, inputs, outputs)

    @rule(target=held, parent=held, inputs=st.integers(0, 300))
    def put_child_of_cached(self, parent: CachedResponse, inputs: int) -> CachedResponse:
        cached = self.cache.get(parent.id)
        if cached is not None:
            assert cached is parent
            self.model.move_to_end(parent.id)
        return self._put(parent, inputs, 0)

    @rule(response=held)
    def get(self, response: CachedResponse) -> None:
        found = self.cache.get(response.id)
        if response.id in self.model:
            assert found is response
            self.model.move_to_end(response.id)
        else:
            assert found is None

    @rule(id=st.text(max_size=3))
    def get_unknown(self, id: str) -> None:
        assert self.cache.get(id) is None

    @rule(response=held)
    def evict(self, response: CachedResponse) -> None:
        self.cache.evict(response.id)
        if self.model.pop(response.id, None) is not None:
            self.evictions += 1
        assert response.id not in self.cache

    @rule(response=consumes(held))
    def evict_and_forget(self, response: CachedResponse) -> None:
        # Dropping the test's own reference: children must still hold the node.
        self.evict(response)

    @invariant()
    def bounded(self) -> None:
        assert len(self.cache) <= self.max_entries
        assert self.cache.bytes <= self.max_bytes

    @invariant()
    def matches_the_model(self) -> None:
        assert iter_ids(self.cache) == list(self.model)
        assert len(self.cache) == len(self.model)
        assert self.cache.bytes == self.held_bytes()
        assert self.cache.evictions == self.evictions
        for id in self.nodes:
            assert (id in self.cache) == (id in self.model)

    @invariant()
    def contexts_stay_whole(self) -> None:
        for id, built in self.nodes.items():
            expected = self.contexts[id]
            assert list(built.context_items()) == expected
            assert decoded(built.context_fragments()) == expected
            assert [n.id for n in built.chain()][-1] == id
            assert len(built.chain()) == built.depth


CacheMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=30)
TestResponseCache = CacheMachine.TestCase


def test_a_conversation_too_large_to_keep_evicts_nothing_else() -> None:
    """A conversation that outgrew the bound is not kept, and the other lanes' responses are
    not evicted for it (they once were, before it was dropped anyway); its next continuation
    is told why it missed."""
    other = node("other-lane", inputs=[message("x" * 100)])
    root = node("root", inputs=[message("y" * 1500)])
    cache = ResponseCache(max_entries=10, max_bytes=root.size + other.size + 100)
    assert cache.put(other)
    assert cache.put(root)
    grown = node("grown", root, inputs=[message("z" * 1500)])
    assert grown.chain_size > cache.bytes
    assert not cache.put(grown)
    assert cache.get("other-lane") is other
    assert cache.get("root") is root
    assert cache.evictions == 0
    why = cache.why_missing("grown")
    assert why is not None
    assert "max_cached_bytes" in why
    assert cache.why_missing("other-lane") is None
