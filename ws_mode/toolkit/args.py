"""The tools' argparse types: bounded numbers and ports, with one-line messages."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

__all__ = ["number", "port"]


def number(
    kind: type[int] | type[float], minimum: float, *, strict: bool = False
) -> Callable[[str], Any]:
    """An argparse type: a finite number of ``kind`` that is >= ``minimum`` (> when
    ``strict``)."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
            ) from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if value < minimum or (strict and value == minimum):
            relation = ">" if strict else ">="
            raise argparse.ArgumentTypeError(f"must be {relation} {minimum:g}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def port(text: str) -> int:
    """An argparse type: a TCP port, 0 (any) to 65535."""
    value: int = number(int, 0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is at most 65535, got {value}")
    return value
