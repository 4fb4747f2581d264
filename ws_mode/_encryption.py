"""Stored records encrypted at rest: AES-256-GCM under keys the operator gives, with rotation.

A store that encrypts (`RedisStore(encryption_keys=...)`) keeps each record as one line of
JSON naming what must stay readable outside the ciphertext, then the ciphertext::

    {"key":"<key id>","id":"<response id>","parent_id":...,"chain_id":"<chain id>"}\\n
    <12-byte nonce><AES-GCM ciphertext of the whole plain record, its 16-byte tag>

The head holds ids only: the store's keys name them already, and the store's Lua script
follows `parent_id` server-side. Everything a conversation says (its items, the response
object, the tools' digest) is inside the ciphertext. The associated data binds a record to
what it is stored as: its kind, the principal it belongs to, the id it is read under and its
head, so a record copied under another id, another principal or with an edited head fails
authentication. Keys are given newest first: the first encrypts, every one listed decrypts;
a key's id (`key_id`, a digest of the key, never the key) in the head picks the key.

A record that cannot be read (a key no longer listed, a failed authentication, a plaintext
record met by an encrypting store that does not `read_plaintext`, an encrypted one met by a
store with no keys) raises `RecordUnreadable`: the store reads it as not stored. Keys given
wrong (not 32 bytes, not base64, listed twice, an environment variable unset) are a
`ConfigError` when the store is made.

`cryptography` (the `encryption` extra) is imported on first use.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Sequence
from typing import Any, Final

import orjson

from ._errors import ConfigError
from ._install import install_hint
from ._store import StoredResponse

__all__ = [
    "KEY_BYTES",
    "RESPONSE_RECORD",
    "RecordCodec",
    "RecordUnreadable",
    "codec_of",
    "key_id",
    "keys_from_env",
    "parse_keys",
]

#: An encryption key's length: AES-256.
KEY_BYTES: Final = 32
#: A record's nonce: random, 96 bits (AES-GCM's own size).
NONCE_BYTES: Final = 12
#: What an encrypted record's head starts with (a plain record's starts with `{"id":`).
ENCRYPTED_HEAD: Final = b'{"key":'
#: The kind of a stored response's record, in its associated data.
RESPONSE_RECORD: Final = "response"
#: Bumped when the associated data or the layout change.
_VERSION: Final = b"ws_mode record v1"


class RecordUnreadable(Exception):
    """A stored record that cannot be read as this store is configured (the message says
    why, never with a key or the record's content): read as not stored."""


def key_id(key: bytes) -> str:
    """What names `key` in the records it encrypts: 16 hex digits of a SHA-256 of it (the key
    cannot be found from it)."""
    return hashlib.sha256(b"ws_mode key id\0" + key).hexdigest()[:16]


def _one_key(given: bytes | str, position: int) -> bytes:
    if isinstance(given, str):
        text = given.strip()
        try:
            if "-" in text or "_" in text:
                key = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            else:
                key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(
                f"encryption key {position + 1} is not base64 (a {KEY_BYTES}-byte key, "
                "base64-encoded: `openssl rand -base64 32`)"
            ) from None
    elif isinstance(given, bytes | bytearray | memoryview):
        key = bytes(given)
    else:
        raise ConfigError(
            f"encryption key {position + 1} is a {type(given).__name__}: give bytes or a "
            "base64 string"
        )
    if len(key) != KEY_BYTES:
        raise ConfigError(
            f"encryption key {position + 1} is {len(key)} bytes long: AES-256 keys are "
            f"{KEY_BYTES} bytes ({KEY_BYTES} random bytes, or their base64: "
            "`openssl rand -base64 32`)"
        )
    return key


def parse_keys(keys: Sequence[bytes | str]) -> list[bytes]:
    """`keys` (newest first: raw 32-byte keys, or their base64) as raw keys. ConfigError,
    naming the key's position and never its value, for a malformed or misplaced key, and for
    none at all or one listed twice."""
    if isinstance(keys, str | bytes):
        raise ConfigError("encryption_keys is a list of keys, newest first: [key] for one")
    parsed = [_one_key(given, position) for position, given in enumerate(keys)]
    if not parsed:
        raise ConfigError("encryption_keys is empty: give at least one key")
    ids = [key_id(key) for key in parsed]
    if len(set(ids)) != len(ids):
        raise ConfigError("encryption_keys lists one key twice")
    return parsed


def keys_from_env(name: str) -> list[bytes]:
    """The keys in the environment variable `name`: base64 keys separated by commas, newest
    first. ConfigError naming the variable (never its value) when it is unset, empty or
    holds a malformed key."""
    value = os.environ.get(name)
    if value is None or not value.strip():
        raise ConfigError(
            f"the environment variable {name} (the store URL's encryption_keys_env) is "
            f"{'unset' if value is None else 'empty'}: it holds the store's encryption keys, "
            "base64, separated by commas, newest first"
        )
    try:
        return parse_keys([part for part in value.split(",") if part.strip()])
    except ConfigError as exc:
        raise ConfigError(f"{exc} (in the environment variable {name})") from None


def _associated(kind: str, principal: str, response_id: str, head: bytes) -> bytes:
    """The associated data of a record: the layout's version, its kind, the principal it
    belongs to, the id it is read under, its head (unambiguous: a JSON array, then the head)."""
    return _VERSION + b"\n" + orjson.dumps([kind, principal, response_id]) + b"\n" + head


class RecordCodec:
    """How a store turns records into the bytes it keeps, and back: as they are (no keys), or
    encrypted (`keys`, newest first; the first encrypts). With `read_plaintext`, an encrypting
    codec also reads plain records (a store moving to encryption); without, it refuses them."""

    def __init__(self, keys: Sequence[bytes] = (), *, read_plaintext: bool = False) -> None:
        self._ciphers: dict[str, Any] = {}
        #: The ids of the keys, newest first (empty: records are kept as they are).
        self.key_ids: tuple[str, ...] = tuple(key_id(key) for key in keys)
        #: Whether plain records are read (a codec with no keys always reads them).
        self.read_plaintext = read_plaintext or not keys
        if keys:
            try:
                from cryptography.hazmat.primitives.ciphers.aead import AESGCM
            except ImportError as error:  # pragma: no cover - the extra is not installed
                raise ImportError(
                    f"an encrypted store needs cryptography: {install_hint('encryption')}"
                ) from error
            self._ciphers = {
                ident: AESGCM(key) for ident, key in zip(self.key_ids, keys, strict=True)
            }

    @property
    def encrypts(self) -> bool:
        """Whether records are encrypted."""
        return bool(self.key_ids)

    def encode(self, principal: str, record: StoredResponse, kind: str = RESPONSE_RECORD) -> bytes:
        """`record` as the bytes the store keeps for `principal`."""
        plain = record.encode()
        if not self.key_ids:
            return plain
        ident = self.key_ids[0]
        head = orjson.dumps(
            {
                "key": ident,
                "id": record.id,
                "parent_id": record.parent_id,
                "chain_id": record.chain_id,
            }
        )
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._ciphers[ident].encrypt(
            nonce, plain, _associated(kind, principal, record.id, head)
        )
        return b"".join((head, b"\n", nonce, sealed))

    def decode(
        self, principal: str, response_id: str, data: bytes, kind: str = RESPONSE_RECORD
    ) -> StoredResponse:
        """The record kept as `data` for `principal` under `response_id`; `RecordUnreadable`
        when it cannot be read as this codec is configured."""
        if not data.startswith(ENCRYPTED_HEAD):
            if not self.read_plaintext:
                raise RecordUnreadable(
                    "a plaintext record, and the store encrypts (read_plaintext reads those "
                    "while a store moves to encryption)"
                )
            try:
                record = StoredResponse.decode(data)
            except (ValueError, KeyError, TypeError):
                raise RecordUnreadable("a plaintext record that is damaged") from None
            if record.id != response_id:
                raise RecordUnreadable(f"a record of another response ({record.id})")
            return record
        head, _, body = data.partition(b"\n")
        try:
            ident = str(orjson.loads(head)["key"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise RecordUnreadable("an encrypted record whose head is damaged") from None
        if not self.key_ids:
            raise RecordUnreadable(
                f"encrypted under the key {ident}, and the store has no encryption keys"
            )
        cipher = self._ciphers.get(ident)
        if cipher is None:
            raise RecordUnreadable(
                f"encrypted under the key {ident}, which is not among the store's keys "
                f"({', '.join(self.key_ids)}): rotated out?"
            )
        from cryptography.exceptions import InvalidTag

        try:
            plain = cipher.decrypt(
                body[:NONCE_BYTES],
                body[NONCE_BYTES:],
                _associated(kind, principal, response_id, head),
            )
        except (InvalidTag, ValueError):
            raise RecordUnreadable(
                f"failed authentication under the key {ident}: tampered with, or copied "
                "under another id or principal"
            ) from None
        return StoredResponse.decode(plain)


def codec_of(
    keys: Sequence[bytes | str] | None,
    read_plaintext: bool | None,
    keys_env: str | None = None,
    url_read_plaintext: bool | None = None,
) -> RecordCodec:
    """How a store keeps its records: encrypted under `keys` (the keyword) or the keys in the
    environment variable `keys_env` (a URL's `encryption_keys_env`; not both), reading
    plaintext records too when `read_plaintext` (or the URL's `url_read_plaintext`) says so.
    ConfigError when the keys are malformed, or the two forms disagree."""
    if keys is not None and keys_env is not None:
        raise ConfigError(
            "encryption_keys and the URL's encryption_keys_env both give the store's keys: "
            "give one of them"
        )
    if (
        read_plaintext is not None
        and url_read_plaintext is not None
        and read_plaintext != url_read_plaintext
    ):
        raise ConfigError(
            f"read_plaintext={read_plaintext} and the URL's read_plaintext="
            f"{str(url_read_plaintext).lower()} disagree: give one of them"
        )
    plaintext = read_plaintext if read_plaintext is not None else url_read_plaintext
    if keys is not None:
        parsed = parse_keys(keys)
    elif keys_env is not None:
        parsed = keys_from_env(keys_env)
    else:
        if plaintext:
            raise ConfigError(
                "read_plaintext is for a store that encrypts (encryption_keys, or the URL's "
                "encryption_keys_env): this one keeps every record in plain"
            )
        return RecordCodec()
    return RecordCodec(parsed, read_plaintext=bool(plaintext))
