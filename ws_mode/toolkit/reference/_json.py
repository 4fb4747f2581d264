"""Canonical JSON: the one encoding the reference model digests and renders."""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["canonical_json"]


def canonical_json(value: Any) -> bytes:
    """``value`` as UTF-8 JSON with sorted keys and no whitespace."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        # orjson refuses integers beyond 64 bits; the standard library does not.
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
