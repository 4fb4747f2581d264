"""docs/tutorial.md, walked as a reader walks it: every Python block the page names an example
file for is that file's content (after its docstring), every command parses with the program it
runs, and every step runs for real: the run commands start uvicorn (or `ws-mode serve`) as
written, on a port of their own; the page's client prints what the page says over the socket of
steps 2, 4 and 6, the answers plain HTTP gives with the whole history; `ws-mode bench --url`
measures steps 2 and 4; `ws-mode check` passes step 4; step 4 renders each item once."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as websocket

from tests.examples.test_readme import FENCE, imported
from tests.examples.test_recipe_tokens import CountingTokenizer
from tests.servers import ROOT, first_line, import_app, serve, stop, ws_mode_serve
from tests.toolkit.cli.checks import run as run_check
from ws_mode.toolkit.cli import build_parser, main
from ws_mode.toolkit.rollout import run_http, run_socket

PAGE = (ROOT / "docs" / "tutorial.md").read_text()
EXAMPLES = ROOT / "examples" / "tutorial"
STEP1 = "examples.tutorial.step1_stateless:app"
STEP2 = "examples.tutorial.step2_drop_in:app"
STEP4 = "examples.tutorial.step4_cache_aware:app"
NAMED = re.compile(r"\(\.\./(examples/[\w/]+\.py)\)\):$")


def blocks(language: str) -> list[tuple[str, str]]:
    """The page's fenced blocks of one language, each with the last line of the text before it."""
    found = []
    for match in FENCE.finditer(PAGE):
        if match.group(1) == language:
            before = PAGE[: match.start()].rstrip().rsplit("\n", 1)[-1]
            found.append((before, match.group(2)))
    return found


def body(path: Path) -> str:
    """An example file's content after its docstring."""
    return path.read_text().split('"""', 2)[2].lstrip("\n")


def commands() -> list[list[str]]:
    """Every command line of the page's bash blocks, split as a shell splits it."""
    return [shlex.split(line) for _, code in blocks("bash") for line in code.splitlines()]


def command(program: str, target: str = "") -> list[str]:
    """The page's first command line of `program` that names `target`."""
    return next(line for line in commands() if line[0] == program and target in line)


[(_, CLIENT)] = [(before, code) for before, code in blocks("python") if "client.py" in before]
[(_, OUTPUT)] = blocks("text")
PROMPT, *PRINTED = OUTPUT.splitlines()
QUESTIONS = ["Hello", "What did I just say?", "Thanks"]


def test_every_python_block_is_the_example_file_it_names() -> None:
    named = []
    for before, code in blocks("python"):
        found = NAMED.search(before)
        assert found, f"a Python block names no example file: {before!r}"
        named.append(found.group(1))
        assert body(ROOT / found.group(1)) == code, found.group(1)
    assert sorted(named) == sorted(str(path.relative_to(ROOT)) for path in EXAMPLES.glob("*.py")), (
        "every tutorial example is on the page, once"
    )


def test_every_command_parses_with_the_program_it_runs() -> None:
    lines = commands()
    [install] = [line for line in lines if line[0] == "pip"]
    packages = install[2:]
    assert packages == ["-e", ".[cli]", "fastapi", "uvicorn[standard]", "openai[realtime]"]
    every_import = set().union(*(imported(code) for _, code in blocks("python")))
    assert every_import == {"examples", "fastapi", "openai", "ws_mode"}
    for line in lines:
        if line[0] == "ws-mode":
            build_parser().parse_args(line[1:])  # exits on a flag the command does not have
        elif line[0] == "uvicorn":
            assert import_app(line[1]) is not None
        else:
            assert line[0] == "pip", line
    assert PROMPT == "$ python examples/tutorial/client.py"


def local(arguments: list[str]) -> list[str]:
    """A command's arguments without its --host and --port: the tests bind loopback, any port."""
    kept, skip = [], False
    for argument in arguments:
        if skip:
            skip = False
        elif argument in ("--host", "--port"):
            skip = True
        else:
            kept.append(argument)
    return kept


@contextlib.contextmanager
def uvicorn(line: list[str]) -> Iterator[str]:
    """The page's uvicorn command as written, on loopback and a port of its own; its origin."""
    assert line[0] == "uvicorn"
    child = [sys.executable, "-m", "uvicorn", *local(line[1:]), "--port", "0"]
    if (limit := shutil.which("timeout")) is not None:
        child = [limit, "120", *child]
    server = subprocess.Popen(
        child, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        banner = first_line(server, "INFO:     Uvicorn running on", timeout=60)
        found = re.search(r"http://127\.0\.0\.1:\d+", banner)
        assert found, banner
        yield found.group(0)
    finally:
        stop(server)


def client_prints(origin: str) -> list[str]:
    """What the page's client prints against the server at `origin`."""
    client = CLIENT.replace("http://127.0.0.1:8000", origin)
    assert client != CLIENT
    child = [sys.executable, "-c", client]
    result = subprocess.run(child, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def http_answers(origin: str) -> list[str]:
    """The answers plain HTTP gives to the client's questions, the whole history sent each time."""
    client = OpenAI(base_url=f"{origin}/v1", api_key="unused", max_retries=0, timeout=60)
    history: list[Any] = []
    answers = []
    for question in QUESTIONS:
        history.append({"role": "user", "content": question})
        response = client.responses.create(model="any", input=history)
        history.extend(item.model_dump(exclude_none=True) for item in response.output)
        answers.append(response.output_text)
    return answers


def test_step_1_answers_plain_http_and_serves_no_socket() -> None:
    with uvicorn(command("uvicorn", STEP1)) as origin:
        assert http_answers(origin) == PRINTED
        with pytest.raises(InvalidStatus) as refused:
            websocket(origin.replace("http", "ws") + "/v1/responses", open_timeout=20).close()
        assert refused.value.response.status_code == 403  # docs/troubleshooting.md says so


@pytest.mark.parametrize("step", [STEP2, STEP4])
def test_the_client_prints_the_page_s_answers_which_are_plain_http_s(step: str) -> None:
    with uvicorn(command("uvicorn", step)) as origin:
        assert client_prints(origin) == PRINTED
        assert http_answers(origin) == PRINTED


@pytest.mark.parametrize("step", [STEP2, STEP4])
def test_step_3_bench_url_measures_the_server_against_http(step: str, tmp_path: Path) -> None:
    line = command("ws-mode", "bench")
    measurements = tmp_path / "bench.json"
    with serve(step, lifetime=120) as origin:
        arguments = [origin if word == "http://127.0.0.1:8000" else word for word in line[1:]]
        assert origin in arguments
        quick = ["--turns", "4", "--repeat", "1", "--warmup", "0", "--quiet"]
        status = main([*arguments, *quick, "--json", str(measurements)])
    assert status == 0
    http, socket = json.loads(measurements.read_text())["summaries"]
    mode = "always" if step == STEP2 else "on_miss"  # as the handshake named it
    assert [http["label"], socket["label"]] == ["HTTP (full history)", f"WebSocket mode ({mode})"]
    assert len(http["turn_curve"]) == len(socket["turn_curve"]) == 4
    assert socket["bytes_sent"] < http["bytes_sent"]


@pytest.fixture
def counting() -> Iterator[CountingTokenizer]:
    """Step 4's app with its tokenizer counting the texts it tokenizes."""
    from examples.tutorial import step4_cache_aware

    tokenizer = CountingTokenizer()
    template = step4_cache_aware.template
    original, template.tokenize = template.tokenize, tokenizer
    try:
        yield tokenizer
    finally:
        template.tokenize = original


def test_step_4_renders_each_item_once_and_answers_as_http(counting: CountingTokenizer) -> None:
    follow_ups = [*QUESTIONS[1:], "One more thing."]
    options: dict[str, Any] = {"turns": 4, "follow_ups": follow_ups, "tools": None}
    with serve(STEP4, lifetime=60) as origin:
        http = run_http(origin, **options, timeout=10)
        over_http = counting.items_rendered()
        socket = run_socket(origin, **options, timeout=10)
        over_socket = counting.items_rendered()
    assert socket.answer == http.answer
    assert sum(over_http.values()) == 1 + 3 + 5 + 7  # the whole history, every turn
    # The socket renders each item once: 4 questions and the first 3 answers (the last answer
    # is rendered after its response went out, for a turn that never comes).
    assert set(over_socket.values()) == {1}
    assert 7 <= len(over_socket) <= 8


def test_step_5_check_passes_the_cache_aware_server(capsys: pytest.CaptureFixture[str]) -> None:
    line = command("ws-mode", "check")
    with uvicorn(command("uvicorn", STEP4)) as origin:
        arguments = [origin if word == "http://127.0.0.1:8000" else word for word in line[2:]]
        assert origin in arguments
        status, out, rows, _ = run_check(capsys, *arguments, "--timeout", "30")
    assert status == 0, out
    assert "largest message" in rows
    assert "FAILED" not in rows.values(), out


def test_step_6_ws_mode_serve_runs_the_app() -> None:
    line = command("ws-mode", "serve")
    with ws_mode_serve(*local(line[2:]), cwd=ROOT) as served:
        assert client_prints(served.origin) == PRINTED


def test_step_6_uvicorn_runs_it_with_the_batching_protocol() -> None:
    line = command("uvicorn", "--ws")
    assert line[line.index("--ws") + 1] == "ws_mode.server:BatchingWebSocketProtocol"
    with uvicorn(line) as origin:
        assert client_prints(origin) == PRINTED
