"""The layout holds: no import cycles, each module says what it is (a long one, why it is one
concept), and the core never imports its tools."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ws_mode"
# Past this many lines a module's docstring says why it is one concept (size is no reason to
# split a module; httpx's and websockets' cohesive modules run to 1,000-2,000 lines).
MAX_LINES = 800
#: Subpackages that are tools around the core; the core (every top-level module) never
#: imports them.
TOOLS = ("bench", "cli", "reference", "testing", "tools")


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
    assert "ws_mode.connection" in GRAPH["ws_mode.middleware"]
    assert "ws_mode.lanes" in GRAPH["ws_mode.connection"]


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


def test_the_core_does_not_import_its_tools() -> None:
    core = [name for name in GRAPH if name.count(".") == 1 and name.split(".")[1] not in TOOLS]
    leaks = {
        name: sorted(t for t in GRAPH[name] if t.split(".")[1:2] and t.split(".")[1] in TOOLS)
        for name in core
    }
    assert {name: found for name, found in leaks.items() if found} == {}


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
