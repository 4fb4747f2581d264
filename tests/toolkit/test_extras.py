"""The tools import without the optional packages they do not need: the runner and the socket
client with only the ``testing`` extra, the command's modules with none of the ``cli`` extra's
display and HTTP packages (each command imports those when it runs)."""

from __future__ import annotations

import subprocess
import sys

import pytest

#: Installed here, but in none of the `testing` extra and not in the core.
OPTIONAL = ("httpx", "rich", "matplotlib", "psutil", "tokenizers", "hypercorn")


@pytest.mark.parametrize(
    "module",
    [
        "ws_mode.toolkit",
        "ws_mode.testing._loopback",
        "ws_mode.testing._client",
        "ws_mode.toolkit.measure",
        "ws_mode.toolkit.args",
        "ws_mode.toolkit.cli",
        "ws_mode.toolkit.bench.options",
    ],
)
def test_imports_without_the_optional_packages(module: str) -> None:
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in OPTIONAL)
    script = f"import sys; {blocked}; import {module}"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
