"""Running ``ws-mode check`` in the tests: the flags of a quick run and the table read back."""

from __future__ import annotations

import re

import pytest

from ws_mode.toolkit.cli import main

#: The flags of a quick run: no idle wait, no message-size probe, a 10 s turn.
FAST = ("--idle", "0", "--max-probe-bytes", "0", "--timeout", "10")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, dict[str, str], str]:
    """``ws-mode check ARGS``: its exit status, its output, each row's result, and what it
    said on stderr (which holds no traceback)."""
    status = main(["check", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    rows = {}
    for line in out.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) >= 2 and cells[1] in ("ok", "FAILED", "skipped"):
            rows[cells[0]] = cells[1]
    return status, out, rows, err


def flat(out: str) -> str:
    """The output with its line breaks (the wrapped hints') made spaces."""
    return " ".join(out.split())


def row(out: str, name: str) -> str:
    """The table line of the check ``name``."""
    return next(line for line in out.splitlines() if line.strip().startswith(name + "  "))
