"""The tools' one server runner (`ws_mode.testing._loopback`): in a thread, uvicorn and hypercorn
serve on 127.0.0.1 and stop; in a child process, the server runs from any directory on the
socket bound here, its failures are reported, and it ends by itself with its parent or after
its lifetime."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ws_mode.testing._loopback import ServerStartError, ServerThread, server_process

LOAD_SPEC = (
    '{"turns": 2, "tokens_per_second": 0, "full_context": "always", "connections": 4, '
    '"max_cached_bytes": 1048576, "max_cached_responses": 16}'
)
LOAD_SERVER = ("benchmarks.load", ["--serve", "--spec", LOAD_SPEC])


async def _where(request: Request) -> Response:
    return JSONResponse({"root_path": request.scope.get("root_path", ""), "client": "ok"})


APP = Starlette(routes=[Route("/where", _where)])


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie waiting to be reaped does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("server", ["uvicorn", "hypercorn"])
def test_a_thread_serves_on_loopback_with_its_options_and_stops(server: str) -> None:
    runner = ServerThread(APP, server, options={"root_path": "/api"})
    with runner as base_url:
        assert base_url.startswith("http://127.0.0.1:")
        answer = httpx.get(base_url + "/where", timeout=5)
        assert answer.json() == {"root_path": "/api", "client": "ok"}
        assert runner.base_url == base_url
    with pytest.raises(httpx.TransportError):
        httpx.get(base_url + "/where", timeout=2)


def test_a_thread_stops_by_itself_after_its_lifetime() -> None:
    # A lifetime long enough for the first answer on a loaded machine, short for a test.
    runner = ServerThread(APP, lifetime=3.0, name="short-lived")
    base_url = runner.start()
    try:
        assert httpx.get(base_url + "/where", timeout=5).status_code == 200
        deadline = time.monotonic() + 60  # a hang guard, not a speed
        while time.monotonic() < deadline:
            try:
                httpx.get(base_url + "/where", timeout=1)
            except httpx.TransportError:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the server still answers after its lifetime")
    finally:
        runner.stop()


def test_a_thread_refuses_an_unknown_server() -> None:
    with pytest.raises(ValueError, match="server must be one of"):
        ServerThread(APP, "gunicorn")


def test_a_child_serves_from_any_directory_on_the_socket_bound_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # nothing of the package here: it runs as installed
    module, arguments = LOAD_SERVER
    with server_process(module, arguments, ready_path="/load/stats") as server:
        assert server.base_url.startswith("http://127.0.0.1:")
        state = httpx.get(server.base_url + "/load/stats", timeout=5).json()
        assert state["pid"] == server.pid
        assert state["memory"]["rss"] > 0
    assert _wait_gone(server.pid, 15)


def test_a_child_that_cannot_start_is_reported() -> None:
    with (
        pytest.raises(ServerStartError, match=r"exited: .*No module named"),
        server_process("ws_mode.no_such_module", start_timeout=20),
    ):
        pass


def test_a_child_ends_by_itself_after_its_lifetime() -> None:
    module, arguments = LOAD_SERVER
    with server_process(module, arguments, ready_path="/load/stats", lifetime=1.0) as server:
        assert _wait_gone(server.pid, 15)


def test_a_child_ends_by_itself_when_its_parent_dies(tmp_path: Path) -> None:
    module, arguments = LOAD_SERVER
    script = (
        "import sys, time\n"
        "from ws_mode.testing._loopback import server_process\n"
        f"with server_process({module!r}, {arguments!r}, ready_path='/load/stats') as server:\n"
        "    print(server.pid, flush=True)\n"
        "    time.sleep(120)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], cwd=tmp_path, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
        os.kill(parent.pid, signal.SIGKILL)  # no finally runs: the child must notice alone
        parent.wait(10)
        assert _wait_gone(child, 15)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()
