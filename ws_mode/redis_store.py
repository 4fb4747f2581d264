"""A response store in Redis: stored responses shared by every worker and host.

`RedisStore` implements `ws_mode._store.ResponseStore` with `redis.asyncio` (install the
`redis` extra: `pip install ".[redis]"` in a clone of ws_mode), on one Redis (`redis://`), a
Redis Cluster (`redis+cluster://`) or the master Sentinels follow across failovers
(`redis+sentinel://`); the URLs are in `ws_mode._redis_clients`. Keys are scoped by a digest of
the principal, never the principal itself::

    {prefix}:{<principal digest>}:r:<response id>  ->  the response's chain id (a string)
    {prefix}:{<principal digest>}:c:<chain id>     ->  a hash: response id -> record bytes
                                                       (encrypted with `encryption_keys`)
    {prefix}:{<principal digest>}:p:<response id>  ->  "being written" (`mark_pending`)

and, while a bound per principal is set (`limit_principal_bytes`, which the middleware sets
from `Limits.max_stored_bytes_per_principal`), the principal's account::

    {prefix}:{<principal digest>}:a:bytes          ->  the bytes of its records
    {prefix}:{<principal digest>}:a:chains         ->  a sorted set: chain id -> last write (µs)
    {prefix}:{<principal digest>}:a:chain_bytes    ->  a hash: chain id -> its bytes

The digest is a Redis Cluster hash tag, so one principal's keys share a slot: the scripts
find a chain's hash from an index key, so they cannot declare it in KEYS, but on a cluster
it is always on the node that runs them (a `{` in the prefix moves the tag, yet every key of
a principal still shares the text up to the digest's `}`, so the slot stays one). Each call is
one round trip, a Lua script (EVALSHA): a write updates the account in the same script,
atomically. The middleware marks a write's responses as being written (`mark_pending`, one
pipelined round trip) before it writes them, so that a continuation on another worker waits
for a write on its way and a genuine miss does not. A hydration walks the `parent_id` links
inside Redis and returns the ancestors only, never the other forks. Every key expires
`ttl_seconds` after it was last written; a chain's hash is written by every `put` to it, so
an active conversation stays whole. A `put` that continues a response Redis does not hold (a
restart without persistence, a failover that lost the last writes, an eviction) writes
nothing and raises `ParentNotStored`, so the middleware writes the conversation again from
its first response instead of leaving a response whose ancestors are gone; a deleted
response leaves a tombstone in its chain's hash (a field named by a NUL and its id), so
continuing it is no sign of a loss and never brings it back.

Every lookup is bounded by `timeout` seconds and every write by `write_timeout` (a deadline
over the whole call, retries and the wait for a connection included): a stopped or stalled
Redis raises `RedisStoreError` or `TimeoutError` instead of hanging, which the middleware
turns into an error event. Writes get longer: they are off every client's path, and a busy
worker reads replies late (with a one-second bound, half the writes of 200 busy sockets
failed). On a cluster or a Sentinel's master a call that meets a failover (a node down,
CLUSTERDOWN, a former master now read-only, no master named yet) is sent again after growing
pauses until its deadline; on one Redis a call fails at once, since a Redis that is down
stays down. At most `max_connections` calls are in flight at once (the pool's size, per node
on a cluster): the others wait for a connection within their deadline, never fail for the
lack of one. `check()` asks Redis, at startup, whether the store can work at all.

Replication is asynchronous: a write the master acknowledged may be lost by a failover. With
`wait_replicas` (not on a cluster; the keyword, or `?wait_replicas=N` in the URL) a write and
a delete are followed by `WAIT` on the same connection, in the same round trip, and count
only once that many replicas confirmed them; otherwise they are sent again until their
deadline (both are idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

from cachetools import LRUCache

from ._encryption import RecordCodec, RecordUnreadable, codec_of
from ._errors import ConfigError
from ._install import install_hint
from ._logs import for_log
from ._store import DEFAULT_TTL_SECONDS, ParentNotStored, QuotaExceeded, StoredResponse

if TYPE_CHECKING:
    from redis.asyncio import Redis, RedisCluster
    from redis.commands.core import AsyncScript

    from ._redis_clients import Kind

__all__ = ["RedisStore", "RedisStoreError"]

T = TypeVar("T")

logger = logging.getLogger(__name__)

#: KEYS[1]: the response's index key; ARGV[1]: the chain hashes' key prefix. The chain's
#: hash as a flat field, value list, or an empty list when the response is not stored.
_GET_CHAIN = """
local chain = redis.call('GET', KEYS[1])
if not chain then return {} end
return redis.call('HGETALL', ARGV[1] .. chain)
"""

#: KEYS[1]: the response's index key; ARGV[1]: the chain hashes' key prefix, ARGV[2]: the
#: response id. Its record and its ancestors', from it up to the first response, following
#: the `parent_id` in each record's first line (never a fork); empty when one is missing.
_GET_ANCESTORS = """
local chain = redis.call('GET', KEYS[1])
if not chain then return {} end
local hash = ARGV[1] .. chain
local most = redis.call('HLEN', hash)
local found = {}
local id = ARGV[2]
while id do
  local record = redis.call('HGET', hash, id)
  if not record or #found >= most then return {} end
  found[#found + 1] = record
  local head = string.sub(record, 1, (string.find(record, '\\n', 1, true) or 0) - 1)
  local parent = cjson.decode(head)['parent_id']
  if type(parent) == 'string' then id = parent else id = nil end
end
return found
"""

#: KEYS[1]: the response's index key; ARGV[1]: the chain hashes' key prefix, ARGV[2]: the
#: response id. Its record, or nil.
_GET = """
local chain = redis.call('GET', KEYS[1])
if not chain then return false end
return redis.call('HGET', ARGV[1] .. chain, ARGV[2])
"""

#: KEYS: the response's index key, its chain's hash, the principal's byte count, its chains
#: by last write (a sorted set, scored in microseconds, strictly increasing), their bytes (a
#: hash). ARGV: the chain id, the response id, the record, the time to live in milliseconds,
#: the principal's bound in bytes (negative: none, and no account is kept), the principal's
#: key prefix, the id of the response the record continues ("" for none).
#: Returns how many of the principal's chains were dropped for the bound (least recently
#: written first, never the record's own), -1 when the record's own chain would exceed
#: it, or -2 when the response it continues is not in its chain's hash and was not deleted
#: (a tombstone, `_DELETE`'s): lost (nothing is written in either case). One script call:
#: atomic, and cheaper for the client than a MULTI/EXEC of the same commands (about half the
#: CPU). Chains whose hash expired stop counting at the principal's next write.
_PUT = """
local TOMBSTONE = '\\0'
if ARGV[7] ~= '' and redis.call('HEXISTS', KEYS[2], ARGV[7]) == 0
  and redis.call('HEXISTS', KEYS[2], TOMBSTONE .. ARGV[7]) == 0 then
  return -2
end
local ttl = tonumber(ARGV[4])
local bound = tonumber(ARGV[5])
if bound < 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
  redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
  redis.call('PEXPIRE', KEYS[2], ttl)
  return 0
end
local prefix = ARGV[6]
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2]
if last and tonumber(last) >= now then now = tonumber(last) + 1 end
for _, chain in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now - ttl * 1000)) do
  if redis.call('EXISTS', prefix .. 'c:' .. chain) == 0 then
    redis.call('DECRBY', KEYS[3], tonumber(redis.call('HGET', KEYS[5], chain) or '0'))
    redis.call('HDEL', KEYS[5], chain)
    redis.call('ZREM', KEYS[4], chain)
  end
end
local added = string.len(ARGV[3]) - redis.call('HSTRLEN', KEYS[2], ARGV[2])
local own = tonumber(redis.call('HGET', KEYS[5], ARGV[1]) or '0') + added
if own > bound then return -1 end
local total = tonumber(redis.call('GET', KEYS[3]) or '0') + added
local dropped = 0
while total > bound do
  local oldest = redis.call('ZRANGE', KEYS[4], 0, 1)
  local chain = oldest[1]
  if chain == ARGV[1] then chain = oldest[2] end
  if not chain then break end
  local hash = prefix .. 'c:' .. chain
  for _, id in ipairs(redis.call('HKEYS', hash)) do
    redis.call('DEL', prefix .. 'r:' .. id)
  end
  redis.call('DEL', hash)
  total = total - tonumber(redis.call('HGET', KEYS[5], chain) or '0')
  redis.call('HDEL', KEYS[5], chain)
  redis.call('ZREM', KEYS[4], chain)
  dropped = dropped + 1
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('HSET', KEYS[5], ARGV[1], own)
redis.call('PEXPIRE', KEYS[5], ttl)
redis.call('ZADD', KEYS[4], now, ARGV[1])
redis.call('PEXPIRE', KEYS[4], ttl)
redis.call('SET', KEYS[3], total, 'PX', ttl)
return dropped
"""

#: KEYS[1]: the response's index key, KEYS[2..4]: the principal's byte count, chains by
#: last write and their bytes (as for _PUT); ARGV[1]: the chain hashes' key prefix; ARGV[2]:
#: the response id; ARGV[3]: the time to live in milliseconds. 1 when the response was
#: stored, else 0. Its record gives way to a tombstone (an empty field), so a later
#: continuation of it is not taken for a loss and the deleted response is never written
#: again; the tombstone goes with its chain's hash.
_DELETE = """
local TOMBSTONE = '\\0'
local chain = redis.call('GET', KEYS[1])
if not chain then return 0 end
local hash = ARGV[1] .. chain
local size = redis.call('HSTRLEN', hash, ARGV[2])
redis.call('DEL', KEYS[1])
redis.call('HDEL', hash, ARGV[2])
redis.call('HSET', hash, TOMBSTONE .. ARGV[2], '')
if redis.call('PTTL', hash) < 0 then redis.call('PEXPIRE', hash, ARGV[3]) end
if size > 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  if redis.call('HINCRBY', KEYS[4], chain, -size) <= 0 then
    redis.call('HDEL', KEYS[4], chain)
    redis.call('ZREM', KEYS[3], chain)
  end
  if redis.call('DECRBY', KEYS[2], size) <= 0 then
    redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
  end
end
return 1
"""


def principal_digest(principal: str) -> str:
    """What stands for `principal` in key names: the first 32 hex digits of its SHA-256."""
    return hashlib.sha256(principal.encode()).hexdigest()[:32]


#: The first pause before a call that met a failover is sent again; each pause doubles, up to
#: `RETRY_PAUSE_MAX_SECONDS`, until the call's deadline.
RETRY_PAUSE_SECONDS: Final = 0.05
RETRY_PAUSE_MAX_SECONDS: Final = 0.5
#: What a chain's hash names a deleted response's tombstone by: a NUL, then its id.
TOMBSTONE: Final = b"\0"
#: How long one try of a write waits for its replicas (`wait_replicas`), at most.
REPLICA_WAIT_MS: Final = 1000
#: How long the key `check()` writes lives.
CHECK_KEY_MS: Final = 10_000
#: Records that could not be read (`RecordUnreadable`) a store remembers: each is warned about
#: once, its next misses (a miss is looked up again while a write may be on its way, and a
#: client may retry) logged at DEBUG.
UNREADABLE_REMEMBERED: Final = 1024


class RedisStoreError(Exception):
    """A call to Redis failed. The message says what failed and where (a URL without
    credentials), and what to do when there is something to do (`redis://` naming a cluster
    node: use `redis+cluster://`); redis-py's own exception is its `__cause__`."""


class RedisStore:
    """Stored responses in Redis, scoped by principal, with a time to live.

    `url` names one Redis (`redis://`, `rediss://`, `unix://`: redis-py's URLs; a password
    or a database number goes in it), a Redis Cluster (`redis+cluster://host:port,...`) or the
    master that Sentinels follow (`redis+sentinel://host:26379,.../service`), with TLS as
    `rediss+cluster://` and `rediss+sentinel://`. Connections come from a pool of at most
    `max_connections` (to each node of a cluster); a call that finds them all busy waits for
    one. A connection found broken (Redis restarted) is replaced and the command sent once
    more, at once; on a cluster or a Sentinel's master a call that meets a failover is sent
    again after growing pauses; every lookup, waiting and retries included, ends within
    `timeout` seconds, every write within `write_timeout`, with `RedisStoreError` (what went
    wrong, and where) or `TimeoutError`. With `wait_replicas`, a write lands only once that
    many replicas confirmed it (Redis `WAIT`), so a failover does not lose it; the URL can say
    it instead (`redis://host:6379/0?wait_replicas=1`, for a store named by its URL alone), and
    a keyword that disagrees with the URL is a ValueError naming both. With `encryption_keys`
    (newest first; or `?encryption_keys_env=NAME`, the environment variable holding them) every
    record is encrypted at rest (`ws_mode._encryption`); a record that cannot be read is not
    stored, with a warning.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "ws_mode",
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        timeout: float = 2.0,
        write_timeout: float = 10.0,
        max_connections: int = 64,
        wait_replicas: int | None = None,
        encryption_keys: Sequence[bytes | str] | None = None,
        read_plaintext: bool | None = None,
    ) -> None:
        try:
            from ._redis_clients import open_client, store_options, wait_replicas_of
        except ImportError as error:  # pragma: no cover - the extra is not installed
            raise ImportError(f"RedisStore needs redis-py: {install_hint('redis')}") from error

        _check_bounds(ttl_seconds, timeout, write_timeout)
        try:
            replicas = wait_replicas_of(url, wait_replicas)  # checked before a client is made
            in_url = store_options(url)[1]
        except ValueError as error:  # what is wrong with the URL, without its credentials
            raise ConfigError(f"RedisStore: {error}") from None
        codec = codec_of(
            encryption_keys, read_plaintext, in_url.encryption_keys_env, in_url.read_plaintext
        )
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        try:
            endpoint = open_client(
                url,
                max_connections=max_connections,
                # Each call has its own deadline (`timeout` or `write_timeout`) over all of it.
                timeout=max(timeout, write_timeout),
                connect_timeout=timeout,
            )
        except ValueError as error:
            raise ConfigError(f"RedisStore: {error}") from None
        self._setup(
            endpoint.client,
            kind=endpoint.kind,
            where=endpoint.where,
            closers=endpoint.closers,
            bound=max_connections,
            prefix=prefix,
            ttl_seconds=ttl_seconds,
            timeout=timeout,
            write_timeout=write_timeout,
            wait_replicas=replicas,
            codec=codec,
        )

    @classmethod
    def from_client(
        cls,
        client: Redis | RedisCluster,
        *,
        prefix: str = "ws_mode",
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        timeout: float = 2.0,
        write_timeout: float = 10.0,
        wait_replicas: int = 0,
        encryption_keys: Sequence[bytes | str] | None = None,
        read_plaintext: bool = False,
    ) -> RedisStore:
        """A store on a client the caller configured: a `redis.asyncio.Redis` (TLS, a shared
        pool...), a `redis.asyncio.RedisCluster`, or the master client of a Sentinel
        (`Sentinel(...).master_for(service)`).

        The client must not decode responses. The caller keeps owning it: `aclose` leaves it
        open. Its socket timeouts are its own; each call is still bounded by `timeout`. The
        store keeps its calls in flight within the client's own `max_connections` (per node
        of a cluster), so they wait for a connection rather than fail for the lack of one.
        `encryption_keys` and `read_plaintext` are as for the constructor.
        """
        from ._redis_clients import client_bound, describe_client

        _check_bounds(ttl_seconds, timeout, write_timeout)
        codec = codec_of(encryption_keys, read_plaintext)
        kind, where = describe_client(client)
        store = cls.__new__(cls)
        store._setup(
            client,
            kind=kind,
            where=where,
            closers=(),
            bound=client_bound(client),
            prefix=prefix,
            ttl_seconds=ttl_seconds,
            timeout=timeout,
            write_timeout=write_timeout,
            wait_replicas=wait_replicas,
            codec=codec,
        )
        return store

    def _setup(
        self,
        client: Redis | RedisCluster,
        *,
        kind: Kind,
        where: str,
        closers: tuple[Callable[[], Awaitable[None]], ...],
        bound: int | None,
        prefix: str,
        ttl_seconds: float,
        timeout: float,
        write_timeout: float,
        wait_replicas: int,
        codec: RecordCodec,
    ) -> None:
        from ._redis_clients import ERRORS, check_replicas

        check_replicas(wait_replicas, kind)
        self._codec = codec
        #: The ids of the encryption keys, newest first (empty: records are kept in plain).
        self.encryption_key_ids: tuple[str, ...] = codec.key_ids
        #: Whether an encrypting store reads plaintext records (while it moves to encryption).
        self.read_plaintext = codec.read_plaintext and codec.encrypts
        self._warned: LRUCache[tuple[str, str], bool] = LRUCache(UNREADABLE_REMEMBERED)

        self.client = client
        #: What the store reaches: "redis" (one Redis), "cluster" or "sentinel".
        self.kind: Kind = kind
        #: Where, as a URL without credentials or options (in `repr` and in errors).
        self.where = where
        self.prefix = prefix
        self.ttl_seconds = ttl_seconds
        self.timeout = timeout
        self.write_timeout = write_timeout
        #: How many replicas must confirm a write (Redis `WAIT`) before it counts as landed.
        self.wait_replicas = wait_replicas
        # How long one try waits for them (a write is tried again until its deadline).
        self._wait_ms = max(1, min(REPLICA_WAIT_MS, round(write_timeout * 250)))
        self._closers = closers
        self._bound = bound
        self._errors = ERRORS
        # One gate per event loop (an asyncio.Semaphore belongs to one).
        self._gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        # Redis expiries are whole milliseconds, at least one.
        self._ttl_ms = max(1, round(ttl_seconds * 1000))
        #: The most bytes one principal's records may hold (None: no bound, no account kept).
        self.max_principal_bytes: int | None = None
        self._put: AsyncScript = client.register_script(_PUT)
        self._get_chain: AsyncScript = client.register_script(_GET_CHAIN)
        self._get_ancestors: AsyncScript = client.register_script(_GET_ANCESTORS)
        self._get: AsyncScript = client.register_script(_GET)
        self._delete: AsyncScript = client.register_script(_DELETE)

    def limit_principal_bytes(self, max_bytes: int | None) -> None:
        """Bound the bytes of one principal's records (None: no bound). The account is kept
        by the writes made while a bound is set."""
        self.max_principal_bytes = max_bytes

    def index_key(self, principal: str, response_id: str) -> str:
        """The key naming the chain of `principal`'s response `response_id`."""
        return f"{self._scope(principal)}r:{response_id}"

    def chain_key(self, principal: str, chain_id: str) -> str:
        """The key of the hash holding `principal`'s records of the chain `chain_id`."""
        return f"{self._scope(principal)}c:{chain_id}"

    def account_keys(self, principal: str) -> list[str]:
        """The keys of `principal`'s account: its byte count, its chains by last write, their
        bytes."""
        scope = self._scope(principal)
        return [f"{scope}a:bytes", f"{scope}a:chains", f"{scope}a:chain_bytes"]

    def _scope(self, principal: str) -> str:
        return f"{self.prefix}:{{{principal_digest(principal)}}}:"

    async def put(self, principal: str, record: StoredResponse) -> int:
        """Keep `record`: its index key and its chain's hash live `ttl_seconds` from now.
        Returns how many of the principal's conversations were dropped to keep it within its
        bound; raises `QuotaExceeded` (and writes nothing) when its own conversation would
        not fit, and `ParentNotStored` (and writes nothing) when it continues a response Redis
        does not hold (and that was not deleted)."""
        chain_key = self.chain_key(principal, record.chain_id)
        keys = [self.index_key(principal, record.id), chain_key, *self.account_keys(principal)]
        bound = self.max_principal_bytes
        args: list[str | bytes | int] = [
            record.chain_id,
            record.id,
            self._codec.encode(principal, record),
            self._ttl_ms,
            -1 if bound is None else bound,
            self._scope(principal),
            record.parent_id or "",
        ]

        async def write() -> int:
            if not self.wait_replicas:
                return int(await self._put(keys=keys, args=args))
            reply, confirmed = await self._confirmed(self._put, keys, args)
            if int(reply) >= 0:  # written (-1, -2: nothing was)
                self._replicated(confirmed)
            return int(reply)

        dropped = await self._call(write, self.write_timeout)
        if dropped == -2:
            from ._redis_clients import brief

            raise ParentNotStored(
                f"{record.id} continues {record.parent_id}, which {brief(self.where)} does not "
                "hold (lost in a restart without persistence, a failover or an eviction)"
            )
        if dropped < 0:
            raise QuotaExceeded(
                f"the conversation would hold more than {bound} bytes "
                "(Limits.max_stored_bytes_per_principal)"
            )
        return dropped

    async def get_chain(self, principal: str, response_id: str) -> dict[str, StoredResponse]:
        """The records of the conversation `response_id` belongs to, by id (empty when it is
        not stored), in one round trip."""
        keys = [self.index_key(principal, response_id)]
        args = [self.chain_key(principal, "")]
        reply = await self._call(lambda: self._get_chain(keys=keys, args=args))
        fields: list[bytes] = list(reply or ())
        chain: dict[str, StoredResponse] = {}
        unreadable: list[tuple[str, RecordUnreadable]] = []
        for name, value in zip(fields[::2], fields[1::2], strict=True):
            if not name.startswith(TOMBSTONE):  # a deleted response's
                member = name.decode(errors="replace")
                try:
                    chain[member] = self._codec.decode(principal, member, value)
                except RecordUnreadable as exc:
                    unreadable.append((member, exc))
        if unreadable:
            self._unreadable(principal, *unreadable[0], len(unreadable))
        # The index outlived its record (written by hand, or a partial failure): not stored.
        return chain if response_id in chain else {}

    async def get_ancestors(self, principal: str, response_id: str) -> list[StoredResponse]:
        """The records from the conversation's first response down to `response_id`,
        following parent links in Redis (one round trip; forks are never read); empty when
        one of them is not stored."""
        keys = [self.index_key(principal, response_id)]
        args = [self.chain_key(principal, ""), response_id]
        reply = await self._call(lambda: self._get_ancestors(keys=keys, args=args))
        found: list[StoredResponse] = []
        expected: str | None = response_id  # the id each record was read under, in turn
        for value in list(reply or ()):
            if expected is None:  # more records than parent links: not this conversation's
                self._unreadable(principal, response_id, RecordUnreadable("a broken parent link"))
                return []
            try:
                record = self._codec.decode(principal, expected, value)
            except RecordUnreadable as exc:
                self._unreadable(principal, expected, exc)
                return []
            found.append(record)
            expected = record.parent_id
        found.reverse()
        return found

    async def get(self, principal: str, response_id: str) -> StoredResponse | None:
        """One record, or None when it is not stored (one round trip)."""
        keys = [self.index_key(principal, response_id)]
        args = [self.chain_key(principal, ""), response_id]
        reply = await self._call(lambda: self._get(keys=keys, args=args))
        if not reply:
            return None
        try:
            return self._codec.decode(principal, response_id, reply)
        except RecordUnreadable as exc:
            self._unreadable(principal, response_id, exc)
            return None

    def _unreadable(
        self, principal: str, response_id: str, error: RecordUnreadable, count: int = 1
    ) -> None:
        """Log a stored record read as not stored because it cannot be read: one WARNING per
        record (while `UNREADABLE_REMEMBERED` remembers it), DEBUG after."""
        others = f" (and {count - 1} more of its conversation)" if count > 1 else ""
        seen = (principal, response_id)
        level = logging.DEBUG if seen in self._warned else logging.WARNING
        self._warned[seen] = True
        logger.log(
            level,
            "a stored response cannot be read and is taken as not stored: %s%s: %s",
            for_log(response_id),
            others,
            error,
        )

    def pending_key(self, principal: str, response_id: str) -> str:
        """The key saying `principal`'s response `response_id` is being written."""
        return f"{self._scope(principal)}p:{response_id}"

    async def mark_pending(self, principal: str, response_ids: list[str], seconds: float) -> None:
        """Mark responses as being written for `seconds` (one round trip), so a continuation
        on another worker that misses them waits for their write, and a genuine miss does
        not wait."""
        ms = max(1, round(seconds * 1000))
        keys = [self.pending_key(principal, response_id) for response_id in response_ids]

        async def mark() -> None:
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.set(key, b"1", px=ms)
            await pipe.execute()

        await self._call(mark, self.write_timeout)

    async def is_pending(self, principal: str, response_id: str) -> bool:
        """Whether `response_id` is being written."""
        key = self.pending_key(principal, response_id)
        found = await self._call(lambda: self.client.exists(key))
        return bool(found)

    async def delete(self, principal: str, response_id: str) -> bool:
        """Forget one response (the rest of its chain stays); whether it was stored."""
        keys = [self.index_key(principal, response_id), *self.account_keys(principal)]
        args: list[str | int] = [self.chain_key(principal, ""), response_id, self._ttl_ms]
        removed_before = False  # by a try whose replicas did not all confirm it

        async def delete() -> bool:
            nonlocal removed_before
            if not self.wait_replicas:
                return bool(await self._delete(keys=keys, args=args))
            reply, confirmed = await self._confirmed(self._delete, keys, args)
            removed_before = removed_before or bool(reply)
            self._replicated(confirmed)
            return removed_before

        return await self._call(delete, self.write_timeout if self.wait_replicas else None)

    async def _confirmed(
        self, script: AsyncScript, keys: Sequence[str], args: Sequence[str | bytes | int]
    ) -> tuple[Any, int]:
        """Run `script` (a write), then `WAIT`, in one round trip on one connection: the
        script's reply, and how many replicas confirmed the write within one try's wait."""
        from redis.exceptions import NoScriptError

        for _ in range(2):
            # Not the script object's pipelining: it asks SCRIPT EXISTS first, on every call,
            # and a failure there leaves the pipeline's connection out of the pool for good.
            pipe: Any = self.client.pipeline(transaction=False)
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            pipe.execute_command("WAIT", self.wait_replicas, self._wait_ms)
            try:
                reply, confirmed = await pipe.execute()  # releases its connection
            except NoScriptError:  # a master that never ran it (promoted, restarted)
                await self.client.script_load(script.script)
                continue
            return reply, int(confirmed)
        raise RuntimeError("Redis forgot the store's script as soon as it was loaded")

    def _replicated(self, confirmed: int) -> None:
        """Raise `TooFewReplicas` (sent again until the call's deadline) unless `confirmed`
        replicas are enough."""
        if confirmed < self.wait_replicas:
            from ._redis_clients import TooFewReplicas

            raise TooFewReplicas(
                f"{confirmed} of the {self.wait_replicas} replica(s) asked for confirmed a "
                f"write within {self._wait_ms} ms"
            )

    async def check(self) -> list[str]:
        """Ask Redis whether the store can work, as the middleware does at startup: it
        answers (the address, TLS, the credentials and the database are right), it is what
        the URL says (not a cluster node named as one Redis, nor a read-only replica; a
        cluster that serves every slot), it runs the store's Lua scripts (loaded now) and it
        takes a write. Raise `RedisStoreError` or `TimeoutError` naming the problem; return
        warnings about how Redis is run (a Redis that keeps nothing on disk loses every
        stored response when it restarts; a master with fewer replicas following it than
        `wait_replicas` asks for fails every write)."""
        from redis.asyncio import RedisCluster

        client = self.client
        await self._call(lambda: client.ping())  # connects: address, TLS, credentials, db
        nodes: list[object] = [None]
        warnings: list[str] = []
        if isinstance(client, RedisCluster):
            state = await self._call(lambda: client.cluster_info())
            if state.get("cluster_state") != "ok":
                raise RedisStoreError(
                    f"the Redis Cluster {self.where} does not serve every slot (cluster_state: "
                    f"{state.get('cluster_state')}): a master is down with no replica to take over"
                )
            nodes = list(client.get_primaries())
        else:
            cluster = await self._info("cluster", None)
            if str(cluster.get("cluster_enabled", "0")) == "1":
                seeds = self.where.split("://", 1)[1].split("/", 1)[0]
                raise RedisStoreError(
                    f"{self.where} is a Redis Cluster node: name the cluster with "
                    f"redis+cluster://{seeds} (or RedisStore.from_client with a RedisCluster)"
                )
            replication = await self._info("replication", None)
            role = replication.get("role", "master")
            if role != "master":
                raise RedisStoreError(
                    f"{self.where} is a read-only replica (role: {role}): name its master, or "
                    "its Sentinels with redis+sentinel://"
                )
            followers = int(str(replication.get("connected_slaves", self.wait_replicas)))
            if followers < self.wait_replicas:  # a warning: a replica may be resyncing
                warnings.append(
                    f"{self.where} has {followers} replica(s) following it, fewer than the "
                    f"{self.wait_replicas} wait_replicas asks for: every write fails (after "
                    "write_timeout) until enough follow it"
                )
        for script in (_PUT, _GET_CHAIN, _GET_ANCESTORS, _GET, _DELETE):
            await self._call(functools.partial(client.script_load, script))
        key = f"{self.prefix}:startup-check"
        await self._call(lambda: client.set(key, b"1", px=CHECK_KEY_MS), self.write_timeout)
        forgetful = [name for node in nodes if (name := await self._keeps_nothing(node))]
        if not forgetful:
            return warnings
        if nodes == [None]:
            which = f"{self.where} keeps"
        else:
            which = f"the nodes {', '.join(forgetful)} of {self.where} keep"
        return [
            f'{which} nothing on disk (appendonly no, save ""): when Redis restarts, every '
            "stored response is lost, and continuing one gets previous_response_not_found",
            *warnings,
        ]

    async def _info(self, section: str, node: object) -> dict[str, object]:
        """`INFO section`, of one cluster node when `node` is one; empty when Redis will not
        say (an ACL without INFO, a managed Redis that renamed it)."""
        from redis.exceptions import ResponseError

        extra = {} if node is None else {"target_nodes": node}
        try:
            found: dict[str, object] = await self._call(lambda: self.client.info(section, **extra))
        except RedisStoreError as exc:
            if isinstance(exc.__cause__, ResponseError):
                return {}
            raise
        return found

    async def _keeps_nothing(self, node: object) -> str | None:
        """Where Redis (one cluster node when `node` is one) writes neither an append-only
        file nor snapshots, or None (it persists, or it does not say: a managed Redis may
        refuse CONFIG)."""
        persistence = await self._info("persistence", node)
        if str(persistence.get("aof_enabled", "1")) != "0":
            return None
        extra = {} if node is None else {"target_nodes": node}
        try:
            config = await self._call(lambda: self.client.config_get("save", **extra))
        except RedisStoreError:
            return None
        if not isinstance(config, dict) or config.get("save") not in ("", b""):
            return None
        return str(getattr(node, "name", self.where))

    async def aclose(self) -> None:
        """Close the client and its pool (a client given to `from_client` is left open)."""
        for close in self._closers:
            await close()

    def _gate(self) -> asyncio.Semaphore | None:
        """This event loop's bound on calls in flight (None: the client has no bound)."""
        if self._bound is None:
            return None
        loop = asyncio.get_running_loop()
        gate = self._gates.get(loop)
        if gate is None:
            gate = self._gates[loop] = asyncio.Semaphore(self._bound)
        return gate

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[None]:
        gate = self._gate()
        if gate is None:
            yield
            return
        async with gate:
            yield

    async def _call(self, call: Callable[[], Awaitable[T]], seconds: float | None = None) -> T:
        """`call()` within `seconds` (the lookup `timeout` unless given), sent again after
        growing pauses while it fails for a reason that passes (`retryable`); its errors named
        (`RedisStoreError`, `TimeoutError`)."""
        from ._redis_clients import brief, closed_under_write, explain, retryable

        limit = seconds or self.timeout
        pause = RETRY_PAUSE_SECONDS
        failure: BaseException | None = None
        try:
            async with asyncio.timeout(limit):
                while True:
                    try:
                        try:
                            async with self._connection():
                                return await call()
                        except RuntimeError as raised:
                            closed = closed_under_write(raised)
                            if closed is None:
                                raise
                            raise closed from raised
                    except self._errors as error:
                        if not retryable(error, self.kind):
                            raise
                        failure = error
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, RETRY_PAUSE_MAX_SECONDS)
        except TimeoutError:
            if failure is not None:
                why = f"; the last try: {explain(failure, self.kind, self.where)}"
            elif self.where.startswith("rediss"):
                why = " (over TLS: a Redis that serves no TLS on this port never answers)"
            else:
                why = ""
            raise TimeoutError(
                f"{brief(self.where)} did not answer within {limit:g} s{why}"
            ) from failure
        except self._errors as error:
            raise RedisStoreError(explain(error, self.kind, self.where)) from error

    def __repr__(self) -> str:
        return f"RedisStore({self.where}, prefix={self.prefix!r}, ttl_seconds={self.ttl_seconds})"


def _check_bounds(ttl_seconds: float, timeout: float, write_timeout: float) -> None:
    if ttl_seconds <= 0 or timeout <= 0 or write_timeout <= 0:
        raise ValueError("ttl_seconds, timeout and write_timeout must be positive")
