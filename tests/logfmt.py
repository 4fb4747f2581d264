"""A strict logfmt reader, for the tests of the access log: what a log pipeline (Loki's
`| logfmt`, Go's logfmt decoders) takes from a line.

A line is space-separated tokens, each `key=value` or a key alone; a key or a value is a bare
run of characters with no space, `=` or `"`, or a double-quoted string in which a backslash
escapes the next character (`\\"`, `\\\\`, `\\n`, `\\t`, `\\r`, `\\xNN`, `\\uNNNN`,
`\\UNNNNNNNN`). Anything else (a quote inside a bare token, an unterminated quote, a token glued
to the next) is refused with `ValueError`, as a strict reader refuses it.

`AccessLine` reads one of ws_mode's access log lines: the five tokens uvicorn's style puts
first (the client, `-`, the quoted request, the outcome, the duration), then the fields, which
must be exactly the ones expected, in order, each once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "r": "\r"}
_HEX = {"x": 2, "u": 4, "U": 8}


def _quoted(text: str, start: int) -> tuple[str, int]:
    """The string quoted at `text[start]` (a `"`), unescaped, and where it ends."""
    out: list[str] = []
    i = start + 1
    while i < len(text):
        char = text[i]
        if char == '"':
            return "".join(out), i + 1
        if char == "\\":
            code = text[i + 1 : i + 2]
            if code in _ESCAPES:
                out.append(_ESCAPES[code])
                i += 2
                continue
            if code in _HEX:
                digits = text[i + 2 : i + 2 + _HEX[code]]
                if len(digits) != _HEX[code] or not re.fullmatch(r"[0-9a-fA-F]+", digits):
                    raise ValueError(f"bad escape at {i}: {text[i : i + 10]!r}")
                out.append(chr(int(digits, 16)))
                i += 2 + _HEX[code]
                continue
            raise ValueError(f"bad escape at {i}: {text[i : i + 3]!r}")
        if not char.isprintable():
            raise ValueError(f"unescaped control character at {i}")
        out.append(char)
        i += 1
    raise ValueError(f"unterminated quote at {start}")


def _token(text: str, start: int, *, key: bool) -> tuple[str, int]:
    if text[start] == '"':
        return _quoted(text, start)
    i = start
    while i < len(text) and text[i] != " " and not (key and text[i] == "="):
        if text[i] == '"' or (not key and text[i] == "="):
            raise ValueError(f"{text[i]!r} inside a bare token at {i}")
        if not text[i].isprintable():
            raise ValueError(f"unescaped control character at {i}")
        i += 1
    if i == start:
        raise ValueError(f"empty token at {start}")
    return text[start:i], i


def read(text: str) -> list[tuple[str, str | None]]:
    """The pairs of a logfmt line, in order: `(key, value)`, `(key, None)` for a key alone."""
    pairs: list[tuple[str, str | None]] = []
    i = 0
    while i < len(text):
        if text[i] == " ":
            i += 1
            continue
        key, i = _token(text, i, key=True)
        value: str | None = None
        if i < len(text) and text[i] == "=":
            if i + 1 >= len(text) or text[i + 1] == " ":
                value, i = "", i + 1
            else:
                value, i = _token(text, i + 1, key=False)
        if i < len(text) and text[i] != " ":
            raise ValueError(f"a token glued to the next at {i}")
        pairs.append((key, value))
    return pairs


#: The access log's names for some fields, as the tests name them.
_RENAMED = {"in": "bytes_in", "out": "bytes_out"}


@dataclass(frozen=True)
class AccessLine:
    """One kind of access log line: its quoted request (`"response.create /v1/responses"`),
    its fields in order, the names its outcome and duration take, and the clients it may
    name (a regular expression)."""

    request: str
    fields: tuple[str, ...]
    outcome: str
    duration: str
    unit: str
    client: str = r"127\.0\.0\.1:\d+"

    def fullmatch(self, message: str) -> dict[str, str] | None:
        """The line's values by name (`bytes_in`, `bytes_out` for `in`, `out`), or None when
        `message` is not such a line as a strict logfmt reader takes it."""
        try:
            pairs = read(message)
        except ValueError:
            return None
        if len(pairs) != 5 + len(self.fields) or any(v is not None for _, v in pairs[:5]):
            return None
        client, dash, request, outcome, duration = (key for key, _ in pairs[:5])
        if (dash, request) != ("-", self.request) or not re.fullmatch(self.client, client):
            return None
        if not duration.endswith(self.unit):
            return None
        named = pairs[5:]
        if tuple(key for key, _ in named) != self.fields:
            return None
        values = {_RENAMED.get(key, key): value for key, value in named if value is not None}
        if len(values) != len(self.fields):
            return None
        values.update(
            {"client": client, self.outcome: outcome, self.duration: duration[: -len(self.unit)]}
        )
        return values
