"""How to install one of ws_mode's extras, as the install hints of error messages say it.

ws_mode is not published on a package index yet: it installs from a clone of its repository, so
a hint names the extra on the clone's directory (``pip install ".[redis]"`` run in the clone;
from elsewhere, its path: ``pip install "/path/to/ws_mode[redis]"``). Every runtime hint comes
from :func:`install_hint`, the one place to change once the package is published.
"""

from __future__ import annotations


def install_hint(extra: str) -> str:
    """The command that installs the extra ``extra`` (``redis``, ``cli``, ...), and where to run
    it."""
    return f'pip install ".[{extra}]" in a clone of ws_mode (it is not published yet)'
