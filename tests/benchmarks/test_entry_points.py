"""Every script of the lab runs from the clone as `python -m benchmarks.NAME`: its imports resolve
outside the package it left, and its command line answers `--help`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPTS = sorted(
    path.stem if path.suffix == ".py" else path.name
    for path in (ROOT / "benchmarks").iterdir()
    if (path.suffix == ".py" and path.stem != "__init__") or (path / "__main__.py").exists()
)
#: Helpers of the peer comparisons, not run by themselves.
HELPERS = {"peer_run"}


def run_from_the_clone(*arguments: str) -> subprocess.CompletedProcess[str]:
    """``python ARGUMENTS`` in the clone's root, as a user of the lab runs it."""
    return subprocess.run(
        [sys.executable, *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_lab_s_scripts_are_found() -> None:
    assert {"load", "store", "peer_agentic", "peer_litellm", "deflate_threshold"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", [name for name in SCRIPTS if name not in HELPERS])
def test_the_script_answers_help(name: str) -> None:
    run = run_from_the_clone("-m", f"benchmarks.{name}", "--help")
    assert run.returncode == 0, run.stderr
    assert "usage:" in run.stdout


def test_the_helpers_import() -> None:
    run = run_from_the_clone("-c", "import benchmarks.peer_run")
    assert run.returncode == 0, run.stderr
