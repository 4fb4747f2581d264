"""The tools import without the optional packages they do not need: the runner and the socket
client with only the ``testing`` extra, the command's modules with none of the ``cli`` extra's
display and HTTP packages (each command imports those when it runs); ``ws-mode check`` runs
with only the core's and the ``check`` extra's packages importable."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

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


ROOT = Path(__file__).resolve().parents[2]
#: A child that can import the standard library, ws_mode and the modules in argv[1] (comma
#: separated) only, then runs the ws-mode command with the rest of argv.
ONLY = """
import sys
allowed = set(sys.argv[1].split(",")) | set(sys.stdlib_module_names) | {"ws_mode"}
class Only:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in allowed:
            raise ModuleNotFoundError(f"No module named {name!r} (not in the extra)", name=name)
        return None
sys.meta_path.insert(0, Only())
from ws_mode.toolkit.cli import main
sys.exit(main(sys.argv[2:]))
"""


def importable_with(extra: str) -> set[str]:
    """The top-level modules of the core's distributions, the extra's and what they require
    (here, on this Python)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"][extra]]
    names: set[str] = set()
    while wanted:
        requirement = wanted.pop()
        marker = requirement.partition(";")[2].strip()
        if marker and not _marker_holds(marker):
            continue
        name = re.match(r"[A-Za-z0-9_.-]+", requirement)
        assert name is not None
        dist = name.group(0).lower().replace("_", "-")
        if dist in names:
            continue
        names.add(dist)
        wanted.extend(importlib.metadata.requires(dist) or [])
    modules = importlib.metadata.packages_distributions()
    return {
        module
        for module, dists in modules.items()
        if any(d.lower().replace("_", "-") in names for d in dists)
    }


def _marker_holds(marker: str) -> bool:
    from packaging.markers import Marker

    return Marker(marker).evaluate({"extra": ""})


def ws_mode_with_only(extra: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    allowed = ",".join(sorted(importable_with(extra)))
    return subprocess.run(
        [sys.executable, "-c", ONLY, allowed, *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_ws_mode_check_runs_with_only_the_check_extra() -> None:
    assert importable_with("check") >= {"websockets", "orjson"}
    assert not importable_with("check") & {"tokenizers", "uvicorn", "rich", "starlette"}
    helped = ws_mode_with_only("check", "check", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "usage: ws-mode check" in helped.stdout
    from tests.servers import serve
    from tests.toolkit.cli.checks import FAST
    from ws_mode.toolkit.cli.serve import build_app

    with serve(build_app()) as base:
        checked = ws_mode_with_only(
            "check", "check", base, "--quiet", *FAST, "--case", "lanes.stream_id*"
        )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "FAILED" not in checked.stdout
