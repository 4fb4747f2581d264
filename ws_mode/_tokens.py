"""Rendered tokens, shared along a conversation instead of copied per turn.

A chain of n turns renders each item once. Every cached response holds a `Tokens` view: the first
`len` ids of an append-only buffer. A turn that continues the newest response of a chain extends
the same buffer in place, so a chain of n turns holds its tokens once, not n times; a fork (a
turn continuing an older response) copies the prefix once and grows its own buffer.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, overload

#: Renders items (input or output items of a response) to token ids.
Renderer = Callable[[list[dict[str, Any]]], Iterable[int]]


class Tokens(Sequence[int]):
    """A read-only view of the first `len(self)` token ids of a shared append-only buffer."""

    __slots__ = ("_buffer", "_length")

    def __init__(self, buffer: array[int] | None = None, length: int | None = None) -> None:
        self._buffer: array[int] = buffer if buffer is not None else array("I")
        self._length = len(self._buffer) if length is None else length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return self._buffer[: self._length][index].tolist()
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("token index out of range")
        return self._buffer[index]

    def __iter__(self) -> Iterator[int]:
        buffer = self._buffer
        for index in range(self._length):
            yield buffer[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Tokens):
            return self.tolist() == other.tolist()
        if isinstance(other, Sequence):
            return self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<Tokens len={self._length}>"

    def tolist(self) -> list[int]:
        """The ids as a list (a copy)."""
        return self._buffer[: self._length].tolist()

    def extended(self, *parts: Iterable[int]) -> Tokens:
        """These tokens followed by `parts`, sharing the buffer when this view is its end."""
        # The newest response of its chain grows the buffer in place; a fork copies the prefix.
        at_end = len(self._buffer) == self._length
        buffer = self._buffer if at_end else self._buffer[: self._length]
        for part in parts:
            buffer.extend(part)
        return Tokens(buffer, len(buffer))
