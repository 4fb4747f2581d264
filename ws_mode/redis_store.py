"""A response store in Redis: stored responses shared by every worker and host.

`RedisStore` implements `ws_mode._store.ResponseStore` with `redis.asyncio` (install the
`redis` extra: `pip install ".[redis]"` in a clone of ws_mode). Keys are scoped by a digest of
the principal, never the principal itself::

    {prefix}:{<principal digest>}:r:<response id>  ->  the response's chain id (a string)
    {prefix}:{<principal digest>}:c:<chain id>     ->  a hash: response id -> record bytes
    {prefix}:{<principal digest>}:p:<response id>  ->  "being written" (`mark_pending`)

and, while a bound per principal is set (`limit_principal_bytes`, which the middleware sets
from `Limits.max_stored_bytes_per_principal`), the principal's account::

    {prefix}:{<principal digest>}:a:bytes          ->  the bytes of its records
    {prefix}:{<principal digest>}:a:chains         ->  a sorted set: chain id -> last write (µs)
    {prefix}:{<principal digest>}:a:chain_bytes    ->  a hash: chain id -> its bytes

The digest is a Redis Cluster hash tag, so one principal's keys share a slot: the scripts
find a chain's hash from an index key, so they cannot declare it in KEYS, but on a cluster
it is always on the node that runs them. Each call is one round trip, a Lua script
(EVALSHA): a write updates the account in the same script, atomically. The middleware marks
a write's responses as being written (`mark_pending`, one pipelined round trip) before it
writes them, so that a continuation on another worker waits for a write on its way and a
genuine miss does not. A hydration walks
the `parent_id` links inside Redis and returns the ancestors only, never the other forks.
Every key expires `ttl_seconds` after it was last written; a chain's hash is written by
every `put` to it, so an active conversation stays whole.

Every lookup is bounded by `timeout` seconds and every write by `write_timeout` (a deadline
over the whole call, retries included): a stopped or stalled Redis raises a `redis` exception
or `TimeoutError` instead of hanging, which the middleware turns into an error event. Writes
get longer: they are off every client's path, and a busy worker reads replies late (with a
one-second bound, half the writes of 200 busy sockets failed).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from ._install import install_hint
from ._store import DEFAULT_TTL_SECONDS, QuotaExceeded, StoredResponse

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.commands.core import AsyncScript

__all__ = ["RedisStore"]

T = TypeVar("T")

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
#: hash). ARGV: the chain
#: id, the response id, the record, the time to live in milliseconds, the principal's bound
#: in bytes (negative: none, and no account is kept), the principal's key prefix.
#: Returns how many of the principal's chains were dropped for the bound (least recently
#: written first, never the record's own), or -1 when the record's own chain would exceed
#: it (nothing is written). One script call: atomic, and cheaper for the client than a
#: MULTI/EXEC of the same commands (about half the CPU). Chains whose hash expired stop
#: counting at the principal's next write.
_PUT = """
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
#: the response id. 1 when the response was stored, else 0.
_DELETE = """
local chain = redis.call('GET', KEYS[1])
if not chain then return 0 end
local hash = ARGV[1] .. chain
local size = redis.call('HSTRLEN', hash, ARGV[2])
redis.call('DEL', KEYS[1])
redis.call('HDEL', hash, ARGV[2])
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


class RedisStore:
    """Stored responses in Redis, scoped by principal, with a time to live.

    `url` is a redis-py URL (`redis://`, `rediss://`, `unix://`; a password or a database
    number goes in it). Connections come from a pool of at most `max_connections`; a call
    that finds them all busy waits for one. A connection found broken (Redis restarted) is
    replaced and the command sent once more, at once; nothing is retried beyond that, and
    every lookup, waiting and retries included, ends within `timeout` seconds, every write
    within `write_timeout`.
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
    ) -> None:
        try:
            from redis.asyncio import BlockingConnectionPool, Redis
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff
            from redis.exceptions import ConnectionError
        except ImportError as error:  # pragma: no cover - the extra is not installed
            raise ImportError(f"RedisStore needs redis-py: {install_hint('redis')}") from error

        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            # Each call has its own deadline (`timeout` or `write_timeout`) over all of it.
            timeout=max(timeout, write_timeout),
            socket_timeout=max(timeout, write_timeout),
            socket_connect_timeout=timeout,
            # Once, at once, and only when the connection broke: a timed out command may
            # still run, and a down Redis should fail now rather than after backoffs.
            retry=Retry(NoBackoff(), 1, supported_errors=(ConnectionError,)),
            retry_on_error=[ConnectionError],  # redis-py 5 retries only the errors listed here
        )
        self._setup(
            Redis.from_pool(pool),
            owned=True,
            prefix=prefix,
            ttl_seconds=ttl_seconds,
            timeout=timeout,
            write_timeout=write_timeout,
        )

    @classmethod
    def from_client(
        cls,
        client: Redis,
        *,
        prefix: str = "ws_mode",
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        timeout: float = 2.0,
        write_timeout: float = 10.0,
    ) -> RedisStore:
        """A store on a client the caller configured (TLS, Sentinel, a shared pool...).

        The client must not decode responses. The caller keeps owning it: `aclose` leaves it
        open. Its socket timeouts are its own; each call is still bounded by `timeout`.
        """
        store = cls.__new__(cls)
        store._setup(
            client,
            owned=False,
            prefix=prefix,
            ttl_seconds=ttl_seconds,
            timeout=timeout,
            write_timeout=write_timeout,
        )
        return store

    def _setup(
        self,
        client: Redis,
        *,
        owned: bool,
        prefix: str,
        ttl_seconds: float,
        timeout: float,
        write_timeout: float,
    ) -> None:
        if ttl_seconds <= 0 or timeout <= 0 or write_timeout <= 0:
            raise ValueError("ttl_seconds, timeout and write_timeout must be positive")
        self.client = client
        self.prefix = prefix
        self.ttl_seconds = ttl_seconds
        self.timeout = timeout
        self.write_timeout = write_timeout
        self._owned = owned
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
        not fit."""
        chain_key = self.chain_key(principal, record.chain_id)
        keys = [self.index_key(principal, record.id), chain_key, *self.account_keys(principal)]
        bound = self.max_principal_bytes
        args: list[str | bytes | int] = [
            record.chain_id,
            record.id,
            record.encode(),
            self._ttl_ms,
            -1 if bound is None else bound,
            self._scope(principal),
        ]
        dropped = int(await self._bounded(self._put(keys=keys, args=args), self.write_timeout))
        if dropped < 0:
            raise QuotaExceeded(
                f"the conversation would hold more than {bound} bytes "
                "(Limits.max_stored_bytes_per_principal)"
            )
        return dropped

    async def get_chain(self, principal: str, response_id: str) -> dict[str, StoredResponse]:
        """The records of the conversation `response_id` belongs to, by id (empty when it is
        not stored), in one round trip."""
        reply = await self._bounded(
            self._get_chain(
                keys=[self.index_key(principal, response_id)],
                args=[self.chain_key(principal, "")],
            )
        )
        fields: list[bytes] = list(reply or ())
        chain: dict[str, StoredResponse] = {}
        for name, value in zip(fields[::2], fields[1::2], strict=True):
            chain[name.decode()] = StoredResponse.decode(value)
        # The index outlived its record (written by hand, or a partial failure): not stored.
        return chain if response_id in chain else {}

    async def get_ancestors(self, principal: str, response_id: str) -> list[StoredResponse]:
        """The records from the conversation's first response down to `response_id`,
        following parent links in Redis (one round trip; forks are never read); empty when
        one of them is not stored."""
        reply = await self._bounded(
            self._get_ancestors(
                keys=[self.index_key(principal, response_id)],
                args=[self.chain_key(principal, ""), response_id],
            )
        )
        return [StoredResponse.decode(value) for value in reversed(list(reply or ()))]

    async def get(self, principal: str, response_id: str) -> StoredResponse | None:
        """One record, or None when it is not stored (one round trip)."""
        reply = await self._bounded(
            self._get(
                keys=[self.index_key(principal, response_id)],
                args=[self.chain_key(principal, ""), response_id],
            )
        )
        return StoredResponse.decode(reply) if reply else None

    def pending_key(self, principal: str, response_id: str) -> str:
        """The key saying `principal`'s response `response_id` is being written."""
        return f"{self._scope(principal)}p:{response_id}"

    async def mark_pending(self, principal: str, response_ids: list[str], seconds: float) -> None:
        """Mark responses as being written for `seconds` (one round trip), so a continuation
        on another worker that misses them waits for their write, and a genuine miss does
        not wait."""
        ms = max(1, round(seconds * 1000))
        pipe = self.client.pipeline(transaction=False)
        for response_id in response_ids:
            pipe.set(self.pending_key(principal, response_id), b"1", px=ms)
        await self._bounded(pipe.execute(), self.write_timeout)

    async def is_pending(self, principal: str, response_id: str) -> bool:
        """Whether `response_id` is being written."""
        found = await self._bounded(self.client.exists(self.pending_key(principal, response_id)))
        return bool(found)

    async def delete(self, principal: str, response_id: str) -> bool:
        """Forget one response (the rest of its chain stays); whether it was stored."""
        removed = await self._bounded(
            self._delete(
                keys=[self.index_key(principal, response_id), *self.account_keys(principal)],
                args=[self.chain_key(principal, ""), response_id],
            )
        )
        return bool(removed)

    async def aclose(self) -> None:
        """Close the client and its pool (a client given to `from_client` is left open)."""
        if self._owned:
            await self.client.aclose()

    async def _bounded(self, call: Awaitable[T], seconds: float | None = None) -> T:
        async with asyncio.timeout(seconds or self.timeout):
            return await call

    def __repr__(self) -> str:
        kwargs: dict[str, Any] = self.client.connection_pool.connection_kwargs
        where = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
        return f"RedisStore({where}, prefix={self.prefix!r}, ttl_seconds={self.ttl_seconds})"
