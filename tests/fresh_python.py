"""Code run in a fresh interpreter, for what one test process cannot show: what a module imports
(or runs without), and process-wide settings such as the garbage collector's."""

from __future__ import annotations

import subprocess
import sys


def fresh_output(code: str, *arguments: str) -> list[str]:
    """The words ``code`` prints, run by a new Python interpreter with ``arguments``
    (``sys.argv[1:]``); it must exit with 0."""
    done = subprocess.run(
        [sys.executable, "-c", code, *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.split()
