"""Between a connection's cache and the store: hydrating a missing parent, writing a response.

A `previous_response_id` missing from the connection's cache is looked up in the store (one
round trip for the whole conversation); found and whole, its chain joins the cache and the turn
proceeds as a cache hit. A finished response that may be stored is written without delaying
its terminal event: the write starts before that event is sent and finishes in the background.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson

from .auth import PrincipalKey, principal_key
from .cache import CachedResponse, ResponseCache, decoded_size
from .items import Items
from .logs import for_log
from .stats import Stats
from .store import ResponseStore, StoredResponse, chain_of

__all__ = ["StoreLink", "StoreUnavailable", "keep", "load_chain", "store_scope"]

logger = logging.getLogger(__name__)

#: The longest a hydration may take, whatever the store's own timeouts.
HYDRATE_SECONDS = 5.0
#: The longest a write may take (off every client's path).
WRITE_SECONDS = 15.0
#: A miss is looked up once more after this long: a response finished on another worker a
#: moment ago may still be on its way into the store.
RACE_SECONDS = 0.05


class StoreUnavailable(Exception):
    """The store could not answer a hydration. Its message is generic; the store's error is
    its `__cause__`, and was logged."""


def store_scope(principal: Any, key: PrincipalKey | None, *, shared: bool) -> str:
    """Whose stored responses a caller sees: its principal's stable key
    (`ws_mode.auth.principal_key`, with the middleware's `principal_key` function `key`), or
    one scope for every caller when the operator opted into sharing the store. Raise
    `UnkeyedPrincipal` (a refusal with 500) for a principal with no stable key."""
    if shared:
        return "shared"
    return principal_key(principal, key)


async def load_chain(
    store: ResponseStore, stats: Stats, owner: str, response_id: str
) -> list[StoredResponse] | None:
    """The stored conversation from its first response down to `response_id`, in one lookup
    (and one more a moment later on a miss); None when it is not stored whole for `owner`.
    Raise `StoreUnavailable` when the store fails or takes too long."""
    try:
        async with asyncio.timeout(HYDRATE_SECONDS):
            records = await store.get_chain(owner, response_id)
            if response_id not in records:
                await asyncio.sleep(RACE_SECONDS)
                records = await store.get_chain(owner, response_id)
    except Exception as exc:
        stats.store_failures += 1
        logger.warning("the store failed to hydrate %s: %s", for_log(response_id), for_log(exc))
        raise StoreUnavailable("the response store is unavailable") from exc
    return chain_of(records, response_id)


async def keep(store: ResponseStore, stats: Stats, owner: str, record: StoredResponse) -> None:
    """Write `record`; a failure is logged and counted, never raised."""
    try:
        async with asyncio.timeout(WRITE_SECONDS):
            await store.put(owner, record)
    except Exception as exc:
        stats.store_failures += 1
        logger.warning("the store failed to keep %s: %s", for_log(record.id), for_log(exc))
        return
    stats.store_writes += 1


class StoreLink:
    """One connection's use of the store."""

    def __init__(self, store: ResponseStore, stats: Stats, scope: str) -> None:
        self.store = store
        self.stats = stats
        self.scope = scope

    async def hydrate(
        self, response_id: str, stream_id: str | None, cache: ResponseCache
    ) -> CachedResponse | None:
        """The stored conversation up to `response_id`, put in `cache`; None when it is not
        stored whole for this scope. Raise `StoreUnavailable` when the store fails."""
        chain = await load_chain(self.store, self.stats, self.scope, response_id)
        if chain is None:
            return None
        node: CachedResponse | None = None
        for record in chain:
            node = CachedResponse(
                id=record.id,
                response=orjson.loads(record.response),
                input_items=Items(fragment=record.input),
                output_items=orjson.loads(b"[" + record.output + b"]"),
                parent=node,
                stream_id=stream_id,
                tools_digest=record.tools_digest,
                input_fragment=record.input,
                size=decoded_size(record.response),
                storable=True,
            )
        assert node is not None  # a chain holds at least the response asked for
        cache.put(node)
        self.stats.store_hydrations += 1
        return node

    def write(self, node: CachedResponse) -> asyncio.Task[None] | None:
        """Start writing `node` when it may be stored; the task, to be tracked by the caller."""
        if not node.storable or node.remote:
            return None
        parent = node.parent
        record = StoredResponse(
            id=node.id,
            parent_id=parent.id if parent is not None else None,
            chain_id=node.chain_id,
            input=node.input_fragment,
            output=node.output_fragment,
            response=orjson.dumps(node.response),
            tools_digest=node.tools_digest,
        )
        return asyncio.create_task(keep(self.store, self.stats, self.scope, record))
