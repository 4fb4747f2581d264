"""Between a connection's cache and the store: hydrating a missing parent, writing a response.

A `previous_response_id` missing from the connection's cache is looked up in the store: one
round trip brings its ancestors (never the conversation's other forks); found whole, they
join the cache and the turn proceeds as a cache hit. A miss waits a bounded moment
(`Limits.store_wait_seconds`) for a write still on its way.

A finished response that may be stored is written without delaying its terminal event: the
write starts before that event is sent and finishes in the background. Writes belong to the
process, not to the connection: a client leaving never cancels one; each is bounded by
`Limits.store_write_seconds`, counted, and logged when it fails; `flush_writes` (the
middleware's drain, on shutdown) waits for those under way.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from cachetools import LRUCache

from ._auth import PrincipalKey, principal_key
from ._cache import CachedResponse, ResponseCache, decoded_size
from ._items import Items
from ._limits import Limits
from ._logs import for_log
from ._stats import Stats
from ._store import ParentNotStored, QuotaExceeded, ResponseStore, StoredResponse, chain_of

logger = logging.getLogger(__name__)

#: The pause before a missing response is looked up once more (a write's marker may be on
#: its way); while a write is known to be under way, each pause doubles, up to
#: `POLL_MAX_SECONDS`, until `Limits.store_wait_seconds` have passed.
POLL_SECONDS = 0.05
POLL_MAX_SECONDS = 0.25
#: How many ids a connection remembers as stored (written or hydrated), so that a response
#: is written with the ancestors that never were (warm-ups) and no others.
STORED_REMEMBERED = 512

#: The store writes under way in this process, every connection's and request's (a write
#: outlives its socket), with the principal scope and the response ids each writes, so a
#: continuation on this worker can wait for its parent's write itself. Event loops in other
#: threads (tests, embedded servers) share it: it is read through snapshots (`list(...)`).
_writes: dict[asyncio.Task[bool], tuple[str, frozenset[str]]] = {}


class _Outage:
    """One store's failing reads, as the log tells them."""

    __slots__ = ("reads_failed", "since")

    def __init__(self) -> None:
        self.since: float | None = None  # when its first call failed (`time.monotonic()`)
        self.reads_failed = 0


#: Each store's outage, if one is under way (a store that cannot be weakly referenced has
#: every failed read logged).
_outages: weakref.WeakKeyDictionary[Any, _Outage] = weakref.WeakKeyDictionary()


def read_failed(store: ResponseStore, message: str, *args: object) -> None:
    """Log a failed read of `store` (a hydration, a stateful HTTP lookup): a warning for the
    first of an outage, a DEBUG line for the next ones, until the store answers again
    (`store_answered`). A down store fails every turn that continues a response: one line
    per failed call would flood the log (63 lines in 6 s were seen); every failure is still
    counted (`ws_mode_store_failures_total`). A failed write loses a response: each is
    logged (`write_records`)."""
    try:
        outage = _outages.setdefault(store, _Outage())
    except TypeError:
        logger.warning(message, *args)
        return
    if outage.since is None:
        outage.since = time.monotonic()
    outage.reads_failed += 1
    if outage.reads_failed == 1:
        logger.warning(
            message + " (the store's next failed reads are logged at DEBUG until it answers "
            "again; ws_mode_store_failures_total counts them all)",
            *args,
        )
    else:
        logger.debug(message, *args)


def _write_failed(store: ResponseStore) -> None:
    """A failed write starts an outage too, so the store's answer again is said."""
    try:
        outage = _outages.setdefault(store, _Outage())
    except TypeError:
        return
    if outage.since is None:
        outage.since = time.monotonic()


def store_answered(store: ResponseStore) -> None:
    """The store answered a read or a write: an outage under way ends, said once."""
    try:
        outage = _outages.get(store)
    except TypeError:
        return
    if outage is None or outage.since is None:
        return
    lasted = time.monotonic() - outage.since
    logger.warning(
        "the store answers again, after %.1f s of failures (%d failed read(s) in that time)",
        lasted,
        outage.reads_failed,
    )
    outage.since, outage.reads_failed = None, 0


class StoreUnavailable(Exception):
    """The store could not answer a hydration. Its message is generic; the store's error is
    its `__cause__`, and was logged."""


def store_scope(principal: Any, key: PrincipalKey | None, *, shared: bool) -> str:
    """Whose stored responses a caller sees: its principal's stable key
    (`ws_mode._auth.principal_key`, with the middleware's `principal_key` function `key`), or
    one scope for every caller when the operator opted into sharing the store. Raise
    `UnkeyedPrincipal` (a refusal with 500) for a principal with no stable key."""
    if shared:
        return "shared"
    return principal_key(principal, key)


async def load_chain(
    store: ResponseStore,
    stats: Stats,
    owner: str,
    response_id: str,
    *,
    read_seconds: float,
    wait: float = 0.0,
) -> list[StoredResponse] | None:
    """The stored conversation from its first response down to `response_id` (its ancestors,
    in one lookup); None when it is not stored whole for `owner`. A miss waits up to `wait`
    seconds for a write on its way: a write under way in this process is waited for itself,
    otherwise the store is looked up again with growing pauses. Raise `StoreUnavailable`
    when the store fails or takes longer than `read_seconds` plus `wait`
    (`Limits.store_read_seconds`, `Limits.store_wait_seconds`)."""
    loop = asyncio.get_running_loop()
    timer: asyncio.Timeout | None = None
    try:
        async with asyncio.timeout(read_seconds + wait) as timer:
            records = await _ancestors(store, owner, response_id)
            deadline = loop.time() + wait
            pause = POLL_SECONDS
            looked_again = False
            while not records and loop.time() < deadline:
                here = [
                    task
                    for task, (whose, ids) in list(_writes.items())
                    if whose == owner and response_id in ids
                ]
                # Looked up once more a moment later (a marker may be on its way), then only
                # while a write is known to be under way: a genuine miss waits no longer.
                if looked_again and not here and not await _pending(store, owner, response_id):
                    break
                left = deadline - loop.time()
                ours = [task for task in here if task.get_loop() is loop]
                if ours:
                    await asyncio.wait(ours, timeout=left)
                else:
                    await asyncio.sleep(min(pause, left))
                    pause = min(pause * 2, POLL_MAX_SECONDS)
                looked_again = True
                records = await _ancestors(store, owner, response_id)
    except Exception as exc:
        stats.store_failures += 1
        read_failed(
            store,
            "the store failed to hydrate %s: %s",
            for_log(response_id),
            failure_at(
                store,
                exc,
                timer,
                f"{read_seconds + wait:g} s (Limits.store_read_seconds + store_wait_seconds)",
            ),
        )
        raise StoreUnavailable("the response store is unavailable") from exc
    store_answered(store)
    return records or None


def failure(exc: BaseException, timer: asyncio.Timeout | None, bound: str) -> str:
    """A store's error as a log line says it: its type and message (`for_log`); a timeout
    (which has no message) as the deadline that passed: ws_mode's own (`timer`, of `bound`)
    or the store's; an error without a message of its own, with its cause's."""
    if isinstance(exc, TimeoutError) and not str(exc):
        if timer is not None and timer.expired():
            return f"TimeoutError: no answer within {bound}"
        return "TimeoutError: no answer within the store's own timeout"
    said = for_log(exc)
    cause = exc.__cause__
    if not str(exc) and cause is not None:
        return f"{said} (caused by {for_log(cause)})"
    return said


def failure_at(
    store: ResponseStore, exc: BaseException, timer: asyncio.Timeout | None, bound: str
) -> str:
    """`failure`, followed by where the store is (`store_address`) unless the error already
    names it (a `RedisStore` error does)."""
    said, address = failure(exc, timer, bound), store_address(store)
    return said if address in said else f"{said} ({address})"


def store_address(store: ResponseStore) -> str:
    """Where `store` is, for a log line, never with its credentials: the store's own
    `address` when it has one; a redis-py client's URL without user name and password
    (`redis://127.0.0.1:6379/0`; a cluster's first nodes); else the store's class."""
    address = getattr(store, "address", None)
    if isinstance(address, str):
        return address[:200]
    client = getattr(store, "client", None)
    try:
        pool = getattr(client, "connection_pool", None)
        kwargs = getattr(pool, "connection_kwargs", None)
        if isinstance(kwargs, dict) and kwargs.get("path"):
            return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
        if isinstance(kwargs, dict) and kwargs.get("host"):
            ssl = "SSL" in getattr(getattr(pool, "connection_class", None), "__name__", "")
            scheme = "rediss" if ssl else "redis"
            return f"{scheme}://{kwargs['host']}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
        get_nodes = getattr(client, "get_nodes", None)
        if callable(get_nodes):
            nodes = [f"{node.host}:{node.port}" for node in get_nodes()]
            shown = ",".join(nodes[:3]) + (f",... ({len(nodes)} nodes)" if len(nodes) > 3 else "")
            return f"a Redis Cluster at {shown}"
    except Exception:  # a client of another shape: its class is all there is to say
        pass
    return type(store).__name__


async def _ancestors(store: ResponseStore, owner: str, response_id: str) -> list[StoredResponse]:
    """`response_id` and its ancestors, root first; empty when one is missing. Stores without
    `get_ancestors` are read whole (`get_chain`)."""
    get_ancestors = getattr(store, "get_ancestors", None)
    if get_ancestors is not None:
        found: list[StoredResponse] = await get_ancestors(owner, response_id)
        return found
    return chain_of(await store.get_chain(owner, response_id), response_id) or []


async def _pending(store: ResponseStore, owner: str, response_id: str) -> bool:
    """Whether another process is writing `response_id` (its marker is set); a store that
    cannot tell is polled for the whole wait."""
    is_pending = getattr(store, "is_pending", None)
    if is_pending is None:
        return True
    pending: bool = await is_pending(owner, response_id)
    return pending


async def read_one(store: ResponseStore, owner: str, response_id: str) -> StoredResponse | None:
    """One stored record (stateful HTTP's `GET`); stores without `get` are read whole."""
    get = getattr(store, "get", None)
    if get is not None:
        found: StoredResponse | None = await get(owner, response_id)
        return found
    return (await store.get_chain(owner, response_id)).get(response_id)


async def write_records(
    store: ResponseStore,
    stats: Stats,
    owner: str,
    *records: StoredResponse,
    seconds: float,
    whole: Callable[[], Sequence[StoredResponse]] | None = None,
) -> bool:
    """Write `records` in order (ancestors first, so a chain is whole once the last lands),
    within `seconds` (`Limits.store_write_seconds`; the marker that announces the write to
    other workers expires with it); whether all landed. When the store no longer holds the
    response they continue (`ParentNotStored`: a restart without persistence, an eviction)
    and no write of it is under way here, `whole()` gives the conversation from its first
    response, and it is written instead. A
    failure, a refusal or a cancellation is logged and counted (`store_failures`,
    `store_refused`), never raised, except the cancellation itself."""
    written = landed = 0  # records of `records` written; records written in all
    waited: set[str | None] = set()  # parents whose write under way was waited for
    mark_pending = getattr(store, "mark_pending", None)
    timer: asyncio.Timeout | None = None
    try:
        async with asyncio.timeout(seconds) as timer:
            if mark_pending is not None:
                # A continuation on another worker that misses waits for these, and only these.
                await mark_pending(owner, [record.id for record in records], seconds)
            while written < len(records):
                try:
                    dropped = await store.put(owner, records[written])
                except ParentNotStored:
                    # The parent's own write may still be on its way (another task): wait
                    # for it and try again, once, before taking the conversation for lost.
                    parent = records[written].parent_id
                    if parent not in waited and await _parents_write(owner, parent):
                        waited.add(parent)
                        continue
                    if whole is None:
                        raise
                    logger.warning(
                        "the store no longer holds the conversation of %s (a restart without "
                        "persistence, a failover or an eviction): writing it again from its "
                        "first response",
                        for_log(records[written].id),
                    )
                    records, written, whole = tuple(whole()), 0, None
                    continue
                written += 1
                landed += 1
                if dropped:
                    stats.store_dropped += dropped
                    logger.warning(
                        "the store dropped %d older conversation(s) of one principal to keep "
                        "%s within Limits.max_stored_bytes_per_principal",
                        dropped,
                        for_log(records[written - 1].id),
                    )
    except QuotaExceeded as exc:
        stats.store_refused += 1
        logger.warning("the store did not keep %s: %s", for_log(records[written].id), for_log(exc))
    except asyncio.CancelledError:
        stats.store_failures += 1
        logger.warning(
            "a store write of %s was cancelled before it landed", for_log(records[-1].id)
        )
        raise
    except Exception as exc:
        stats.store_failures += 1
        _write_failed(store)
        logger.warning(
            "the store failed to keep %s: %s",
            for_log(records[-1].id),
            failure_at(store, exc, timer, f"{seconds:g} s (Limits.store_write_seconds)"),
        )
    finally:
        stats.store_writes += landed
    if written == len(records):
        store_answered(store)
        return True
    return False


async def _parents_write(owner: str, parent_id: str | None) -> bool:
    """Wait for the writes of `parent_id` under way on this event loop (other than the
    running one); whether there were any."""
    loop = asyncio.get_running_loop()
    running = asyncio.current_task()
    under_way = [
        task
        for task, (whose, ids) in list(_writes.items())
        if whose == owner and parent_id in ids and task is not running and task.get_loop() is loop
    ]
    if under_way:
        await asyncio.wait(under_way)
    return bool(under_way)


def start_write(
    store: ResponseStore,
    stats: Stats,
    owner: str,
    *records: StoredResponse,
    seconds: float,
    whole: Callable[[], Sequence[StoredResponse]] | None = None,
) -> asyncio.Task[bool]:
    """Start writing `records` (`write_records`, within `seconds`, with `whole`) as work of the
    process: no connection or request cancels it; `flush_writes` waits for it."""
    task = asyncio.create_task(
        write_records(store, stats, owner, *records, seconds=seconds, whole=whole)
    )
    _writes[task] = (owner, frozenset(record.id for record in records))
    task.add_done_callback(_writes_done)
    return task


def _writes_done(task: asyncio.Task[bool]) -> None:
    _writes.pop(task, None)
    if not task.cancelled():
        task.exception()  # write_records() raises nothing else: retrieved, never "never retrieved"


def _writes_here() -> list[asyncio.Task[bool]]:
    """The store writes under way on this event loop (a snapshot)."""
    loop = asyncio.get_running_loop()
    return [task for task in list(_writes) if task.get_loop() is loop]


def pending_writes() -> int:
    """How many store writes are under way on this event loop."""
    return len(_writes_here())


async def flush_writes(seconds: float) -> None:
    """Wait for the store writes under way on this event loop, at most `seconds` (the
    middleware's `Limits.store_write_seconds`, within which each of its writes ends)."""
    tasks = _writes_here()
    if not tasks:
        return
    logger.info("waiting for %d store write(s) to land before shutting down", len(tasks))
    _done, pending = await asyncio.wait(tasks, timeout=seconds)
    if pending:
        logger.warning("%d store write(s) had not landed when the shutdown went on", len(pending))


class StoreLink:
    """One connection's use of the store."""

    def __init__(self, store: ResponseStore, stats: Stats, scope: str, limits: Limits) -> None:
        self.store = store
        self.stats = stats
        self.scope = scope
        #: How long a hydration and a write may take, and a miss wait for a write on its way.
        self.limits = limits
        # Responses of this connection known to be in the store (written or hydrated).
        self._stored: LRUCache[str, bool] = LRUCache(STORED_REMEMBERED)

    async def hydrate(
        self, response_id: str, stream_id: str | None, cache: ResponseCache
    ) -> CachedResponse | None:
        """The stored conversation up to `response_id`, put in `cache`; None when it is not
        stored whole for this scope. Raise `StoreUnavailable` when the store fails. A chain
        the cache does not keep (too large, or the memory budget full) is returned held by
        nothing (`holders` 0): the turn using it reserves it itself."""
        limits = self.limits
        chain = await load_chain(
            self.store,
            self.stats,
            self.scope,
            response_id,
            read_seconds=limits.store_read_seconds,
            wait=limits.store_wait_seconds,
        )
        if chain is None:
            return None
        cached = cache.get(response_id)
        if cached is not None:
            # Another lane hydrated it meanwhile: one copy, the one the cache counts.
            return cached
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
                conversation_key=record.conversation_key,
            )
            self._stored[record.id] = True
        assert node is not None  # a chain holds at least the response asked for
        cache.put(node)
        self.stats.store_hydrations += 1
        return node

    def write(self, node: CachedResponse) -> asyncio.Task[bool] | None:
        """Start writing a response the handler answered, when it may be stored, with those
        of its ancestors that were never written (warm-ups: the handler saw them only as part
        of this response's context), so the chain is whole in the store. The write is the
        process's (`start_write`): the task is returned for information only."""
        if not node.storable or node.remote:
            return None
        nodes = [node]
        parent = node.parent
        while parent is not None and self._stored.get(parent.id) is None:
            nodes.append(parent)
            parent = parent.parent
        for each in nodes:
            self._stored[each.id] = True
        records = [_record(each) for each in reversed(nodes)]

        def whole() -> list[StoredResponse]:
            """The conversation from its first response: for a store that lost it."""
            chain: list[CachedResponse] = []
            current: CachedResponse | None = node
            while current is not None:
                chain.append(current)
                current = current.parent
            return [_record(each) for each in reversed(chain)]

        task = start_write(
            self.store,
            self.stats,
            self.scope,
            *records,
            seconds=self.limits.store_write_seconds,
            whole=whole,
        )
        ids = [each.id for each in nodes]

        def landed(task: asyncio.Task[bool]) -> None:
            if task.cancelled() or not task.result():
                # Not (all) stored: the next response of the chain writes them again, so a
                # store that was down a moment does not leave the chain broken.
                for response_id in ids:
                    self._stored.pop(response_id, None)

        task.add_done_callback(landed)
        return task


def _record(node: CachedResponse) -> StoredResponse:
    parent = node.parent
    return StoredResponse(
        id=node.id,
        parent_id=parent.id if parent is not None else None,
        chain_id=node.chain_id,
        input=node.input_fragment,
        output=node.output_fragment,
        response=orjson.dumps(node.response),
        tools_digest=node.tools_digest,
        conversation_key=node.conversation_key,
    )
