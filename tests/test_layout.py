"""The layout holds: no import cycles, each module says what it is (a long one, why it is one
concept), the core never imports its tools, and docs/architecture.md names every library module
and the direction of their imports as the import graph has them."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ws_mode"
# Past this many lines a module's docstring says why it is one concept (size is no reason to
# split a module; httpx's and websockets' cohesive modules run to 1,000-2,000 lines).
MAX_LINES = 800
#: The toolkit's one folder: the `ws-mode` command, the reference server, the benchmarks, the
#: load and link tools and the `check` probes. Everything else under `ws_mode/` is the library.
TOOLKIT = "ws_mode.toolkit"
#: The library's public modules besides `ws_mode` itself; every other library module is
#: private (its name starts with an underscore).
PUBLIC = {
    "ws_mode.fastapi",
    "ws_mode.prometheus",
    "ws_mode.proxy",
    "ws_mode.redis_store",
    "ws_mode.server",
    "ws_mode.testing",
}
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(name: str) -> set[str]:
    """The ws_mode modules `name` imports, anywhere in it but `if TYPE_CHECKING:` blocks."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    found.add(f"{base}.{alias.name}")
                elif base in MODULES:
                    found.add(base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    found.discard(name)
    return found


GRAPH = {name: imports_of(name) for name in MODULES}


def test_the_import_graph_is_read() -> None:
    assert "ws_mode._connection" in GRAPH["ws_mode._middleware"]
    assert "ws_mode._lanes" in GRAPH["ws_mode._connection"]


def test_no_import_cycles() -> None:
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def walk(name: str) -> None:
        state[name] = 1
        path.append(name)
        for target in sorted(GRAPH[name]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                walk(target)
        path.pop()
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            walk(name)
    assert cycles == []


def in_library(name: str) -> bool:
    """Whether `name` is a library module, not the toolkit's."""
    return name != TOOLKIT and not name.startswith(TOOLKIT + ".")


LIBRARY = sorted(name for name in MODULES if in_library(name))


def test_the_library_never_imports_the_toolkit() -> None:
    leaks = {name: sorted(t for t in GRAPH[name] if not in_library(t)) for name in LIBRARY}
    assert {name: found for name, found in leaks.items() if found} == {}


#: The lab: research benchmarks in the repository's top-level folder, run from a clone, never
#: installed (the wheel's file list is checked in tests/test_wheel.py).
LAB = PACKAGE.parent / "benchmarks"


def imports_the_lab(path: Path, package: str = "benchmarks") -> bool:
    """Whether the module at `path` imports the lab (`benchmarks`), or the top-level `package`
    named, anywhere in it."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(
            alias.name.split(".")[0] == package for alias in node.names
        ):
            return True
        if (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and (node.module or "").split(".")[0] == package
        ):
            return True
    return False


def test_neither_library_nor_toolkit_imports_the_lab() -> None:
    assert [name for name in MODULES if imports_the_lab(MODULES[name])] == []
    # The check reads what it should: the lab's own modules import each other.
    assert imports_the_lab(LAB / "deflate_threshold.py")


TESTS = PACKAGE.parent / "tests"


def test_only_the_lab_s_own_tests_import_it_and_it_imports_no_test() -> None:
    """tests/benchmarks/ tests the lab; every other test tests the package, so it needs none
    of the lab's code (what both use lives in the toolkit, which the lab imports). The lab
    imports the library and the toolkit only, never a test helper."""
    own = TESTS / "benchmarks"
    tests = sorted(path for path in TESTS.rglob("*.py") if own not in path.parents)
    assert [p.relative_to(TESTS).as_posix() for p in tests if imports_the_lab(p)] == []
    lab = sorted(LAB.rglob("*.py"))
    assert [p.relative_to(LAB).as_posix() for p in lab if imports_the_lab(p, "tests")] == []
    # The check reads what it should: the lab's tests import it.
    assert imports_the_lab(own / "test_deflate_threshold.py")


def test_no_module_of_the_repository_is_over_the_bound() -> None:
    """The product, the lab, the tests and the examples: no module over MAX_LINES."""
    root = PACKAGE.parent
    folders = [PACKAGE, LAB, root / "tests", root / "examples"]
    long = {
        path.relative_to(root).as_posix(): lines
        for path in sorted(path for folder in folders for path in folder.rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_toolkit_is_one_folder_and_the_library_the_rest() -> None:
    toolkit = [name for name in MODULES if not in_library(name)]
    assert "ws_mode.toolkit.cli" in toolkit
    assert "ws_mode.toolkit.reference" in toolkit
    assert all(MODULES[name].is_relative_to(PACKAGE / "toolkit") for name in toolkit)
    assert "ws_mode._middleware" in LIBRARY
    assert "ws_mode.testing._client" in LIBRARY  # the one socket client, which the kit needs


def is_private(name: str) -> bool:
    return any(part.startswith("_") for part in name.split(".")[1:])


def test_the_library_s_internals_are_private() -> None:
    exposed = [
        name
        for name in LIBRARY
        if name != "ws_mode" and name not in PUBLIC and not is_private(name)
    ]
    assert exposed == [], "a library module is neither in PUBLIC nor named _private"


@pytest.mark.parametrize("name", ["ws_mode", *sorted(PUBLIC)])
def test_every_public_name_is_exported_and_resolves(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported, f"{name} has no __all__"
    assert len(set(exported)) == len(exported)
    assert [n for n in exported if not hasattr(module, n)] == []
    assert not [n for n in exported if n.startswith("_") and n != "__version__"]


def test_the_public_surface_holds_what_a_middleware_user_imports() -> None:
    import ws_mode

    for name in (
        "WebSocketModeMiddleware",
        "Limits",
        "Turn",
        "turn",
        "ConfigError",
        "MemoryStore",
        "ResponseStore",
        "Stats",
        "find_middlewares",
    ):
        assert name in ws_mode.__all__, name


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_says_what_it_is(name: str) -> None:
    source = MODULES[name].read_text()
    docstring = ast.get_docstring(ast.parse(source))
    assert docstring, f"{name} has no docstring"
    assert docstring.splitlines()[0].strip()
    if len(source.splitlines()) > MAX_LINES:
        assert "one concept" in docstring, (
            f"{name} is long: its docstring says why it is one concept"
        )


#: How docs/architecture.md names a module: its path inside ws_mode/ (`proxy/app.py`).
FILE_OF = {name: MODULES[name].relative_to(PACKAGE).as_posix() for name in MODULES}
MODULE_OF = {file: name for name, file in FILE_OF.items()}
NAMED = re.compile(r"`([\w/]+\.py)`")
LAYERS_MARK = "<!-- layers:"


def table_modules(doc: str) -> list[str]:
    """The library files the doc's tables name in their first column (`_cache.py`,
    `proxy/_app.py`); the toolkit's table is read by `toolkit_entries`, the lab's by
    `lab_entries`."""
    return [
        file
        for line in doc.splitlines()
        if line.startswith("| `") and not line.startswith("| `benchmarks/")
        for file in NAMED.findall(line.split("|")[1])
        if not file.startswith("toolkit/")
    ]


def lab_entries(doc: str) -> set[str]:
    """What the doc's lab table names in its first column: `load/`, `store.py`, ..."""
    return {
        name.removeprefix("benchmarks/")
        for line in doc.splitlines()
        if line.startswith("| `benchmarks/")
        for name in re.findall(r"`([\w/.]+)`", line.split("|")[1])
    }


def test_the_architecture_page_names_every_module_of_the_lab() -> None:
    lab = {
        path.name + "/" if path.is_dir() else path.name
        for path in LAB.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").exists()
    }
    assert "load/" in lab
    assert sorted(lab - lab_entries(DOC)) == []


TOOLKIT_ENTRY = re.compile(r"`(toolkit/[\w/]*(?:\.py|/))`")


def toolkit_entries(doc: str) -> list[str]:
    """What the doc's toolkit table names in its first column: files and folders."""
    return [
        entry
        for line in doc.splitlines()
        if line.startswith("| `toolkit/")
        for entry in TOOLKIT_ENTRY.findall(line.split("|")[1])
    ]


def toolkit_missing_from(doc: str) -> list[str]:
    """Toolkit modules the doc's toolkit table names neither as a file nor by their folder."""
    entries = toolkit_entries(doc)
    return [
        f"{FILE_OF[name]} is missing from docs/architecture.md's toolkit table"
        for name in MODULES
        if not in_library(name) and name != TOOLKIT
        if not any(FILE_OF[name] == e or FILE_OF[name].startswith(e) for e in entries)
    ]


def layers(doc: str) -> list[list[str]]:
    """The doc's dependency list: the list items after the layers mark, bottom layer first."""
    lines = doc.split(LAYERS_MARK, 1)[1].splitlines()[1:]
    items = [line for line in lines[: lines.index("")] if line.startswith("- ")]
    return [NAMED.findall(line.split(":", 1)[0]) for line in items]


def missing_from(doc: str) -> list[str]:
    """Library modules the doc's module tables or its dependency list leave out."""
    tabled, listed = set(table_modules(doc)), {f for layer in layers(doc) for f in layer}
    return [
        f"{FILE_OF[name]} is missing from docs/architecture.md's {where}"
        for name in LIBRARY
        for where, named in (("module tables", tabled), ("dependency list", listed))
        if FILE_OF[name] not in named
    ]


def unknown_in(doc: str) -> list[str]:
    """Files the doc's tables or dependency list name that are no library module."""
    named = table_modules(doc) + [f for layer in layers(doc) for f in layer]
    return [
        f"docs/architecture.md names {file}, which is no library module"
        for file in dict.fromkeys(named)
        if file not in MODULE_OF or not in_library(MODULE_OF[file])
    ]


def against_the_order(doc: str) -> list[str]:
    """Imports that break the doc's order: each module imports only modules of lower layers."""
    layer_of: dict[str, int] = {}
    problems = []
    for index, layer in enumerate(layers(doc)):
        for file in layer:
            if file in layer_of:
                problems.append(f"{file} is listed twice in docs/architecture.md's dependency list")
            layer_of[file] = index
    for file, index in layer_of.items():
        for target in sorted(GRAPH.get(MODULE_OF.get(file, ""), ())):
            wrong = layer_of.get(FILE_OF[target], -1) >= index and in_library(target)
            if wrong:
                where = "its own line" if layer_of[FILE_OF[target]] == index else "a line below"
                problems.append(f"{file} imports {FILE_OF[target]}, listed on {where}")
    return problems


DOC = ARCHITECTURE.read_text()


def test_the_architecture_page_names_every_library_module() -> None:
    assert len(LIBRARY) > 40
    assert "ws_mode.testing._check" in LIBRARY
    problems = missing_from(DOC) + unknown_in(DOC)
    assert not problems, "\n".join(problems)


def test_the_architecture_page_names_every_toolkit_module() -> None:
    assert toolkit_missing_from(DOC) == []
    row = next(line for line in DOC.splitlines() if line.startswith("| `toolkit/reference/`"))
    assert "toolkit/reference/server.py is missing" in "\n".join(
        toolkit_missing_from(DOC.replace(row, ""))
    )


def test_the_architecture_page_states_the_direction_of_imports() -> None:
    assert len(layers(DOC)) > 10
    problems = against_the_order(DOC)
    assert not problems, "\n".join(problems)


def test_the_architecture_checks_catch_a_page_that_lies() -> None:
    row = next(line for line in DOC.splitlines() if line.startswith("| `_tap.py`"))
    assert missing_from(DOC.replace(row + "\n", "")) == [
        "_tap.py is missing from docs/architecture.md's module tables"
    ]
    assert unknown_in(DOC.replace("| `_tap.py`", "| `_tapped.py`")) == [
        "docs/architecture.md names _tapped.py, which is no library module"
    ]
    # _events.py imports _tap.py: moving _tap.py to the top layer breaks the order.
    moved = re.sub(r"`_tap\.py`, |, `_tap\.py`", "", DOC, count=1).replace(
        "- `__init__.py`", "- `_tap.py`, `__init__.py`", 1
    )
    assert "_events.py imports _tap.py, listed on a line below" in against_the_order(moved)
