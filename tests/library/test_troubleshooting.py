"""docs/troubleshooting.md against the code: every error code the library can send and every
close code it closes a socket with is on the page.

The codes are read from the library's source (the core, the public add-ons and the proxy; not
the toolkit or the kit, which only the `ws-mode` command and tests run), by the ways an error
code is written there: the code argument of the error builders (`error_event`, `error_body`,
the steer and interrupt failures, a connection's end), a `code=` keyword, the string right
after an HTTP error status in a call (`_refuse(scope, send, 426, "...")`), the values of a
status-to-code mapping, an assignment to `code`, and the keys of the `*_MESSAGES` tables
(each failure code's message). A name is resolved to the module constant it names. The close
codes are those of `websocket.close` messages and of the constants passed to `_close`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ws_mode"
PAGE = (ROOT / "docs" / "troubleshooting.md").read_text()

#: The position of the code among the positional arguments of the functions that build errors.
CODE_ARGUMENT = {
    "error_event": 2,
    "error_body": 1,
    "steer_failed_event": 0,
    "interrupt_failed_event": 0,
    "failed": 0,
    "_end": 0,
}


def library_files() -> list[Path]:
    """The library's modules: all of ws_mode but the toolkit and the testing kit."""
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if not {"toolkit", "testing"} & set(path.relative_to(PACKAGE).parts)
    ]


def module_constants(trees: list[ast.Module]) -> dict[str, object]:
    """Every module-level `NAME = <str or int literal>` of the library."""
    constants: dict[str, object] = {}
    for tree in trees:
        for node in tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(
                node.value, ast.Constant
            ):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        constants[target.id] = node.value.value
    return constants


def _is_status(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int and 400 <= node.value < 600


def _name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")


def codes_sent() -> tuple[set[str], set[int]]:
    """The error codes and the close codes in the library's source."""
    trees = [ast.parse(path.read_text()) for path in library_files()]
    constants = module_constants(trees)

    def value(node: ast.expr | None) -> object:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name | ast.Attribute):
            return constants.get(node.id if isinstance(node, ast.Name) else node.attr)
        return None

    errors: set[str] = set()
    closes: set[int] = set()

    def error(node: ast.expr | None) -> None:
        found = value(node)
        if isinstance(found, str):
            errors.add(found)

    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                position = CODE_ARGUMENT.get(_name(node))
                if position is not None and len(node.args) > position:
                    error(node.args[position])
                for before, after in zip(node.args, node.args[1:], strict=False):
                    if _is_status(before):
                        error(after)
                for keyword in node.keywords:
                    if keyword.arg == "code":
                        error(keyword.value)
                if _name(node) == "_close" and node.args:
                    close = value(node.args[0])
                    if isinstance(close, int):
                        closes.add(close)
            elif isinstance(node, ast.Dict):
                items = list(zip(node.keys, node.values, strict=True))
                keys = {value(key): item for key, item in items}
                if keys.get("type") is not None and value(keys["type"]) == "websocket.close":
                    for item in ast.walk(keys.get("code") or ast.Constant(None)):
                        # A close code, not the statuses a conditional close compares.
                        close = item.value if isinstance(item, ast.Constant) else None
                        if type(close) is int and 1000 <= close < 5000:
                            closes.add(close)
                for key, item in items:
                    if _is_status(key):
                        error(item)
            elif isinstance(node, ast.Assign):
                names = [target.id for target in node.targets if isinstance(target, ast.Name)]
                if "code" in names:
                    error(node.value)
                if any(name.endswith("_MESSAGES") for name in names) and isinstance(
                    node.value, ast.Dict
                ):
                    for key in node.value.keys:
                        error(key)
    return errors, closes


def documented_codes() -> set[str]:
    """The codes the page names in backquotes."""
    return set(re.findall(r"`([a-z][a-z0-9_]*)`", PAGE))


def test_the_source_scan_finds_the_codes_it_must() -> None:
    # A broken scan must not pass vacuously: codes sent each of the ways listed above.
    errors, closes = codes_sent()
    assert {
        "previous_response_not_found",  # a builder in _protocol.py
        "invalid_json",  # code= of a ProtocolError
        "websocket_mode_disabled",  # after a status in a refusal
        "invalid_api_key",  # a status-to-code mapping
        "interrupt_not_supported",  # an assignment to code
        "not_steerable",  # a key of STEER_MESSAGES only
        "server_is_overloaded",  # a module constant
        "upstream_timeout",  # the proxy
        "websocket_idle_timeout",  # a connection's end
    } <= errors
    assert len(errors) >= 40
    assert {1001, 1008} <= closes


def test_every_error_code_the_library_sends_is_on_the_page() -> None:
    errors, _ = codes_sent()
    missing = errors - documented_codes()
    assert not missing, f"docs/troubleshooting.md does not explain: {sorted(missing)}"


def test_every_close_code_the_library_uses_is_on_the_page() -> None:
    _, closes = codes_sent()
    rows = {int(code) for code in re.findall(r"^\| (\d{4})\b", PAGE, re.MULTILINE)}
    missing = closes - rows
    assert not missing, f"docs/troubleshooting.md has no row for close codes {sorted(missing)}"
    # The server's own closes a client meets in every deployment are on it too.
    assert {1009, 1011, 1012} <= rows
