"""Every bound has one documented home, and the option reference names every argument.

Each `Limits` field is documented in the `Limits` docstring and in docs/limits.md; each
constant docs/limits.md lists under "Fixed bounds" exists in the code and is named in the
`Limits` docstring; each keyword of `WebSocketModeMiddleware` has its own line in the README's
"Options" block.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import fields
from pathlib import Path

import pytest

from ws_mode import Limits, WebSocketModeMiddleware

ROOT = Path(__file__).resolve().parents[2]
LIMITS_MD = (ROOT / "docs" / "limits.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")
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


@pytest.mark.parametrize("name", LIMIT_FIELDS)
def test_every_limits_field_is_in_the_readme_table(name: str) -> None:
    assert re.search(rf"^\| `{name}` \|", _section(README, "## Options"), flags=re.MULTILINE)


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


KEYWORDS = [
    name
    for name, parameter in inspect.signature(WebSocketModeMiddleware.__init__).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY
]


def test_the_middleware_has_keywords_to_check() -> None:
    assert "limits" in KEYWORDS
    assert len(KEYWORDS) >= 10


@pytest.mark.parametrize("name", KEYWORDS)
def test_every_middleware_keyword_has_its_line_in_the_option_reference(name: str) -> None:
    default = inspect.signature(WebSocketModeMiddleware.__init__).parameters[name].default
    block = _section(README, "## Options").split("```", 2)[1]
    line = re.search(rf"^    {name}=(.*?),\s+# \S", block, flags=re.MULTILINE)
    assert line, f"README Options: no commented line for {name}="
    if default is not None and not isinstance(default, Limits | tuple):
        assert line.group(1) == repr(default).replace("'", '"'), name
