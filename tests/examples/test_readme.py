"""The README's "Use it" snippets, run as a newcomer runs them: the install line covers what
they import, the server block is `examples/fastapi_app.py`, the run command serves it, and the
client snippet prints what the README says it prints; the quickstart's commands are the
project's own. Every uvicorn command of the README, docs/deployment.md and docs/frameworks.md
runs ws_mode's protocol (tests/library/test_memory_servers.py measures why). The whole
cache-aware handler of docs/handlers.md answers as plain HTTP does on new items only. Neither
page can drift from what works."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.responses import Response

from examples.fastapi_app import answer
from tests.servers import ROOT, serve, uvicorn_command
from ws_mode._budget import BUDGET_PROTOCOL
from ws_mode.testing._loopback import ws_max_size
from ws_mode.toolkit.rollout import run_http, run_socket

README = (ROOT / "README.md").read_text()
HANDLERS = (ROOT / "docs" / "handlers.md").read_text()
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def section(title: str, page: str = README) -> str:
    """The page's text from the heading `title` to the next heading of the same level or above."""
    level, _, _ = title.partition(" ")
    start = page.index(title + "\n")
    ends = [page.find(f"\n{'#' * n} ", start + len(title)) for n in range(1, len(level) + 1)]
    after = min((end for end in ends if end != -1), default=len(page))
    return page[start:after]


def blocks(title: str, language: str, page: str = README) -> list[str]:
    """The fenced code blocks of one language in a section, in order."""
    return [code for lang, code in FENCE.findall(section(title, page)) if lang == language]


USE_IT = "## Use it"
[INSTALL, RUN] = blocks(USE_IT, "bash")
[SERVER, CLIENT] = blocks(USE_IT, "python")
[OUTPUT] = blocks(USE_IT, "text")
#: The README's command that runs the server, as words.
[RUN_COMMAND] = [line.split() for line in RUN.splitlines()]


def imported(code: str) -> set[str]:
    """The top-level packages `code` imports, outside the standard library."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.partition(".")[0])
    return names - set(sys.stdlib_module_names)


def test_the_install_line_covers_what_the_snippets_import() -> None:
    [line] = INSTALL.splitlines()
    packages = line.removeprefix("pip install ").split()
    assert imported(SERVER) | imported(CLIENT) == {"fastapi", "openai", "ws_mode"}
    # ws_mode from the clone; uvicorn with a WebSocket library; the SDK with its socket client.
    assert packages == ["-e", ".", "fastapi", '"uvicorn[standard]"', '"openai[realtime]"']


def test_the_server_block_is_the_example_file() -> None:
    source = (ROOT / "examples" / "fastapi_app.py").read_text()
    docstring = ast.get_docstring(ast.parse(source), clean=False)
    assert docstring is not None
    assert source.split('"""', 2)[2].lstrip("\n") == SERVER


def test_the_run_command_serves_what_the_client_snippet_prints() -> None:
    program, *arguments = RUN_COMMAND
    assert program == "uvicorn"
    assert arguments == [
        "examples.fastapi_app:app",
        *("--ws", BUDGET_PROTOCOL),  # ws_mode's protocol: what a client sends counted
        *("--ws-max-size", str(ws_max_size())),
    ]
    with uvicorn_command(arguments) as server:  # the command as written, on a port of its own
        client = CLIENT.replace("http://127.0.0.1:8000", server.origin)
        assert client != CLIENT
        result = subprocess.run(
            [sys.executable, "-c", client], capture_output=True, text=True, timeout=30
        )
    assert result.returncode == 0, result.stderr
    prompt, *printed = OUTPUT.splitlines()
    assert prompt == "$ python client.py"
    assert (
        result.stdout.splitlines()
        == printed
        == ["I have seen 1 item(s).", "I have seen 3 item(s)."]
    )


#: The pages whose commands a reader copies to run a server.
SERVER_PAGES = ("README.md", "docs/deployment.md", "docs/frameworks.md")


def uvicorn_commands(page: str) -> list[str]:
    """The uvicorn command lines of a page that serve an app: each line of its bash blocks (a
    line ending in a backslash joined to the next) and each inline code span, starting with
    `uvicorn` and naming an app (`module:attribute`)."""
    lines = [
        " ".join(line.split())
        for lang, code in FENCE.findall(page)
        if lang == "bash"
        for line in code.replace("\\\n", " ").splitlines()
    ]
    spans = [" ".join(span.split()) for span in re.findall(r"`(uvicorn [^`]+)`", page)]
    return [
        command
        for command in lines + spans
        if command.startswith("uvicorn ") and ":" in command.split()[1]
    ]


@pytest.mark.parametrize("name", SERVER_PAGES)
def test_every_uvicorn_command_runs_ws_mode_s_protocol(name: str) -> None:
    """uvicorn's own protocols hold what a client is still sending outside the memory budget;
    ws_mode's counts it."""
    commands = uvicorn_commands((ROOT / name).read_text())
    assert commands
    for command in commands:
        assert f"--ws {BUDGET_PROTOCOL}" in command, (name, command)


def test_the_quickstart_commands_are_the_project_s() -> None:
    [commands] = blocks("## Quickstart", "bash")
    assert [line.split("#")[0].strip() for line in commands.splitlines()] == [
        'pip install ".[cli]" && ws-mode demo',
        'pip install -e ".[test]" && python -m pytest',
    ]


def test_the_readme_is_a_front_door() -> None:
    # The full option and limit tables live in docs/api.md and docs/limits.md, tested there.
    assert len(README.splitlines()) <= 210
    for heading in ("## Use it", "## Will it make my server faster?", "## How it works"):
        assert f"\n{heading}\n" in README
    assert "(docs/api.md)" in README
    assert "(docs/limits.md)" in README
    # The two ratios a newcomer meets first, demo's and the table's, say what each measures.
    faster = README[README.index("## Will it make my server faster?") :]
    assert "`ws-mode demo` shows drop-in nearer 0.6-0.75" in " ".join(faster.split())


# The cache-aware handler of docs/handlers.md, with the four functions it leaves to the reader.


class Counted:
    """What the snippet's functions did: the items `summarize` went through."""

    summarized: list[int]

    def __init__(self) -> None:
        self.summarized = []


def snippet_app(counted: Counted) -> Any:
    """The cache-aware app of docs/handlers.md, its functions counting a context's items."""

    def summarize(items: list[Any] | str) -> int:
        count = 1 if isinstance(items, str) else len(items)
        counted.summarized.append(count)
        return count

    def extend(state: int, items: list[Any]) -> int:
        return state + len(items)

    def generate(state: int) -> list[dict[str, Any]]:
        return [{"type": "message", "role": "assistant", "content": f"{state} items so far."}]

    def respond(body: dict[str, Any], output: list[dict[str, Any]]) -> Response:
        return answer(body, output[0]["content"])

    [code] = blocks("### A whole handler, in FastAPI", "python", HANDLERS)
    namespace = {"summarize": summarize, "extend": extend, "generate": generate}
    namespace["respond"] = respond
    exec(compile(code, "docs/handlers.md", "exec"), namespace)
    return namespace["app"]


@pytest.fixture(scope="module")
def cache_aware() -> Iterator[tuple[str, Counted]]:
    counted = Counted()
    with serve(snippet_app(counted), lifetime=60) as base_url:
        yield base_url, counted


def test_the_cache_aware_snippet_answers_as_http_on_new_items_only(
    cache_aware: tuple[str, Counted],
) -> None:
    base_url, counted = cache_aware
    options: dict[str, Any] = {"turns": 4, "follow_ups": ["More."], "tools": None, "timeout": 10}
    http = run_http(base_url, **options)
    over_http, counted.summarized[:] = list(counted.summarized), []
    socket = run_socket(base_url, **options)
    assert socket.answer == http.answer == "7 items so far."
    assert over_http == [1, 3, 5, 7]  # plain HTTP: the whole history, every turn
    assert counted.summarized == [1]  # the socket: the first turn only, then new items
