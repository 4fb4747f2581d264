"""Cached responses and the per-connection LRU that holds them.

A cached response is a node: its own input items, its output items, the response object and a
reference to its parent. The whole context of a response is the walk from the root, so a chain
of n turns holds O(n) items. Each node also keeps its items already encoded as JSON fragments,
so building a full-context request body is a join, never a re-serialization.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from cachetools import LRUCache

from ._budget import MemoryBudget
from ._items import Items, declared_tools, encode_items
from ._logs import for_log
from ._tokens import Tokens

logger = logging.getLogger(__name__)

# How many responses too large to cache a connection remembers, to explain a later miss.
TOO_LARGE_REMEMBERED = 64
# What a node costs beyond its items: the node itself, its fragments' and lists' headers.
NODE_OVERHEAD = 512
# What a decoded JSON value costs beyond its characters (a dict, a str or an int object, a
# slot in its container), measured on CPython 3.11 for items of every usual shape: 40 to 90
# bytes; counted once per `,` or `:` of the encoding, the values' separators.
VALUE_OVERHEAD = 80


def decoded_size(encoded: bytes | str) -> int:
    """An estimate of what `encoded` JSON costs in memory once decoded: its characters, plus
    `VALUE_OVERHEAD` per value. Tiny items cost ten times their encoding, 4 KB strings barely
    more; counting only the encoding undercounted the cache four to thirteen times."""
    if isinstance(encoded, str):
        separators = encoded.count(",") + encoded.count(":")
    else:
        separators = encoded.count(b",") + encoded.count(b":")
    return len(encoded) + VALUE_OVERHEAD * (separators + 1) if encoded else 0


class CachedResponse:
    """A finished response of this connection, and what it takes to continue from it.

    `input_items` are the items its own request added, `output_items` what it produced,
    `response` the terminal response object, `artifacts` what the handler stored for the
    next turn (rendered tokens, a tool namespace, ...), `parent` the response it continued.
    """

    __slots__ = (
        "_input",
        "_pending_tokens",
        "_tokens",
        "artifacts",
        "chain_id",
        "chain_size",
        "context_bytes",
        "context_decoded",
        "conversation_key",
        "declared_tools",
        "depth",
        "holders",
        "id",
        "input_fragment",
        "output_fragment",
        "output_items",
        "parent",
        "remote",
        "response",
        "size",
        "storable",
        "stream_id",
        "tools_digest",
    )

    def __init__(
        self,
        *,
        id: str,
        response: dict[str, Any],
        input_items: list[dict[str, Any]] | Items,
        output_items: list[dict[str, Any]],
        parent: CachedResponse | None,
        stream_id: str | None = None,
        tools_digest: bytes | None = None,
        artifacts: dict[str, Any] | None = None,
        input_fragment: bytes | None = None,
        size: int | None = None,
        remote: bool = False,
        storable: bool = False,
        conversation_key: str | None = None,
    ) -> None:
        self.id = id
        self.response = response
        self._input = input_items if isinstance(input_items, Items) else Items(input_items)
        self.output_items = output_items
        self.parent = parent
        #: The conversation before this response is held by the handler (an upstream that
        #: stores responses), not here: continuations pass `previous_response_id` on.
        self.remote: bool = remote or (parent is not None and parent.remote)
        self.stream_id = stream_id
        #: The first response of its conversation, which groups it in a store.
        self.chain_id: str = parent.chain_id if parent is not None else id
        #: Its conversation's key (`ws_mode._conversation`), its parent's unless given; None
        #: for one hydrated from a record stored without a key (derived from `chain_id`).
        self.conversation_key: str | None = (
            conversation_key
            if conversation_key is not None or parent is None
            else parent.conversation_key
        )
        #: It and every response before it allowed storing (`store` not false).
        self.storable: bool = storable and (parent is None or parent.storable)
        self.tools_digest = tools_digest
        self.artifacts: dict[str, Any] = artifacts if artifacts is not None else {}
        self.input_fragment = input_fragment if input_fragment is not None else self._input.fragment
        self.output_fragment = encode_items(output_items)
        #: A digest of the tools its context's `additional_tools` items declare, up to and
        #: including its own items (None: none); the next turn's `tools_digest` covers it.
        self.declared_tools: bytes | None = declared_tools(
            declared_tools(
                parent.declared_tools if parent is not None else None,
                self.input_fragment,
                lambda: self._input.list,
            ),
            self.output_fragment,
            lambda: output_items,
        )
        self.depth: int = parent.depth + 1 if parent is not None else 1
        #: The encoded size of the whole context a continuation builds on (what a client
        #: with the full history would re-send).
        self.context_bytes: int = (
            (parent.context_bytes if parent is not None else 0)
            + len(self.input_fragment)
            + len(self.output_fragment)
        )
        #: How many hold this node in memory: its cache entry, and its children held in turn.
        self.holders = 0
        self._tokens: Tokens | None = None
        self._pending_tokens: Callable[[], Tokens] | None = None
        # What the node keeps: its items encoded and decoded, and the response object (which
        # holds the output items); `size` is the response's decoded size when the caller
        # measured it from its encoding.
        input_decoded = decoded_size(self.input_fragment)
        output_decoded = decoded_size(self.output_fragment)
        if size is None:
            size = output_decoded
        self.size = (
            NODE_OVERHEAD
            + len(self.input_fragment)
            + input_decoded
            + len(self.output_fragment)
            + size
        )
        #: What the whole context costs decoded (`decoded_size`, summed along the chain): what
        #: a handler decoding a full-context request body holds of its history, known without
        #: scanning the history again each turn.
        self.context_decoded: int = (
            (parent.context_decoded if parent is not None else 0) + input_decoded + output_decoded
        )
        #: What caching this response holds at the least: it and every ancestor.
        self.chain_size: int = self.size + (parent.chain_size if parent is not None else 0)

    def __repr__(self) -> str:
        return f"<CachedResponse {self.id} depth={self.depth}>"

    @property
    def input_items(self) -> list[dict[str, Any]]:
        """The items this response's own request added (decoded on first use)."""
        return self._input.list

    @property
    def tokens(self) -> Tokens | None:
        """The rendered tokens of the whole context up to and including this response's
        output, when the middleware has a renderer; rendered on first use if still pending."""
        if self._pending_tokens is not None:
            self._tokens = self._pending_tokens()
            self._pending_tokens = None
        return self._tokens

    def defer_tokens(self, render: Callable[[], Tokens]) -> None:
        """Set how to render this response's tokens; done after the response, off the next
        turn's path, or on first use."""
        self._pending_tokens = render

    def chain(self) -> list[CachedResponse]:
        """The nodes from the root of the conversation down to this one."""
        nodes: list[CachedResponse] = []
        node: CachedResponse | None = self
        while node is not None:
            nodes.append(node)
            node = node.parent
        nodes.reverse()
        return nodes

    def context_items(self) -> Iterator[dict[str, Any]]:
        """Every item of the context a continuation of this response builds on."""
        for node in self.chain():
            yield from node.input_items
            yield from node.output_items

    def context_fragments(self) -> list[bytes]:
        """The same items as `context_items`, as non-empty encoded fragments."""
        fragments: list[bytes] = []
        for node in self.chain():
            if node.input_fragment:
                fragments.append(node.input_fragment)
            if node.output_fragment:
                fragments.append(node.output_fragment)
        return fragments


class ResponseCache:
    """One connection's responses, least recently used first out, bounded by count and bytes.

    An evicted node stays reachable from the cached children that continue it, so their context
    stays whole; only its id stops resolving. Its bytes still count against `max_bytes` while
    it is held that way, so the bound covers what the connection really keeps in memory: a
    conversation longer than `max_bytes` ends up evicted whole, and its client recovers by
    resending the full context.

    With a `budget` (the process's, `Limits.max_memory_bytes`), every byte the cache holds is
    reserved there first and given back when it is let go (evicted, replaced, cleared): a
    response the budget cannot hold is not cached, and nothing else is evicted for it.
    """

    def __init__(
        self, *, max_entries: int, max_bytes: int, budget: MemoryBudget | None = None
    ) -> None:
        self._entries = _LRU(max_entries, self._dropped)
        self._max_bytes = max_bytes
        self._budget = budget
        self._bytes = 0
        self.evictions = 0
        # Responses not kept (their conversation alone outgrew `max_bytes`, or the memory
        # budget was exhausted), and why: a later miss on one says so (a few remembered,
        # newest first out).
        self._too_large: LRUCache[str, str] = LRUCache(TOO_LARGE_REMEMBERED)
        self._warned = False

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._entries

    @property
    def bytes(self) -> int:
        """The bytes of every node held: cached ones and the ancestors they keep alive."""
        return self._bytes

    def get(self, response_id: str) -> CachedResponse | None:
        """The node for `response_id`, marked as just used, or None."""
        return self._entries.get(response_id)

    def put(self, node: CachedResponse) -> bool:
        """Cache `node`, evicting the least recently used other nodes to stay within bounds.

        A response whose conversation (it and its ancestors) cannot fit in `max_bytes` even
        alone is not cached, and nothing else is evicted for it; `why_missing` says so later.
        """
        if node.chain_size > self._max_bytes:
            self._too_large[node.id] = (
                f"its conversation ({node.chain_size} bytes) is larger than this connection's "
                f"cache (Limits.max_cached_bytes = {self._max_bytes})"
            )
            if not self._warned:
                self._warned = True
                logger.warning(
                    "response %s: its conversation (%d bytes) is larger than max_cached_bytes "
                    "(%d); not cached (this is logged once per connection)",
                    for_log(node.id),
                    node.chain_size,
                    self._max_bytes,
                )
            return False
        if self._budget is not None and not self._budget.reserve(_unheld(node)):
            self._too_large[node.id] = (
                "the server's memory budget (Limits.max_memory_bytes) was exhausted when it "
                "finished"
            )
            return False
        old = self._entries.pop(node.id, None)
        self._entries[node.id] = node  # may evict the least recently used by count
        self._hold(node)
        if old is not None:
            self._release(old)
        # The chain fits alone, so the others free enough before `node`, the newest, is reached.
        while self._bytes > self._max_bytes:
            self._entries.popitem()
        return node.id in self._entries

    def why_missing(self, response_id: str) -> str | None:
        """Why `response_id` is not cached, when it was too large to keep."""
        return self._too_large.get(response_id)

    def evict(self, response_id: str) -> None:
        """Forget `response_id` (a failed continuation drops its parent)."""
        node = self._entries.pop(response_id, None)
        if node is not None:
            self._dropped(node)

    def clear(self) -> None:
        """Forget everything."""
        for node in list(self._entries.values()):
            self._release(node)
        self._entries.clear()

    def _dropped(self, node: CachedResponse) -> None:
        self.evictions += 1
        self._release(node)

    def _hold(self, node: CachedResponse | None) -> None:
        # A node that becomes held holds its parent in turn; stop at one already held. What it
        # adds (`_unheld`) was reserved in the budget by `put`.
        while node is not None:
            node.holders += 1
            if node.holders > 1:
                return
            self._bytes += node.size
            node = node.parent

    def _release(self, node: CachedResponse | None) -> None:
        while node is not None:
            node.holders -= 1
            if node.holders > 0:
                return
            self._bytes -= node.size
            if self._budget is not None:
                self._budget.release(node.size)
            node = node.parent


def _unheld(node: CachedResponse | None) -> int:
    """What holding `node` adds: its size and that of each ancestor no longer held."""
    total = 0
    while node is not None and node.holders == 0:
        total += node.size
        node = node.parent
    return total


class _LRU(LRUCache[str, CachedResponse]):
    """cachetools' LRU by count, reporting what it evicts on its own."""

    def __init__(self, maxsize: int, dropped: Callable[[CachedResponse], None]) -> None:
        super().__init__(maxsize=maxsize)
        self._report = dropped

    def popitem(self) -> tuple[str, CachedResponse]:
        key, node = super().popitem()
        self._report(node)
        return key, node
