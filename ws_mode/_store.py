"""Responses that outlive the socket: the store interface, its records, and the in-process store.

A store keeps finished responses created with `store: true` (the default when `store` is
omitted), so a `previous_response_id` missing from a connection's cache (after a reconnect, on
another worker) can be hydrated. Records are scoped by principal and grouped by conversation
(`chain_id`, the id of its first response); a hydration reads the ancestors of the response it
continues, following parent links, never the conversation's other forks. A response is written
only when it and every response before it allowed storing (the request's `store` and the
response object's): nothing of a conversation that used `store: false` is ever persisted.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from cachetools import LRUCache

#: How long a stored response lives: 30 days, as OpenAI keeps stored responses.
DEFAULT_TTL_SECONDS = 30 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """What a store keeps of one response: enough to continue from it on any worker.

    `input` and `output` are the items encoded as a JSON array's contents, `response` the
    terminal response object encoded; `parent_id` the response it continued, `chain_id` the
    first response of its conversation, `conversation_key` the conversation's key
    (`ws_mode._conversation`; None in a record written before keys, whose key is derived from
    `chain_id`).
    """

    id: str
    parent_id: str | None
    chain_id: str
    input: bytes
    output: bytes
    response: bytes
    tools_digest: bytes | None = None
    conversation_key: str | None = None

    def encode(self) -> bytes:
        """The record as bytes, for stores that keep bytes: a line of JSON for the ids, then
        the three encoded parts as they are, a line each (compact JSON holds no newline)."""
        head = {
            "id": self.id,
            "parent_id": self.parent_id,
            "chain_id": self.chain_id,
            "tools_digest": self.tools_digest.hex() if self.tools_digest else None,
        }
        if self.conversation_key is not None:
            # Only when there is one: a record without reads as before keys, to any version.
            head["conversation_key"] = self.conversation_key
        return b"\n".join((orjson.dumps(head), self.input, self.output, self.response))

    @classmethod
    def decode(cls, data: bytes) -> StoredResponse:
        """A record from `encode`'s bytes."""
        head, input, output, response = data.split(b"\n", 3)
        fields: dict[str, Any] = orjson.loads(head)
        digest = fields.get("tools_digest")
        key = fields.get("conversation_key")
        return cls(
            id=fields["id"],
            parent_id=fields["parent_id"],
            chain_id=fields["chain_id"],
            input=input,
            output=output,
            response=response,
            tools_digest=bytes.fromhex(digest) if digest else None,
            conversation_key=key if isinstance(key, str) else None,
        )

    @property
    def size(self) -> int:
        """What the record holds, in bytes."""
        return len(self.input) + len(self.output) + len(self.response) + 256


class ResponseStore(Protocol):
    """Where responses are kept across connections, workers and hosts.

    Every call is scoped by `principal` (whose responses they are): a record of another
    principal is never returned, and reads as not found. Implementations bound every call by
    a timeout and raise on failure; the middleware turns failures into error events.

    `put`, `get_chain` and `delete` are required. The middleware uses `get_ancestors`, `get`,
    `limit_principal_bytes`, `mark_pending`, `is_pending` and `check` when a store has them
    (both stores here do; `MemoryStore`'s markers are no-ops, which a store in one process
    can be), and otherwise falls back on `get_chain`, which reads the whole conversation,
    every fork included; says at startup that the store keeps no bound per principal; has a
    miss wait the whole `Limits.store_wait_seconds`, since it cannot tell a write on its
    way; and starts without asking the store whether it works.
    """

    async def put(self, principal: str, record: StoredResponse) -> int | None:
        """Keep `record` (its time to live starts again). A store that bounds what one
        principal keeps returns how many of that principal's conversations it dropped to make
        room (least recently written first), and raises `QuotaExceeded` when the record's own
        conversation does not fit the bound. A store that can tell raises `ParentNotStored`
        (writing nothing) when the record continues a response it does not hold and that was
        not deleted (lost in a restart, evicted): the middleware then writes the
        conversation again from its first response."""

    async def get_chain(self, principal: str, response_id: str) -> dict[str, StoredResponse]:
        """The records of the conversation `response_id` belongs to, by id (empty when it is
        not stored), in one round trip. Its cost grows with every fork of the conversation:
        hydration uses `get_ancestors` instead where the store has it."""
        ...

    async def get_ancestors(self, principal: str, response_id: str) -> list[StoredResponse]:
        """The records from the conversation's first response down to `response_id`, following
        parent links only (never a fork), in one round trip where the store can; empty when
        `response_id` or one of its ancestors is not stored."""
        ...

    async def get(self, principal: str, response_id: str) -> StoredResponse | None:
        """One record, or None when it is not stored."""
        ...

    async def delete(self, principal: str, response_id: str) -> bool:
        """Forget one response; whether it was stored."""
        ...

    def limit_principal_bytes(self, max_bytes: int | None) -> None:
        """Bound the bytes of records one principal keeps (None: no bound); the middleware
        passes `Limits.max_stored_bytes_per_principal`."""

    async def mark_pending(self, principal: str, response_ids: list[str], seconds: float) -> None:
        """Say, for `seconds`, that these responses are being written (called before `put`)."""

    async def is_pending(self, principal: str, response_id: str) -> bool:
        """Whether `response_id` is being written (`mark_pending`), so a miss waits for it."""
        ...

    async def check(self) -> list[str]:
        """Whether the store can work (the middleware asks at startup): raise naming the
        problem; return warnings about how it is run."""
        ...

    async def aclose(self) -> None:
        """Release connections."""


class QuotaExceeded(Exception):
    """A record was not kept: its conversation alone is larger than the principal's bound
    (`Limits.max_stored_bytes_per_principal`)."""


class ParentNotStored(Exception):
    """A record was not kept: it continues a response the store does not hold and that was
    not deleted (a Redis restarted without persistence, a failover that lost the last
    writes, an eviction), so it would be kept without the ancestors a hydration needs. The
    writer writes the conversation again from its first response."""


async def check_store(store: ResponseStore, seconds: float) -> tuple[str | None, list[str]]:
    """Ask `store` whether it can work (its `check()`, when it has one, within `seconds`):
    what is wrong (its error, as a log line says it) or None, and its warnings."""
    check = getattr(store, "check", None)
    if not callable(check):
        return None, []
    try:
        async with asyncio.timeout(seconds):
            warnings: list[str] = list(await check())
    except TimeoutError as exc:
        return str(exc) or f"{store!r} did not answer within {seconds:g} s", []
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, []
    return None, warnings


def chain_of(records: dict[str, StoredResponse], response_id: str) -> list[StoredResponse] | None:
    """The records from the conversation's first response down to `response_id`, or None when
    one of them is missing (deleted, expired, or never stored)."""
    chain: list[StoredResponse] = []
    current: str | None = response_id
    while current is not None:
        record = records.get(current)
        if record is None or len(chain) > len(records):
            return None
        chain.append(record)
        current = record.parent_id
    chain.reverse()
    return chain


class MemoryStore:
    """A store in this process: for one worker, or tests. Bounded by record count and bytes
    (least recently written out first), by a time to live, and per principal by
    `limit_principal_bytes` (that principal's least recently written conversations out first).
    """

    def __init__(
        self,
        *,
        max_records: int = 100_000,
        max_bytes: int = 1 << 30,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
    ) -> None:
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.ttl_seconds = ttl_seconds
        #: The most bytes one principal's records may hold (None: no bound).
        self.max_principal_bytes: int | None = None
        # (principal, id) -> (record, expires at); chains: (principal, chain id) -> ids
        self._records: OrderedDict[tuple[str, str], tuple[StoredResponse, float]] = OrderedDict()
        self._chains: dict[tuple[str, str], set[str]] = {}
        self._bytes = 0
        # Per principal: its bytes, and its chains least recently written first, with theirs.
        self._principal_bytes: dict[str, int] = {}
        self._principal_chains: dict[str, OrderedDict[str, int]] = {}
        # (principal, id) of responses deleted on purpose, the most recent: continuing one
        # is no sign of a loss (`put`).
        self._deleted: LRUCache[tuple[str, str], bool] = LRUCache(max_records)

    @property
    def bytes(self) -> int:
        """The bytes of the records kept."""
        return self._bytes

    def principal_bytes(self, principal: str) -> int:
        """The bytes of `principal`'s records kept."""
        return self._principal_bytes.get(principal, 0)

    def __len__(self) -> int:
        return len(self._records)

    def limit_principal_bytes(self, max_bytes: int | None) -> None:
        """Bound the bytes of one principal's records (None: no bound)."""
        self.max_principal_bytes = max_bytes

    async def put(self, principal: str, record: StoredResponse) -> int:
        """Keep `record`; how many of the principal's conversations were dropped for it.
        `ParentNotStored` when it continues a response that is not kept (dropped for the
        bounds, or expired) and was not deleted."""
        key = (principal, record.id)
        parent = (principal, record.parent_id) if record.parent_id is not None else None
        if parent is not None and self._live(parent) is None and parent not in self._deleted:
            raise ParentNotStored(f"{record.id} continues {record.parent_id}, which is not kept")
        bound = self.max_principal_bytes
        if bound is not None:
            chains = self._principal_chains.get(principal, OrderedDict())
            entry = self._records.get(key)
            replaced = entry[0].size if entry is not None else 0
            if chains.get(record.chain_id, 0) - replaced + record.size > bound:
                raise QuotaExceeded(
                    f"the conversation would hold more than {bound} bytes "
                    "(Limits.max_stored_bytes_per_principal)"
                )
        self._forget(key)
        self._records[key] = (record, time.monotonic() + self.ttl_seconds)
        self._chains.setdefault((principal, record.chain_id), set()).add(record.id)
        self._bytes += record.size
        self._principal_bytes[principal] = self._principal_bytes.get(principal, 0) + record.size
        chains = self._principal_chains.setdefault(principal, OrderedDict())
        chains[record.chain_id] = chains.get(record.chain_id, 0) + record.size
        chains.move_to_end(record.chain_id)
        dropped = 0
        if bound is not None:
            while self._principal_bytes[principal] > bound:
                oldest = next(iter(chains))  # never the record's own: it was written last
                for member in list(self._chains.get((principal, oldest), ())):
                    self._forget((principal, member))
                dropped += 1
        while self._records and (
            len(self._records) > self.max_records or self._bytes > self.max_bytes
        ):
            self._forget(next(iter(self._records)))
        return dropped

    async def get_chain(self, principal: str, response_id: str) -> dict[str, StoredResponse]:
        """The records of the conversation `response_id` belongs to."""
        found = self._live((principal, response_id))
        if found is None:
            return {}
        chain: dict[str, StoredResponse] = {}
        for member in list(self._chains.get((principal, found.chain_id), ())):
            record = self._live((principal, member))
            if record is not None:
                chain[member] = record
        return chain

    async def get_ancestors(self, principal: str, response_id: str) -> list[StoredResponse]:
        """The records from the first response down to `response_id`, parent links only."""
        chain: list[StoredResponse] = []
        current: str | None = response_id
        while current is not None:
            record = self._live((principal, current))
            if record is None or len(chain) > len(self._records):
                return []
            chain.append(record)
            current = record.parent_id
        chain.reverse()
        return chain

    async def get(self, principal: str, response_id: str) -> StoredResponse | None:
        """One record, or None."""
        return self._live((principal, response_id))

    async def check(self) -> list[str]:
        """Nothing to ask: a store in this process always works."""
        return []

    async def mark_pending(self, principal: str, response_ids: list[str], seconds: float) -> None:
        """Nothing to mark: see `is_pending`."""

    async def is_pending(self, principal: str, response_id: str) -> bool:
        """False: a write lands the moment it runs, and one under way in this process is
        waited for by the hydration itself."""
        return False

    async def delete(self, principal: str, response_id: str) -> bool:
        """Forget one response."""
        forgotten = self._forget((principal, response_id))
        if forgotten:
            self._deleted[(principal, response_id)] = True
        return forgotten

    async def aclose(self) -> None:
        """Nothing to release."""

    def _live(self, key: tuple[str, str]) -> StoredResponse | None:
        entry = self._records.get(key)
        if entry is None:
            return None
        if entry[1] <= time.monotonic():
            self._forget(key)
            return None
        return entry[0]

    def _forget(self, key: tuple[str, str]) -> bool:
        entry = self._records.pop(key, None)
        if entry is None:
            return False
        record = entry[0]
        principal = key[0]
        self._bytes -= record.size
        self._principal_bytes[principal] -= record.size
        if not self._principal_bytes[principal]:
            del self._principal_bytes[principal]
        chains = self._principal_chains[principal]
        chains[record.chain_id] -= record.size
        members = self._chains.get((principal, record.chain_id))
        if members is not None:
            members.discard(record.id)
            if not members:
                del self._chains[(principal, record.chain_id)]
        if (principal, record.chain_id) not in self._chains:
            del chains[record.chain_id]
            if not chains:
                del self._principal_chains[principal]
        return True
