"""The built wheel holds the product only: the library, the kit (`ws_mode.testing`) and the
`ws-mode` command with what it runs; the lab (`benchmarks/`, run from a clone) stays out."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: What a user of the installed package imports or runs: the library, the kit, the commands.
PRODUCT = (
    "ws_mode/__init__.py",
    "ws_mode/_middleware.py",
    "ws_mode/proxy/__init__.py",
    "ws_mode/server.py",
    "ws_mode/testing/__init__.py",
    "ws_mode/testing/_conformance.py",
    "ws_mode/toolkit/cli/__init__.py",
    "ws_mode/toolkit/cli/serve.py",
    "ws_mode/toolkit/cli/proxy.py",
    "ws_mode/toolkit/cli/check.py",
    "ws_mode/toolkit/cli/demo.py",
    "ws_mode/toolkit/cli/bench.py",
    "ws_mode/toolkit/bench/rollout.py",
    "ws_mode/toolkit/bench/url.py",
    "ws_mode/toolkit/reference/server.py",
)


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The file list of the wheel `pip wheel` builds from this checkout (a few seconds)."""
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(ROOT), "-w", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = out.glob("ws_mode-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_the_wheel_holds_the_library_the_kit_and_the_commands(wheel_files: list[str]) -> None:
    assert [name for name in PRODUCT if name not in wheel_files] == []
    entry_points = next(name for name in wheel_files if name.endswith("entry_points.txt"))
    assert entry_points.startswith("ws_mode-")


def test_the_lab_is_not_in_the_wheel(wheel_files: list[str]) -> None:
    assert [name for name in wheel_files if "benchmarks" in name] == []
    assert "ws_mode/toolkit/bench/load.py" not in wheel_files
    assert "ws_mode/toolkit/bench/store.py" not in wheel_files
    assert [name for name in wheel_files if name.startswith("tests/")] == []
    # Everything is under the package or its metadata.
    assert {name.split("/")[0] for name in wheel_files} == {
        "ws_mode",
        next(name.split("/")[0] for name in wheel_files if ".dist-info/" in name),
    }


def test_the_version_is_the_wheel_s_and_the_changelog_s(wheel_files: list[str]) -> None:
    import re

    import ws_mode

    (info,) = {name.split("/")[0] for name in wheel_files if ".dist-info/" in name}
    assert info == f"ws_mode-{ws_mode.__version__}.dist-info"
    # The changelog's newest section is this version: a release's, or the next one's while
    # the clone is between releases (.devN).
    changelog = (ROOT / "CHANGELOG.md").read_text()
    newest = re.search(r"^## (\d+\.\d+\.\d+)", changelog, re.MULTILINE)
    assert newest is not None
    release, _, dev = ws_mode.__version__.partition(".dev")
    assert newest.group(1) == release
    heading = changelog[newest.start() : changelog.index("\n", newest.start())]
    assert ("(in development)" in heading) == bool(dev), heading
