"""The conversation key: one stable, opaque key per chain of responses, for routers.

A chain gets its key when its first turn is made (a turn continuing no known response) and
every response continuing it inherits it, on any lane, through the cache and the store. A
router in front of several inference replicas hashes it (`x-session-id` by default) to send
each continuation to the replica whose prefix cache holds its context.

The key is an HMAC-SHA256 with a server secret over the principal's stable key and a seed:
a random one, or the client's own `prompt_cache_key` (``pck:`` and its value). It names no
response and no principal, and a client cannot choose another principal's key: the principal
is in what is hashed. A response stored without a key (by a version before keys) gets one
from its chain's first response id, the same on every process sharing the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final

from ._auth import PrincipalKey, stable_key
from ._errors import ConfigError

if TYPE_CHECKING:
    from ._cache import CachedResponse

#: The header a handler call and the proxy's upstream request carry the key in, by default:
#: what vllm-router's `consistent_hash` policy (and NeMo Gym, and others) read.
DEFAULT_HEADERS: Final = ("x-session-id",)
#: The environment variable `ws-mode serve` and `ws-mode proxy` read the secret from.
SECRET_ENV: Final = "WS_MODE_CONVERSATION_KEY_SECRET"
#: How many hex digits of the HMAC a key keeps (128 bits).
KEY_HEX_DIGITS: Final = 32
#: The scope of callers without a principal (no `authenticate` hook).
ANONYMOUS: Final = "anonymous"
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-z]+\Z")
# Headers a key may not be carried in: the hop's own and the ones a request needs as they are.
_RESERVED: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "content-type",
        "accept",
        "accept-encoding",
        "authorization",
        "cookie",
        "traceparent",
        "tracestate",
    }
)


class ConversationKeys:
    """Makes conversation keys with one secret; what a middleware's connections share.

    `secret` (`conversation_key_secret=`): a str or bytes every process of a fleet shares, so
    that they derive the same keys; None draws a random one for this process (keys made here
    still travel with their responses through the store, but a key seeded by a
    `prompt_cache_key`, and one derived for a response stored without a key, differ between
    processes). `headers`: the request headers the key goes in (empty: none). With
    `fill_prompt_cache_key`, a request with no `prompt_cache_key` gets the key as its
    `prompt_cache_key`; with `cache_salt`, every request gets the principal's salt as vLLM's
    `cache_salt` (replacing the client's).
    """

    __slots__ = ("_secret", "cache_salt", "fill_prompt_cache_key", "header_names", "shared")

    def __init__(
        self,
        secret: str | bytes | None = None,
        *,
        headers: Sequence[str] | None = DEFAULT_HEADERS,
        fill_prompt_cache_key: bool = False,
        cache_salt: bool = False,
    ) -> None:
        if secret is None:
            self._secret = secrets.token_bytes(32)
        elif isinstance(secret, str | bytes) and len(secret) >= 16:
            self._secret = secret.encode() if isinstance(secret, str) else bytes(secret)
        else:
            raise ConfigError(
                "conversation_key_secret must be None (a random secret for this process) or a "
                "str or bytes of at least 16 characters that every process of the fleet shares."
            )
        #: Whether the secret was given (a fleet can share it) rather than drawn here.
        self.shared = secret is not None
        #: The request headers the key is carried in, lowercase (encoded for ASGI).
        self.header_names: tuple[bytes, ...] = _header_names(headers)
        options = (("fill_prompt_cache_key", fill_prompt_cache_key), ("cache_salt", cache_salt))
        for name, value in options:
            if not isinstance(value, bool):
                raise ConfigError(f"{name} must be True or False, got {value!r}.")
        self.fill_prompt_cache_key = fill_prompt_cache_key
        self.cache_salt = cache_salt

    def __repr__(self) -> str:
        return f"<ConversationKeys shared={self.shared} headers={self.header_names!r}>"

    def first(self, scope: str, prompt_cache_key: object = None) -> str:
        """The key of a new chain of the principal `scope`: seeded by the client's
        `prompt_cache_key` when it is a non-empty string, else at random."""
        if isinstance(prompt_cache_key, str) and prompt_cache_key:
            return self._key(scope, "pck:" + prompt_cache_key)
        return self._key(scope, "new:" + secrets.token_hex(16))

    def of_turn(
        self, scope: str, previous: CachedResponse | None, prompt_cache_key: object = None
    ) -> str:
        """The key of a turn of the principal `scope`: its parent's (`previous`, derived from
        its chain's first response when it was stored without one), or a new chain's."""
        if previous is None:
            return self.first(scope, prompt_cache_key)
        if previous.conversation_key is not None:
            return previous.conversation_key
        return self.of_chain(scope, previous.chain_id)

    def of_chain(self, scope: str, chain_id: str) -> str:
        """The key of a stored chain whose records carry none (written before keys existed):
        from its first response's id, so every process sharing the secret derives the same."""
        return self._key(scope, "root:" + chain_id)

    def salt(self, scope: str) -> str:
        """The principal's `cache_salt`: keeps its prefix cache apart from other principals'."""
        return self._key(scope, "salt")

    def _key(self, scope: str, seed: str) -> str:
        # The scope's length first: no scope and seed pair reads as another.
        message = f"{len(scope)}:{scope}|{seed}".encode("utf-8", "surrogatepass")
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()[:KEY_HEX_DIGITS]

    def with_key(
        self, headers: list[tuple[bytes, bytes]], key: str | None
    ) -> list[tuple[bytes, bytes]]:
        """`headers` without any the client sent under the key's names, then the key under
        each of them; `headers` itself when there is no key or no name to put it under."""
        names = self.header_names
        if not names or key is None:
            return headers
        encoded = key.encode()
        return [*self.without_key_headers(headers), *((name, encoded) for name in names)]

    def without_key_headers(
        self, headers: Iterable[tuple[bytes, bytes]]
    ) -> list[tuple[bytes, bytes]]:
        """`headers` without any under the key's names (the client's are never trusted)."""
        names = self.header_names
        return [(name, value) for name, value in headers if name.lower() not in names]

    def fields(self, scope: str, key: str, request: dict[str, Any]) -> dict[str, str]:
        """The request body's fields to set for the upstream (`fill_prompt_cache_key`,
        `cache_salt`), given the client's request fields; empty when both are off."""
        fields: dict[str, str] = {}
        if self.fill_prompt_cache_key and not request.get("prompt_cache_key"):
            fields["prompt_cache_key"] = key
        if self.cache_salt:
            fields["cache_salt"] = self.salt(scope)
        return fields


def _header_names(headers: Sequence[str] | None) -> tuple[bytes, ...]:
    if headers is None:
        return ()
    if isinstance(headers, str | bytes) or not all(isinstance(name, str) for name in headers):
        raise ConfigError(
            "conversation_key_headers must be a tuple of header names (empty or None: no "
            f"header), got {headers!r}."
        )
    names: list[bytes] = []
    for name in headers:
        lowered = name.lower()
        if not _TOKEN.match(lowered) or lowered in _RESERVED or lowered.startswith("sec-"):
            raise ConfigError(
                f"conversation_key_headers: {name!r} is no header name a key may go in (an "
                "HTTP token, not a hop-by-hop, Host, Authorization, Cookie, Content-*, Accept* "
                "or trace header)."
            )
        if lowered.encode() not in names:
            names.append(lowered.encode())
    return tuple(names)


def conversation_scope(principal: Any, custom: PrincipalKey | None, own: str) -> str:
    """Whose keys a caller's are: its principal's stable key (`ws_mode._auth.principal_key`,
    with the middleware's `principal_key` function `custom`), `ANONYMOUS` with no principal,
    or `own` (a scope of the caller's own, such as its connection's) for a principal with no
    stable key: two callers never share a scope they cannot be told apart in."""
    if principal is None:
        return ANONYMOUS
    found = stable_key(principal, custom)
    return found if found is not None else own
