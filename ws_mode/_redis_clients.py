"""How `ws_mode.redis_store.RedisStore` reaches Redis: the URL of one server, a Redis Cluster
or a Sentinel-managed master made into a redis-py client; where a client points, said without
credentials; and what each of redis-py's errors means for the store.

The URLs (redis-py's own for one server; the `+cluster` and `+sentinel` forms are the ones
other Redis clients use, with several nodes separated by commas)::

    redis://[[user]:password@]host[:port][/db][?option=value&...]     one Redis
    rediss://...                                                      the same over TLS
    unix://[[user]:password@]/path/to/redis.sock[?db=N&...]           one Redis, on a socket
    redis+cluster://[[user]:password@]host[:port][,host[:port]...][?...]
        a Redis Cluster, discovered from whichever of these nodes answers first
    redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db][?...]
        the master the Sentinels at these addresses name `service`, followed across failovers
    rediss+cluster://..., rediss+sentinel://...                       the same over TLS

The query options are redis-py's (`socket_keepalive=true`, `ssl_cert_reqs=none`,
`ssl_ca_certs=/path`, ...), for every connection to a data node, except the store's own,
taken out before redis-py reads the URL (`store_options`), so that a store named by a URL
alone (`ws-mode serve --store`) can have them: `wait_replicas=N` (not on a cluster), as
`RedisStore(wait_replicas=N)`; `encryption_keys_env=NAME`, the environment variable holding
the encryption keys (base64, separated by commas, newest first: a URL gets logged, so the
keys never go in it), as `RedisStore(encryption_keys=...)`; `read_plaintext=true`, as
`RedisStore(read_plaintext=True)`. The credentials are the data nodes' (a Sentinel that
needs its own: build the client and use `RedisStore.from_client`).
Ports default to 6379, and to 26379 for a Sentinel.

This module imports redis-py: `RedisStore` imports it only once a client is made.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Literal
from urllib.parse import unquote, unquote_plus

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import (
    BlockingConnectionPool,
    SSLConnection,
    UnixDomainSocketConnection,
    parse_url,
)
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import (
    AskError,
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ClusterDownError,
    ConnectionError,
    ExternalAuthProviderError,
    MasterDownError,
    MaxConnectionsError,
    MovedError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TimeoutError,
    TryAgainError,
)


class TooFewReplicas(RedisError):
    """Fewer replicas than `RedisStore(wait_replicas=...)` asked for confirmed a write (Redis
    `WAIT`) in time: the write is not acknowledged (a failover could lose it), and is sent
    again until its deadline."""


class TransportClosed(ConnectionError):
    """A command written on a connection its peer had closed meanwhile (a Redis that died or
    failed over between the pool's check of the connection and the write). Under uvloop the
    write raises `RuntimeError` ("... the handler is closed"), which redis-py passes on as it
    is, where the standard event loop's `OSError` becomes a `ConnectionError` that redis-py
    retries: redis-py has dropped the connection, and the next try opens a new one."""


def closed_under_write(error: RuntimeError) -> TransportClosed | None:
    """`error` as a `TransportClosed` when it is uvloop's write on a closed transport, else
    None (another `RuntimeError`, which is not the store's to take)."""
    if "handler is closed" not in str(error):
        return None
    return TransportClosed(f"the connection closed under a write ({error})")


#: One Redis, a Redis Cluster, or a master that Sentinels follow across failovers.
Kind = Literal["redis", "cluster", "sentinel"]

#: What redis-py raises: its errors, and the cluster client's own (not `RedisError`s).
ERRORS: Final = (RedisError, RedisClusterException)

SCHEMES: Final[dict[str, tuple[Kind, str]]] = {
    "redis": ("redis", "redis"),
    "rediss": ("redis", "rediss"),
    "unix": ("redis", "unix"),
    "redis+cluster": ("cluster", "redis"),
    "rediss+cluster": ("cluster", "rediss"),
    "redis+sentinel": ("sentinel", "redis"),
    "rediss+sentinel": ("sentinel", "rediss"),
}
_DEFAULT_PORT: Final[dict[Kind, int]] = {"redis": 6379, "cluster": 6379, "sentinel": 26379}
#: The bound a redis-py pool reports when it was given none.
_UNBOUNDED: Final = 2**31
_URL: Final = re.compile(
    r"(?P<scheme>[a-z+]+)://(?P<netloc>[^/?#]*)(?P<path>/[^?#]*)?(?:\?(?P<query>[^#]*))?",
    re.IGNORECASE,
)
_NODE: Final = re.compile(r"(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:\[\]]+))(?::(?P<port>\d+))?")


@dataclass(frozen=True)
class Endpoint:
    """A client made from a URL: what it reaches (`kind`, `where`: its URL without
    credentials or options), and what closing it closes (the client, a Sentinel's own)."""

    kind: Kind
    where: str
    client: Redis | RedisCluster
    closers: tuple[Callable[[], Awaitable[None]], ...]


def url_kind(url: str) -> Kind:
    """What a store URL names, its form checked (nothing is connected); ValueError, without
    the URL's credentials, when it is not one of the forms above."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in SCHEMES:
        raise ValueError(
            f"a Redis store URL starts with {', '.join(f'{s}://' for s in SCHEMES)}; "
            f"got {_without_credentials(url)!r}"
        )
    kind = SCHEMES[scheme][0]
    rest, replicas = own_options(url)
    if kind == "redis":
        try:
            parse_url(rest)
        except ValueError as exc:
            raise ValueError(f"{exc} ({_without_credentials(url)!r})") from None
    else:
        _service_and_db(_split(rest, kind)[2], kind, rest)
    if replicas is not None:
        try:
            check_replicas(replicas, kind)
        except ValueError as exc:
            raise ValueError(f"{exc} ({_without_credentials(url)!r})") from None
    return kind


#: The query options of a store URL that are the store's own, not redis-py's.
_WAIT_REPLICAS: Final = "wait_replicas"
_KEYS_ENV: Final = "encryption_keys_env"
_READ_PLAINTEXT: Final = "read_plaintext"
_OWN: Final = (_WAIT_REPLICAS, _KEYS_ENV, _READ_PLAINTEXT)
_TRUE: Final = ("1", "true", "yes", "on")
_FALSE: Final = ("0", "false", "no", "off")


@dataclass(frozen=True)
class StoreOptions:
    """The store's own options a URL gives (None: not given): `wait_replicas`, the name of
    the environment variable holding the encryption keys (`encryption_keys_env`: the keys
    themselves never go in a URL, which gets logged), and `read_plaintext`."""

    wait_replicas: int | None = None
    encryption_keys_env: str | None = None
    read_plaintext: bool | None = None


def own_options(url: str) -> tuple[str, int | None]:
    """`url` without the query options that are the store's own (`store_options`), and the
    `wait_replicas` it gives (None: none)."""
    rest, options = store_options(url)
    return rest, options.wait_replicas


def store_options(url: str) -> tuple[str, StoreOptions]:
    """`url` without the query options that are the store's own (redis-py would pass an
    option it does not know to each connection, which refuses it), and what they say.
    ValueError, without the URL's credentials, for a value that does not parse, or an
    option given twice."""
    head, hash_mark, fragment = url.partition("#")
    base, question, query = head.partition("?")
    if not question:
        return url, StoreOptions()
    kept: list[str] = []
    given: dict[str, list[str]] = {}
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if unquote_plus(name) in _OWN:  # spelt as redis-py's parse_qs reads names
            given.setdefault(unquote_plus(name), []).append(unquote_plus(value))
        else:
            kept.append(part)
    if not given:
        return url, StoreOptions()
    for name, values in given.items():
        if len(values) > 1:
            raise ValueError(
                f"{name} is given {len(values)} times in {_without_credentials(url)!r}"
            )
    replicas: int | None = None
    if _WAIT_REPLICAS in given:
        value = given[_WAIT_REPLICAS][0]
        if re.fullmatch(r"[0-9]+", value) is None:
            raise ValueError(
                f"{_WAIT_REPLICAS} in a store URL is a whole number, 0 or more: got "
                f"{value[:40]!r} in {_without_credentials(url)!r}"
            )
        replicas = int(value)
    env: str | None = None
    if _KEYS_ENV in given:
        env = given[_KEYS_ENV][0]
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", env) is None:  # never shown: it may be a key
            raise ValueError(
                f"{_KEYS_ENV} in a store URL names an environment variable (letters, digits "
                f"and _) that holds the keys, never the keys themselves, in "
                f"{_without_credentials(url)!r}"
            )
    plaintext: bool | None = None
    if _READ_PLAINTEXT in given:
        value = given[_READ_PLAINTEXT][0].lower()
        if value not in _TRUE + _FALSE:
            raise ValueError(
                f"{_READ_PLAINTEXT} in a store URL is true or false: got {value[:10]!r} in "
                f"{_without_credentials(url)!r}"
            )
        plaintext = value in _TRUE
    rest = base + (f"?{'&'.join(kept)}" if kept else "") + hash_mark + fragment
    return rest, StoreOptions(replicas, env, plaintext)


def wait_replicas_of(url: str, given: int | None) -> int:
    """How many replicas must confirm a write of the store `url` names: `given` (the
    keyword), else the URL's `wait_replicas`, else 0. ValueError when both are given and
    differ (neither is taken over the other), and as `check_replicas` says."""
    kind = url_kind(url)
    in_url = own_options(url)[1]
    if given is not None and in_url is not None and given != in_url:
        raise ValueError(
            f"wait_replicas={given} and the URL's wait_replicas={in_url} disagree "
            f"({_without_credentials(url)!r}): give one of them"
        )
    replicas = given if given is not None else in_url or 0
    check_replicas(replicas, kind)
    return replicas


def check_replicas(wait_replicas: int, kind: Kind) -> None:
    """ValueError unless `wait_replicas` can be asked of a store on `kind`."""
    if wait_replicas < 0:
        raise ValueError("wait_replicas must be 0 or more")
    if wait_replicas and kind == "cluster":
        # A cluster pipeline sends WAIT (which names no key) to a node of its choosing, not
        # down the connection that wrote.
        raise ValueError("wait_replicas is for one Redis or a Sentinel's master, not a cluster")


def open_client(
    url: str, *, max_connections: int, timeout: float, connect_timeout: float
) -> Endpoint:
    """The client `url` names, with at most `max_connections` connections (per node of a
    cluster), socket reads bounded by `timeout` seconds and connecting by `connect_timeout`.
    A connection found broken is replaced and the command sent once more, at once; the store
    retries nothing else on one Redis, and waits out failovers on a cluster or a Sentinel's.
    The store's own query options (`own_options`) are left out. ValueError, without the URL's
    credentials, when the URL is not one of the forms above."""
    url_kind(url)
    url = own_options(url)[0]
    scheme = url.partition("://")[0].lower()
    kind, base = SCHEMES[scheme]
    retry = Retry(NoBackoff(), 1, supported_errors=(ConnectionError,))
    timeouts: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": connect_timeout,
    }
    if kind == "redis":
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=timeout,  # waiting for a free connection: the call's deadline is shorter
            retry=retry,
            retry_on_error=[ConnectionError],  # redis-py 5 retries only the errors listed here
            **timeouts,
        )
        client: Redis = Redis.from_pool(pool)
        return Endpoint(kind, describe_client(client)[1], client, (client.aclose,))
    nodes, userinfo, path, query = _split(url, kind)
    service, db = _service_and_db(path, kind, url)
    # redis-py's own parsing of the credentials and options, as for one server.
    first_host, first_port = nodes[0]
    host = f"[{first_host}]" if ":" in first_host else first_host
    options: dict[str, Any] = dict(
        parse_url(f"{base}://{userinfo}{host}:{first_port}/{db}" + (f"?{query}" if query else ""))
    )
    tls = options.pop("connection_class", None) is SSLConnection
    for name in ("host", "port", "path"):
        options.pop(name, None)
    where = f"{scheme}://{','.join(_address(h, p) for h, p in nodes)}"
    if kind == "cluster":
        options.pop("db", None)  # a cluster has database 0 only (checked above)
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in nodes],
            max_connections=max_connections,
            retry=Retry(NoBackoff(), 1),  # after a topology refresh; the store waits out the rest
            ssl=tls,
            **timeouts,
            **options,
        )
        return Endpoint(kind, where, cluster, (cluster.aclose,))
    ssl_options = {name: value for name, value in options.items() if name.startswith("ssl_")}
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        nodes,
        sentinel_kwargs={
            **timeouts,
            "retry": retry,
            **({"ssl": True, **ssl_options} if tls else {}),
        },
        **timeouts,
        **options,
    )
    master: Redis = sentinel.master_for(
        service, max_connections=max_connections, retry=retry, ssl=tls
    )
    where += f"/{service}" + (f"/{db}" if db else "")
    return Endpoint(kind, where, master, (master.aclose, sentinel.aclose))


def _split(url: str, kind: Kind) -> tuple[list[tuple[str, int]], str, str, str]:
    """A cluster's or a Sentinel's URL: its nodes, its credentials as written (with their
    `@`, or empty), its path and its query."""
    found = _URL.fullmatch(url)
    if found is None:
        raise ValueError(f"not a Redis URL: {_without_credentials(url)!r}")
    netloc = found.group("netloc")
    userinfo, _, hosts = netloc.rpartition("@")
    nodes: list[tuple[str, int]] = []
    for text in hosts.split(","):
        node = _NODE.fullmatch(text.strip())
        if node is None:
            raise ValueError(f"not a host[:port] in {_without_credentials(url)!r}: {text!r}")
        port = int(node.group("port") or _DEFAULT_PORT[kind])
        if not 0 < port < 65536:
            raise ValueError(f"not a port in {_without_credentials(url)!r}: {port}")
        nodes.append((unquote(node.group("v6") or node.group("host")), port))
    return (
        nodes,
        f"{userinfo}@" if userinfo else "",
        found.group("path") or "",
        found.group("query") or "",
    )


def _service_and_db(path: str, kind: Kind, url: str) -> tuple[str, int]:
    """The Sentinel service and the database a cluster's or a Sentinel's URL path names."""
    parts = [unquote(part) for part in path.strip("/").split("/") if part]
    if kind == "sentinel":
        if not parts or len(parts) > 2:
            raise ValueError(
                "a redis+sentinel:// URL names the service after the Sentinels: "
                f"redis+sentinel://host:26379/mymaster[/db], got {_without_credentials(url)!r}"
            )
        service, *rest = parts
    else:
        service, rest = "", parts
    if len(rest) > 1 or (rest and not rest[0].isdigit()):
        raise ValueError(f"not a database number in {_without_credentials(url)!r}")
    db = int(rest[0]) if rest else 0
    if kind == "cluster" and db:
        raise ValueError(f"a Redis Cluster has database 0 only, not {db}")
    return service, db


def _without_credentials(url: str) -> str:
    """`url` without its credentials (anything before an `@` in its address) or options; text
    that is no URL (no `scheme://`) as it is, what may be credentials masked."""
    scheme, sep, rest = url.partition("://")
    if not sep:  # "localhost:6379", "user:secret@host": shown, so the mistake can be seen
        text = url.split("?", 1)[0]  # options may carry a password
        address, at, _ = text.partition("/")[0].rpartition("@")
        return f"***@{text[len(address) + len(at) :]}" if at else text
    netloc = re.match(r"[^/?#]*", rest)
    hosts = netloc.group(0) if netloc else ""
    path = rest[len(hosts) :].split("?", 1)[0]
    return f"{scheme}://{hosts.rpartition('@')[2]}{path}"


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def describe_client(client: Redis | RedisCluster) -> tuple[Kind, str]:
    """What a client reaches, and where as a URL without credentials or options."""
    if isinstance(client, RedisCluster):
        manager = client.nodes_manager
        tls = manager.connection_kwargs.get("connection_class") is SSLConnection
        names = list(manager.startup_nodes) or [node.name for node in client.get_nodes()]
        return "cluster", f"{'rediss' if tls else 'redis'}+cluster://{','.join(names)}"
    pool = client.connection_pool
    kwargs: dict[str, Any] = pool.connection_kwargs
    db = int(kwargs.get("db") or 0)
    if isinstance(pool, SentinelConnectionPool):
        sentinels = ",".join(
            _address(
                s.connection_pool.connection_kwargs["host"],
                s.connection_pool.connection_kwargs["port"],
            )
            for s in pool.sentinel_manager.sentinels
        )
        tls = issubclass(pool.connection_class, SSLConnection)
        scheme = "rediss+sentinel" if tls else "redis+sentinel"
        return "sentinel", f"{scheme}://{sentinels}/{pool.service_name}" + (f"/{db}" if db else "")
    if issubclass(pool.connection_class, UnixDomainSocketConnection):
        return "redis", f"unix://{kwargs.get('path')}" + (f"?db={db}" if db else "")
    scheme = "rediss" if issubclass(pool.connection_class, SSLConnection) else "redis"
    where = _address(str(kwargs.get("host", "localhost")), int(kwargs.get("port", 6379)))
    return "redis", f"{scheme}://{where}/{db}"


def client_bound(client: Redis | RedisCluster) -> int | None:
    """The most connections the client opens (to each node of a cluster), or None when it
    has no bound: the store keeps its calls in flight within it, so they wait for a
    connection rather than fail for the lack of one."""
    if isinstance(client, RedisCluster):
        bound = client.nodes_manager.connection_kwargs.get("max_connections")
    else:
        bound = getattr(client.connection_pool, "max_connections", None)
    return int(bound) if isinstance(bound, int) and 0 < bound < _UNBOUNDED else None


#: Errors that pass once a failover is over: a node down, a slot without a master yet, a
#: former master now a replica, a Sentinel without an answer yet, a pool that was full.
_PASSING: Final = (
    ConnectionError,
    TimeoutError,
    ClusterDownError,
    TryAgainError,
    ReadOnlyError,
    SlotNotCoveredError,
    AskError,
)
#: ...except these, which no wait fixes.
_LASTING: Final = (AuthenticationError, AuthorizationError, ExternalAuthProviderError)


def retryable(error: BaseException, kind: Kind) -> bool:
    """Whether a call that failed with `error` is worth sending again after a pause: on a
    cluster or a Sentinel's master, while a failover may be under way; on one Redis, only a
    full pool (a client shared with other code), since a Redis that is down stays down. A
    write too few replicas confirmed is sent again whatever the kind."""
    if isinstance(error, MaxConnectionsError | TooFewReplicas | TransportClosed):
        # A replica that lags, or one being attached to a new master, catches up; a new
        # connection replaces one closed under a write (and fails for real if Redis is down).
        return True
    if kind == "redis" or isinstance(error, _LASTING):
        return False
    return isinstance(error, _PASSING)


def brief(where: str) -> str:
    """`where` for a log line: a cluster's or Sentinels' first node only
    (`redis+cluster://10.0.0.1:7000,...`)."""
    scheme, sep, rest = where.partition("://")
    nodes, slash, path = rest.partition("/")
    first, comma, _others = nodes.partition(",")
    return f"{scheme}{sep}{first}{',...' if comma else ''}{slash}{path}"


def explain(error: BaseException, kind: Kind, where: str) -> str:
    """What `error` means for the store at `where`, in one short line for the operator's log
    (log lines cut long values): what happened and what to do first, redis-py's own words
    last. Credentials are never in it (`where` has none; redis-py's messages hold addresses,
    not passwords)."""
    said = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    node = _node_of(error)
    short = brief(where)
    at = f"{short} (node {node})" if node and kind == "cluster" else short
    if isinstance(error, MovedError | AskError) and kind != "cluster":
        seeds = where.split("://", 1)[1].split("/", 1)[0]
        return (
            f"{short} is a Redis Cluster node (it answered MOVED): name the cluster with "
            f"redis+cluster://{seeds}"
        )
    if isinstance(error, RedisClusterException) and "not enabled" in str(error):
        return f"{short} is not a Redis Cluster (cluster mode is off): name it with redis://"
    if isinstance(error, MasterNotFoundError):
        return (
            f"the Sentinels of {short} name no master for its service: a failover under way, "
            f"a wrong service name, or Sentinels out of reach ({said})"
        )
    if isinstance(error, MasterDownError):
        return f"{at} lost its master (MASTERDOWN): a failover is under way"
    if isinstance(error, ClusterDownError):
        return (
            f"the Redis Cluster {at} is down (CLUSTERDOWN): a master failed and no replica "
            "took over yet, or the cluster lost its majority"
        )
    if isinstance(error, SlotNotCoveredError):
        return f"no node of the Redis Cluster {short} serves a slot: a failover is under way"
    if isinstance(error, TryAgainError):
        return f"the Redis Cluster {at} is moving a slot (TRYAGAIN): a resharding"
    if isinstance(error, ReadOnlyError):
        if kind == "redis":
            return (
                f"{short} is a read-only replica (READONLY): name its master, or its "
                "Sentinels with redis+sentinel://"
            )
        return f"{at} became a replica (READONLY): a failover is under way"
    if isinstance(error, BusyLoadingError):
        return f"{at} is loading its data after a restart (LOADING)"
    if isinstance(error, OutOfMemoryError):
        return f"{at} is full (OOM: maxmemory reached, maxmemory-policy noeviction)"
    if isinstance(error, AuthenticationError):
        return f"{at} refused the credentials ({said})"
    if isinstance(error, NoPermissionError | AuthorizationError):
        return f"{at} does not let this user run a store command (ACL) ({said})"
    if isinstance(error, TooFewReplicas):
        return f"{at}: {error} (RedisStore wait_replicas): a replica is down, lags or is syncing"
    if isinstance(error, MaxConnectionsError):
        return f"every connection of the client of {short} was busy ({said})"
    if isinstance(error, ResponseError) and "DB index is out of range" in str(error):
        return f"{short} has no such database (see `databases` in its redis.conf)"
    if isinstance(error, ConnectionError) and _tls_failed(error):
        return (
            f"TLS with {at} failed: rediss:// needs a Redis serving TLS on that port, and "
            f"certificates that match ({said})"
        )
    if isinstance(error, ConnectionError):
        return f"{at} cannot be reached ({said})"
    if isinstance(error, TimeoutError):
        return f"{at} did not answer in time ({said})"
    return f"{at} answered an error ({said})"


def _node_of(error: BaseException) -> str | None:
    """The cluster node an error came from, when redis-py says."""
    name = getattr(error, "last_failed_node_name", None)
    if isinstance(name, str):
        return name
    connection = getattr(error, "connection", None)
    name = getattr(connection, "name", None)
    return name if isinstance(name, str) else None


def _tls_failed(error: BaseException) -> bool:
    """Whether a connection error came from the TLS handshake."""
    seen: BaseException | None = error
    for _ in range(5):
        if seen is None:
            break
        if isinstance(seen, ssl.SSLError) or "SSL" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
