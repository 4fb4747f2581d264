"""Readable differences: how two item lists or two sets of request fields differ, shortened for
a failure message."""

from __future__ import annotations

from typing import Any

import orjson

SHORT = 240  # characters of a value shown in a failure message


def short(value: Any, limit: int = SHORT) -> str:
    """`value` as compact JSON (a string as it is), cut after `limit` characters."""
    text = value if isinstance(value, str) else orjson.dumps(value, default=repr).decode()
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def diff_items(expected: list[Any], received: Any) -> str:
    """How the items the handler received differ from the expected ones: one missing or extra
    item, else the first item that differs."""
    if not isinstance(received, list):
        return f"expected {len(expected)} items, received {short(received)}"
    lines = [f"expected {len(expected)} items, the handler received {len(received)}"]
    if len(received) == len(expected) - 1:
        for index in range(len(expected)):
            if received == expected[:index] + expected[index + 1 :]:
                lines.append(f"item {index} is missing: {short(expected[index])}")
                return "\n".join(lines)
    if len(received) == len(expected) + 1:
        for index in range(len(received)):
            if expected == received[:index] + received[index + 1 :]:
                lines.append(f"item {index} is extra: {short(received[index])}")
                return "\n".join(lines)
    for index, (want, got) in enumerate(zip(expected, received, strict=False)):
        if want != got:
            lines.append(f"first difference at item {index}:")
            lines.append(f"  expected: {short(want)}")
            lines.append(f"  received: {short(got)}")
            return "\n".join(lines)
    shorter, longer = sorted((expected, received), key=len)
    if len(longer) > len(shorter):
        which = "missing" if longer is expected else "extra"
        index = len(shorter)
        lines.append(f"item {index} is {which}: {short(longer[index])}")
    return "\n".join(lines)


def diff_fields(expected: dict[str, Any], received: dict[str, Any]) -> str:
    """One line a field that is missing, unexpected or different."""
    lines = []
    for key in sorted(set(expected) | set(received)):
        if key not in received:
            lines.append(f"{key!r} is missing (expected {short(expected[key], 120)})")
        elif key not in expected:
            lines.append(f"{key!r} is unexpected: {short(received[key], 120)}")
        elif expected[key] != received[key]:
            lines.append(
                f"{key!r}: expected {short(expected[key], 120)}, "
                f"received {short(received[key], 120)}"
            )
    return "\n".join(lines)
