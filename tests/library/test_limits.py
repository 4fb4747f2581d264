"""Every bound has one documented home, and the option reference names every argument.

Each `Limits` field is documented in the `Limits` docstring and in docs/limits.md; each
constant docs/limits.md lists under "Fixed bounds" exists in the code and is named in the
`Limits` docstring. (Each keyword of `WebSocketModeMiddleware`, with its default, has its row in
docs/api.md: tests/library/test_api_docs.py checks it.)
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import fields
from pathlib import Path

import pytest

from ws_mode import Limits

ROOT = Path(__file__).resolve().parents[2]
LIMITS_MD = (ROOT / "docs" / "limits.md").read_text(encoding="utf-8")
DOCSTRING = inspect.getdoc(Limits) or ""


def _section(text: str, heading: str) -> str:
    """The text under `heading` (a whole line), up to the next heading of the same level."""
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n")
    end = text.find(f"\n{level} ", start + len(heading) + 2)
    return text[start : end if end != -1 else len(text)]


def _fixed_bounds() -> list[str]:
    """The constants docs/limits.md lists as fixed, as dotted names under `ws_mode`."""
    section = _section(LIMITS_MD, "## Fixed bounds")
    return re.findall(r"^\| `ws_mode\.([\w.]+)` \|", section, flags=re.MULTILINE)


LIMIT_FIELDS = [field.name for field in fields(Limits)]


@pytest.mark.parametrize("name", LIMIT_FIELDS)
def test_every_limits_field_is_in_the_docstring(name: str) -> None:
    assert f"`{name}`" in DOCSTRING


@pytest.mark.parametrize("name", LIMIT_FIELDS)
def test_every_limits_field_is_in_the_table_of_docs_limits(name: str) -> None:
    table = LIMITS_MD.split("\n---\n", 1)[0]
    assert re.search(rf"^\| \[`{name}`\]\(#", table, flags=re.MULTILINE), name


def test_the_fixed_bounds_list_is_not_empty() -> None:
    # A broken parse must not make the two tests below pass vacuously.
    assert len(_fixed_bounds()) >= 20


@pytest.mark.parametrize("dotted", _fixed_bounds())
def test_every_listed_fixed_bound_exists_and_is_in_the_docstring(dotted: str) -> None:
    module, name = dotted.rsplit(".", 1)
    assert hasattr(importlib.import_module(f"ws_mode.{module}"), name), dotted
    assert f"`{dotted}`" in DOCSTRING


def test_the_docstring_lists_no_fixed_bound_the_docs_do_not() -> None:
    paragraph = DOCSTRING[DOCSTRING.index("Fixed bounds:") :]
    named = re.findall(r"`([a-z_.]+\.[A-Z_][A-Z0-9_]+)`", paragraph)
    assert sorted(named) == sorted(_fixed_bounds())
