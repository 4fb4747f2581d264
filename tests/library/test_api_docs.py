"""docs/api.md against the code: every public name has its entry, every documented call lists
each argument of its signature with the default the signature has, and the page's links lead
somewhere.

The page's format is stated at its top: a `### \\`dotted.name(...)\\`` heading documents a call
and holds one `| argument | type | default | meaning |` table, a row per parameter in the
signature's order, the default cell starting with the default's `repr` (or the dotted name of
the constant that is the default) in backticks, `required` for none and `—` for `*args` and
`**kwargs`; a heading without `(...)` documents a class the library hands out, a type or a
value; `| attribute | type | meaning |` rows name attributes and methods; `| constant | value |
meaning |` rows name constants. The checks are functions of the page's text, so the last tests
run them on pages made to lie and see them complain.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import typing
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import pytest

import ws_mode
import ws_mode.fastapi
import ws_mode.prometheus
import ws_mode.proxy
import ws_mode.redis_store
import ws_mode.server
import ws_mode.testing
from ws_mode import (
    Limits,
    MemoryStore,
    QuotaExceeded,
    ResponseStore,
    Stats,
    StoredResponse,
    WebSocketModeMiddleware,
)
from ws_mode._stats import METRICS
from ws_mode.testing import (
    CheckOptions,
    CompatibilityCheck,
    CompatibilityChecks,
    CompatibilityError,
    Coverage,
    NondeterminismError,
    RecordedCall,
    Report,
    SDKValidationWarning,
    TurnReport,
)

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGE = (DOCS / "api.md").read_text(encoding="utf-8")

#: The modules whose `__all__` the page must cover, name by name.
PUBLIC_MODULES: tuple[ModuleType, ...] = (
    ws_mode,
    ws_mode.proxy,
    ws_mode.testing,
    ws_mode.redis_store,
    ws_mode.server,
    ws_mode.prometheus,
    ws_mode.fastapi,
)

#: Classes the library builds (or raises) and hands out: the page documents what they offer,
#: not their constructors. Every other public class, and every public function, is documented
#: as a call. Keyed by the object, so a class exported under a new name is still recognised.
HANDED_OUT: frozenset[object] = frozenset(
    {
        ws_mode.Turn,
        ws_mode.CachedResponse,
        ws_mode.Tokens,
        ws_mode.Usage,
        ws_mode.WSModeError,
        ws_mode.ConfigError,
        Stats,
        ResponseStore,
        StoredResponse,
        QuotaExceeded,
        ws_mode.redis_store.RedisStoreError,
        ws_mode.proxy.ResponsesProxy,
        ws_mode.proxy.TargetRefused,
        CheckOptions,
        CompatibilityChecks,
        CompatibilityError,
        Report,
        TurnReport,
        RecordedCall,
        NondeterminismError,
        SDKValidationWarning,
        Coverage,
    }
)

#: The calls the guides send readers to, whether or not an `__all__` lists them.
REQUIRED_CALLS = (
    "ws_mode.WebSocketModeMiddleware",
    "ws_mode.WebSocketModeMiddleware.drain",
    "ws_mode.Limits",
    "ws_mode.turn",
    "ws_mode.find_middlewares",
    "ws_mode.bearer_token",
    "ws_mode.AuthenticationFailed",
    "ws_mode.MemoryStore",
    "ws_mode.redis_store.RedisStore",
    "ws_mode.redis_store.RedisStore.from_client",
    "ws_mode.server.Server",
    "ws_mode.prometheus.register",
    "ws_mode.prometheus.StatsCollector",
    "ws_mode.fastapi.current_turn",
    "ws_mode.proxy.create_proxy",
    "ws_mode.testing.CompatibilityCheck",
    "ws_mode.testing.check_conversation",
    "ws_mode.testing.conversations",
    "ws_mode.testing.Step",
    "ws_mode.testing.Conversation",
)

#: Instances whose attributes are set in `__init__` (not visible on the class).
INSTANCES: dict[type, Callable[[], object]] = {
    WebSocketModeMiddleware: lambda: WebSocketModeMiddleware(_app),
    ws_mode.AuthenticationFailed: ws_mode.AuthenticationFailed,
    MemoryStore: MemoryStore,
    ws_mode.redis_store.RedisStore: ws_mode.redis_store.RedisStore,
    ws_mode.proxy.ResponsesProxy: lambda: ws_mode.proxy.create_proxy("http://127.0.0.1:9/v1"),
    CompatibilityCheck: lambda: CompatibilityCheck(_app),
    CompatibilityError: lambda: CompatibilityError("a problem"),
}

ARGUMENTS = ("argument", "type", "default", "meaning")
ATTRIBUTES = ("attribute", "type", "meaning")
CONSTANTS = ("constant", "value", "meaning")
STATS_KEYS = ("`snapshot()` key", "kind", "meaning")
NO_DEFAULT = "required"
VARIADIC_PREFIX: dict[inspect._ParameterKind, str] = {
    inspect.Parameter.VAR_POSITIONAL: "*",
    inspect.Parameter.VAR_KEYWORD: "**",
}
VARIADIC = "—"


async def _app(scope: Any, receive: Any, send: Any) -> None:
    """An ASGI app for the instances above, never called."""


# Reading the page.


@dataclass(frozen=True)
class Entry:
    """One `###` entry: its dotted name, whether it documents a call, and its text."""

    name: str
    call: bool
    text: str


def _outside_code(text: str) -> Iterator[str]:
    """The lines of `text` outside fenced code blocks."""
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield line


def entries(page: str) -> list[Entry]:
    """The page's entries, in order."""
    found: list[Entry] = []
    current: tuple[str, bool] | None = None
    body: list[str] = []
    for line in [*_outside_code(page), "## (end)"]:
        if line.startswith(("## ", "### ")):
            if current is not None:
                found.append(Entry(current[0], current[1], "\n".join(body)))
            heading = re.fullmatch(r"### `([A-Za-z_][\w.]*?)(\(\.\.\.\))?`", line)
            current = (heading.group(1), bool(heading.group(2))) if heading else None
            body = []
        else:
            body.append(line)
    return found


def _cells(row: str) -> list[str]:
    inner = row.strip()[1:-1]
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", inner)]


def tables(text: str, header: tuple[str, ...]) -> list[list[list[str]]]:
    """The rows (as cells) of each table in `text` whose header is `header`."""
    lines = list(_outside_code(text))
    found: list[list[list[str]]] = []
    for index, line in enumerate(lines):
        if line.startswith("|") and tuple(_cells(line)) == header:
            rows: list[list[str]] = []
            for row in lines[index + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(_cells(row))
            found.append(rows)
    return found


def _code(cell: str) -> str | None:
    """The first backticked span of a cell, if the cell starts with one."""
    match = re.match(r"`([^`]+)`", cell)
    return match.group(1) if match else None


def _name(cell: str) -> str | None:
    """An attribute's or argument's name in its cell (a method without its parentheses)."""
    match = re.match(r"`(\**\w+)", cell)
    return match.group(1) if match else None


def resolve(dotted: str) -> object:
    """The object a dotted name names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for part in parts[split:]:
            found = getattr(found, part)
        return found
    raise LookupError(dotted)


def _resolves(dotted: str) -> object | None:
    try:
        return resolve(dotted)
    except (LookupError, AttributeError):
        return None


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a markdown file."""
    seen: Counter[str] = Counter()
    found: set[str] = set()
    for line in _outside_code(markdown):
        heading = re.match(r"#{1,6} (.*)", line)
        if heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return found


def section(markdown: str, anchor: str) -> str:
    """The heading whose anchor is `anchor` and its text, up to the next heading."""
    lines = list(_outside_code(markdown))
    for index, line in enumerate(lines):
        if line.startswith("#") and anchor in anchors(line):
            rest = lines[index + 1 :]
            end = next((i for i, later in enumerate(rest) if later.startswith("#")), len(rest))
            return "\n".join([line, *rest[:end]])
    return ""


# The code's side.


@dataclass(frozen=True)
class Parameter:
    """A parameter as the page names it (`*args`, `**options`), and its default if any."""

    name: str
    has_default: bool
    default: object
    variadic: bool


def parameters(call: object) -> list[Parameter]:
    """The parameters of a call, `self` left out, dataclass factories called."""
    assert callable(call)
    signature = list(inspect.signature(call).parameters.values())
    if inspect.isfunction(call) and signature and signature[0].name == "self":
        signature = signature[1:]  # a method documented on its class
    factories: dict[str, Callable[[], object]] = {}
    if isinstance(call, type) and dataclasses.is_dataclass(call):
        for field in dataclasses.fields(call):
            if field.default_factory is not dataclasses.MISSING:
                factories[field.name] = field.default_factory
    found: list[Parameter] = []
    for parameter in signature:
        prefix = VARIADIC_PREFIX.get(parameter.kind, "")
        default: object = parameter.default
        if parameter.name in factories:
            default = factories[parameter.name]()
        found.append(
            Parameter(
                prefix + parameter.name,
                parameter.default is not parameter.empty,
                default,
                bool(prefix),
            )
        )
    return found


def default_problem(where: str, parameter: Parameter, cell: str) -> str | None:
    """What is wrong with a default cell, or None."""
    if parameter.variadic:
        return None if cell == VARIADIC else f"{where}: the default cell must be {VARIADIC}"
    if not parameter.has_default:
        return None if cell == NO_DEFAULT else f"{where}: no default, the page says {cell!r}"
    shown = _code(cell)
    expected = repr(parameter.default)
    if shown is None:
        return f"{where}: the default {expected} is not given in backticks"
    if shown == expected:
        return None
    named = "." in shown and re.fullmatch(r"[A-Za-z_][\w.]*", shown) is not None
    if named and _resolves(shown) is parameter.default:
        return None
    return f"{where}: the default is {expected}, the page says {shown}"


def _is_call(value: object) -> bool:
    return inspect.isfunction(value) or (isinstance(value, type) and value not in HANDED_OUT)


# The checks.


def call_problems(page: str) -> list[str]:
    """Each call entry has one argument table matching its signature; no other entry has one."""
    problems: list[str] = []
    for entry in entries(page):
        found = tables(entry.text, ARGUMENTS)
        if not entry.call:
            if found:
                problems.append(f"{entry.name}: an argument table under a heading without (...)")
            continue
        target = _resolves(entry.name)
        if target is None or not callable(target):
            problems.append(f"{entry.name}: the heading names no callable")
            continue
        expected = parameters(target)
        if len(found) != 1:
            problems.append(f"{entry.name}(...): {len(found)} argument tables, not one")
            continue
        rows = found[0]
        documented = [_name(row[0]) for row in rows]
        wanted = [parameter.name for parameter in expected]
        for name in wanted:
            if name not in documented:
                problems.append(f"{entry.name}(...): no row for the argument {name}")
        for shown in documented:
            if shown not in wanted:
                problems.append(f"{entry.name}(...): a row for {shown}, which it does not take")
        if [name for name in documented if name in wanted] != wanted:
            problems.append(f"{entry.name}(...): rows not in the signature's order {wanted}")
        by_name = {parameter.name: parameter for parameter in expected}
        for row in rows:
            named = _name(row[0])
            where = f"{entry.name}(...) {named}"
            if len(row) != len(ARGUMENTS) or not all(row):
                problems.append(f"{where}: the row needs a name, a type, a default and a meaning")
                continue
            if named in by_name:
                problem = default_problem(where, by_name[named], row[2])
                if problem is not None:
                    problems.append(problem)
    return problems


def attribute_problems(page: str) -> list[str]:
    """Every attribute or method a class's entry lists exists."""
    problems: list[str] = []
    for entry in entries(page):
        rows = [row for table in tables(entry.text, ATTRIBUTES) for row in table]
        if not rows:
            continue
        owner = _resolves(entry.name)
        if not isinstance(owner, type):
            problems.append(f"{entry.name}: attributes listed for what is not a class")
            continue
        known = set(dir(owner))
        if dataclasses.is_dataclass(owner):
            known |= {field.name for field in dataclasses.fields(owner)}
        make = INSTANCES.get(owner)
        for row in rows:
            name = _name(row[0])
            if name is None or len(row) != len(ATTRIBUTES) or not all(row):
                problems.append(f"{entry.name}: a malformed attribute row {row}")
                continue
            if name not in known and make is not None:
                known |= set(dir(make()))
            if name not in known:
                problems.append(f"{entry.name}: no attribute or method {name}")
    return problems


def _documented(page: str) -> dict[str, bool]:
    """Every dotted name the page documents, and whether as a call."""
    names = {entry.name: entry.call for entry in entries(page)}
    for table in tables(page, CONSTANTS):
        for row in table:
            shown = _code(row[0])
            if shown is not None:
                names.setdefault(shown, False)
    return names


def coverage_problems(page: str) -> list[str]:
    """Every name of every public `__all__` has its entry (under any dotted name for the same
    object), as a call for functions and for classes you construct; so do the calls the
    guides name."""
    documented = _documented(page)
    by_object: dict[int, list[bool]] = {}
    for dotted, call in documented.items():
        found = _resolves(dotted)
        if found is not None and not isinstance(found, str | int | float | bool):
            by_object.setdefault(id(found), []).append(call)
    problems: list[str] = []
    for module in PUBLIC_MODULES:
        for name in module.__all__:
            dotted = f"{module.__name__}.{name}"
            value = getattr(module, name)
            # Under its own name, or under another one for the same object (a re-export).
            calls = [documented[dotted]] if dotted in documented else by_object.get(id(value), [])
            if not calls:
                problems.append(f"{dotted} has no entry on the page")
            elif _is_call(value) and not any(calls):
                problems.append(f"{dotted} is documented without its arguments (no (...) entry)")
    for dotted in REQUIRED_CALLS:
        if not documented.get(dotted):
            problems.append(f"{dotted}(...) has no entry with its arguments")
    return problems


def limits_problems(page: str) -> list[str]:
    """Every `Limits` field has its row, linked to its own section of docs/limits.md."""
    limits_md = (DOCS / "limits.md").read_text(encoding="utf-8")
    entry = next((entry for entry in entries(page) if entry.name == "ws_mode.Limits"), None)
    found = tables(entry.text, ARGUMENTS) if entry is not None else []
    rows = {_name(row[0]): row for row in found[0]} if found else {}
    problems: list[str] = []
    for field in dataclasses.fields(Limits):
        row = rows.get(field.name)
        if row is None:
            problems.append(f"Limits.{field.name} has no row")
            continue
        link = re.search(r"\]\(limits\.md#([\w-]+)\)", row[-1])
        if link is None:
            problems.append(f"Limits.{field.name}: no link to its section of limits.md")
        elif f"`{field.name}`" not in section(limits_md, link.group(1)):
            problems.append(
                f"Limits.{field.name}: limits.md#{link.group(1)} is not a section about it"
            )
    return problems


def stats_problems(page: str) -> list[str]:
    """The `snapshot()` table lists every key `Stats.snapshot()` gives, counters and gauges
    with their kind, and no key it does not give."""
    rows = [row for table in tables(page, STATS_KEYS) for row in table]
    documented = {_name(row[0]): row[1] for row in rows}
    problems = [
        f"snapshot() key {key} ({kind}) is not documented as such"
        for key, kind, _meaning in METRICS
        if documented.get(key) != kind
    ]
    given = set(Stats().snapshot()) | {key for key, _kind, _meaning in METRICS}
    problems += [
        f"snapshot() key {key} is not documented" for key in given if key not in documented
    ]
    problems += [f"snapshot() gives no key {key}" for key in documented if key not in given]
    return problems


def link_problems(page: str) -> list[str]:
    """Every relative link leads to a file of docs/ and, with an anchor, to one of its
    headings."""
    problems: list[str] = []
    for target in re.findall(r"\]\(([^)\s]+)\)", "\n".join(_outside_code(page))):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (DOCS / file) if file else DOCS / "api.md"
        if not path.is_file():
            problems.append(f"link to {target}: no such file")
            continue
        text = page if not file else path.read_text(encoding="utf-8")
        if anchor and anchor not in anchors(text):
            problems.append(f"link to {target}: no such heading")
    return problems


def problems(page: str) -> list[str]:
    """Everything wrong with a page."""
    return [
        *call_problems(page),
        *attribute_problems(page),
        *coverage_problems(page),
        *limits_problems(page),
        *stats_problems(page),
        *link_problems(page),
    ]


# The page as it is.


def test_the_page_parses_into_entries_and_calls() -> None:
    # A broken parse must not make the checks below pass vacuously.
    found = entries(PAGE)
    assert len(found) >= 40
    calls = [entry for entry in found if entry.call]
    assert len(calls) >= len(REQUIRED_CALLS)
    assert all(len(tables(entry.text, ARGUMENTS)) == 1 for entry in calls)
    rows = tables(
        next(e for e in found if e.name == "ws_mode.WebSocketModeMiddleware").text, ARGUMENTS
    )
    assert len(rows[0]) == len(inspect.signature(WebSocketModeMiddleware).parameters)


def test_every_documented_call_lists_each_argument_with_its_default() -> None:
    assert call_problems(PAGE) == []


def test_every_documented_attribute_and_method_exists() -> None:
    assert attribute_problems(PAGE) == []


def test_every_public_name_is_documented() -> None:
    assert coverage_problems(PAGE) == []


def test_every_limits_field_has_its_row_and_its_section() -> None:
    assert limits_problems(PAGE) == []


def test_every_stats_key_is_documented() -> None:
    assert stats_problems(PAGE) == []


def test_links_lead_to_headings() -> None:
    assert link_problems(PAGE) == []


def test_links_into_the_page_from_the_other_docs_lead_to_headings() -> None:
    targets = anchors(PAGE)
    broken: list[str] = []
    for doc in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = "\n".join(_outside_code(doc.read_text(encoding="utf-8")))
        for anchor in re.findall(r"\]\((?:docs/)?api\.md#([^)\s]+)\)", text):
            if anchor not in targets:
                broken.append(f"{doc.name}: api.md#{anchor}")
    assert broken == []
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "(docs/api.md)" in readme


def test_check_options_are_the_keywords_of_compatibility_check() -> None:
    keywords = [
        name
        for name, parameter in inspect.signature(CompatibilityCheck).parameters.items()
        if parameter.kind is parameter.KEYWORD_ONLY
    ]
    assert list(typing.get_type_hints(CheckOptions)) == keywords
    entry = next(entry for entry in entries(PAGE) if entry.name == "ws_mode.testing.CheckOptions")
    assert [name for name in keywords if f"`{name}`" not in entry.text] == []


@pytest.mark.parametrize(
    "dotted", ["ws_mode.testing.Action", "ws_mode.testing.InputForm"], ids=lambda name: name
)
def test_literal_types_list_their_values(dotted: str) -> None:
    alias = resolve(dotted)
    assert typing.get_origin(alias) is Literal
    entry = next(entry for entry in entries(PAGE) if entry.name == dotted)
    assert [value for value in typing.get_args(alias) if f"'{value}'" not in entry.text] == []


# Pages that lie.


def _without_line(page: str, start: str) -> str:
    lines = page.splitlines(keepends=True)
    kept = [line for line in lines if not line.startswith(start)]
    assert len(kept) == len(lines) - 1, start
    return "".join(kept)


def _swapped(page: str, first: str, second: str) -> str:
    """The page with two adjacent lines (found by how they start) in the other order."""
    lines = page.splitlines(keepends=True)
    (index,) = [i for i, line in enumerate(lines) if line.startswith(first)]
    assert lines[index + 1].startswith(second), second
    lines[index : index + 2] = [lines[index + 1], lines[index]]
    return "".join(lines)


def _replaced(page: str, old: str, new: str) -> str:
    assert page.count(old) == 1, old
    return page.replace(old, new)


LIES: dict[str, tuple[Callable[[str], str], str]] = {
    "an argument dropped": (
        lambda page: _without_line(page, "| `path` | `str` | `'/v1/responses'` |"),
        "ws_mode.WebSocketModeMiddleware(...): no row for the argument path",
    ),
    "a default changed": (
        lambda page: _replaced(
            page, "| `max_connections` | `int` | `1000` |", "| `max_connections` | `int` | `999` |"
        ),
        "the default is 1000, the page says 999",
    ),
    "a string default changed": (
        lambda page: _replaced(page, "`'Invalid or missing credentials.'`", "`'Bad credentials.'`"),
        "ws_mode.AuthenticationFailed(...) message",
    ),
    "a constant default named wrong": (
        lambda page: _replaced(
            page, "`ws_mode.testing.DEFAULT_TOOLS` | The", "`ws_mode.testing.DEFAULT_MODELS` | The"
        ),
        "ws_mode.testing.conversations(...) tools",
    ),
    "a required argument given a default": (
        lambda page: _replaced(
            page, "| `upstream` | `str` | required |", "| `upstream` | `str` | `None` |"
        ),
        "ws_mode.proxy.create_proxy(...) upstream: no default",
    ),
    "an argument the call does not take": (
        lambda page: _replaced(
            page,
            "| `enabled` | `bool` | `True` |",
            "| `bogus` | `int` | `0` | Nothing. |\n| `enabled` | `bool` | `True` |",
        ),
        "a row for bogus, which it does not take",
    ),
    "rows out of order": (
        lambda page: _swapped(page, "| `min_steps` |", "| `max_steps` |"),
        "ws_mode.testing.conversations(...): rows not in the signature's order",
    ),
    "a public name without an entry": (
        lambda page: _replaced(page, "### `ws_mode.bearer_token(...)`", "### bearer_token"),
        "ws_mode.bearer_token has no entry on the page",
    ),
    "a function without its arguments": (
        lambda page: _replaced(
            page, "### `ws_mode.find_middlewares(...)`", "### `ws_mode.find_middlewares`"
        ),
        "ws_mode.find_middlewares is documented without its arguments",
    ),
    "an attribute that does not exist": (
        lambda page: _replaced(page, "| `connections` | `int` |", "| `connection_count` | `int` |"),
        "ws_mode.WebSocketModeMiddleware: no attribute or method connection_count",
    ),
    "a limits field dropped": (
        lambda page: _without_line(page, "| `max_idle_seconds` |"),
        "Limits.max_idle_seconds has no row",
    ),
    "a limit linked to another section": (
        lambda page: _replaced(page, "(limits.md#max_streams)", "(limits.md#max_queued)"),
        "Limits.max_streams: limits.md#max_queued is not a section about it",
    ),
    "a link to no heading": (
        lambda page: _replaced(page, "(limits.md#max_in_flight)", "(limits.md#max_in_flights)"),
        "link to limits.md#max_in_flights: no such heading",
    ),
    "a stats key dropped": (
        lambda page: _without_line(page, "| `warm_ups` | counter |"),
        "snapshot() key warm_ups (counter) is not documented as such",
    ),
}


def test_the_page_as_it_is_has_no_problem() -> None:
    assert problems(PAGE) == []


@pytest.mark.parametrize("lie", list(LIES))
def test_the_checks_catch_a_page_that_lies(lie: str) -> None:
    tell, complaint = LIES[lie]
    found = problems(tell(PAGE))
    assert any(complaint in problem for problem in found), found
