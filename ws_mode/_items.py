"""Conversation items held decoded, encoded, or both: each form made from the other on use.

A request's items are needed encoded (to join into the handler's request body, to count) far
more often than decoded (a cache-aware handler reading `Turn.history()`, a renderer). Items
that arrive encoded, from a frame parsed off the event loop, stay encoded until someone asks
for them as objects.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Final

import orjson


def encode_items(items: list[dict[str, Any]]) -> bytes:
    """Encode items as a JSON array's contents, without the brackets: `{..},{..}`.

    One `orjson.dumps` of the whole list, then a copy without the brackets: linear, and the
    result is exactly as large as it counts (encoding item by item left a buffer of about
    4 KiB behind per item: a frame of a million tiny items cost gigabytes and seconds).
    """
    if not items:
        return b""
    return orjson.dumps(items)[1:-1]


class Items:
    """A list of items, given decoded (`list`) or encoded (`fragment`, an array's contents)."""

    __slots__ = ("_fragment", "_list", "decoded_estimate")

    def __init__(
        self, items: list[dict[str, Any]] | None = None, *, fragment: bytes | None = None
    ) -> None:
        if items is None and fragment is None:
            items = []
        self._list = items
        self._fragment = fragment
        #: What the items cost decoded (`ws_mode._cache.decoded_size` of the fragment), when
        #: it was counted where the frame was parsed (a helper process), so the event loop
        #: need not scan a large fragment again.
        self.decoded_estimate: int | None = None

    @property
    def list(self) -> list[dict[str, Any]]:
        """The items as objects, decoded on first use."""
        if self._list is None:
            decoded: list[dict[str, Any]] = orjson.loads(b"[" + (self._fragment or b"") + b"]")
            self._list = decoded
        return self._list

    @property
    def fragment(self) -> bytes:
        """The items encoded, without brackets, encoded on first use."""
        if self._fragment is None:
            self._fragment = encode_items(self._list or [])
        return self._fragment

    @property
    def decoded(self) -> bool:
        """Whether the items are held as objects."""
        return self._list is not None

    def encoded_only(self) -> Items:
        """The same items holding only their encoding (to send to another process)."""
        return Items(fragment=self.fragment)

    def __repr__(self) -> str:
        form = "decoded" if self.decoded else "encoded"
        return f"<Items {form}>"


def with_input(head: bytes, fragments: list[bytes]) -> bytes:
    """`head`, an encoded object, with `"input": [...]` made of the encoded item `fragments`
    added last: the one way a request body is assembled from fragments (a socket turn's
    full context, stateful HTTP's stored conversation).

    One join of all the pieces: the history is copied once, into the body (joining the
    fragments first would copy it twice, and make the allocator hand a history-sized block
    back and forth every turn)."""
    opening = b'{"input":[' if head == b"{}" else head[:-1] + b',"input":['
    pieces = [opening]
    for fragment in fragments:
        pieces.append(fragment)
        pieces.append(b",")
    if fragments:
        pieces.pop()
    pieces.append(b"]}")
    return b"".join(pieces)


#: The input item that makes tools available from its place in the context on: how Codex sends
#: its tools for Responses Lite models (`{"type": "additional_tools", "role": "developer",
#: "tools": [...]}`, top-level `tools` absent).
ADDITIONAL_TOOLS: Final = "additional_tools"
_ADDITIONAL_TOOLS_MARK: Final = b'"additional_tools"'


def declared_tools(
    before: bytes | None, fragment: bytes, decoded: Callable[[], list[dict[str, Any]]]
) -> bytes | None:
    """A digest of the tools a context's `additional_tools` items declare: `before` (the
    digest of the context up to some items) extended by those among the items, which are
    `fragment` encoded and `decoded()` as objects. `before` when they hold none; None for a
    context that declares none.

    A search of the encoding decides, so items without any are never decoded."""
    if _ADDITIONAL_TOOLS_MARK not in fragment:
        return before
    found = [item for item in decoded() if item.get("type") == ADDITIONAL_TOOLS]
    if not found:
        return before
    encoded = orjson.dumps(found, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b((before or b"") + encoded, digest_size=16).digest()
