"""What the server's own WebSocket protocol holds, under the command the README gives.

The README runs its app with `uvicorn ... --ws ws_mode.server:BatchingWebSocketProtocol`: that
protocol offers the ASGI extension `ws_mode.memory_budget`, and the fragments of a message still
arriving are reserved in the middleware's budget. uvicorn's own protocols (its default,
`websockets-sansio`) hold them outside, with the message they read last. Here the README's
command line, parsed from README.md, serves the README's app with a 64 MiB budget
(tests/readme_budget_app.py) in a child process, and real `websockets` clients negotiate
permessage-deflate with it (a 64 MiB message is about 64 KiB on the wire). The rule of
docs/limits.md: the worker's RSS grows by at most 1.5 x `max_memory_bytes` plus the per-socket
overhead (`_budget.CONNECTION_COST`) per socket.

- Messages left unfinished: every socket sends two fragments of a message (frames without
  FIN, just over 32 MiB each, so that glibc gives each its own mapping and RSS shows what is
  held) and holds back the last. Under uvicorn's default protocol the four sockets held 257 MiB
  against the rule's 96; under the README's command each message is dropped once the budget
  cannot hold it (1 MiB).
- Large warm-ups: every socket sends one whole 60 MiB warm-up, which the budget refuses. Under
  uvicorn's default protocol the four sockets kept 254 MiB (the message it read last, and its
  frame's payload); under the README's command 14 MiB.

And the middleware says once, at the first socket, when its server holds such messages outside
the budget (no `ws_mode.memory_budget` in the scope): under uvicorn, naming the command to run
instead; under a server that cannot run ws_mode's protocol, what stays outside and the setting
that bounds it.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

from tests.examples.test_readme import RUN_COMMAND
from tests.readme_budget_app import BUDGET_VARIABLE
from tests.rss_server import MiB, held_rss, sending, stats, unfinished_message, wait_for
from tests.servers import ServeProcess, serve, uvicorn_command
from ws_mode._asgi import Receive, Scope, Send
from ws_mode._budget import BUDGET_PROTOCOL, CONNECTION_COST, outside_budget_warning

BUDGET = 64 * MiB
SOCKETS = 4
BOUND = 1.5 * BUDGET + SOCKETS * CONNECTION_COST
#: One fragment: over 32 MiB (its own mapping), two of them within the README's message limit
#: (`--ws-max-size`, 65 MiB), and more than the budget holds.
FRAGMENT_CHARS = 32 * MiB + 1024
#: One warm-up: over 32 MiB, within `Limits.max_message_bytes` (64 MiB), refused by the budget.
WARM_UP_CHARS = 60 * MiB
START = '{"type": "response.create", "model": "m", "generate": false, "input": "'
#: The app the tests serve in place of the README's, under the README's flags.
APP = "tests.readme_budget_app:app"


def readme_flags() -> list[str]:
    """The flags of the README's command (its app left out)."""
    program, target, *flags = RUN_COMMAND
    assert (program, target) == ("uvicorn", "examples.fastapi_app:app")
    return flags


def uvicorn_own(flags: list[str]) -> list[str]:
    """The same flags with uvicorn's own (default) WebSocket protocol: the command before."""
    if "--ws" not in flags:
        return flags
    at = flags.index("--ws")
    return flags[:at] + flags[at + 2 :]


@contextlib.contextmanager
def readme_server(flags: list[str]) -> Iterator[ServeProcess]:
    """The budget app under `uvicorn APP FLAGS`, its budget `BUDGET`."""
    with uvicorn_command([APP, *flags], env={BUDGET_VARIABLE: str(BUDGET)}) as server:
        yield server


def _next(socket: ClientConnection) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(socket.recv(timeout=60))
    return event


def _terminal(socket: ClientConnection) -> dict[str, Any]:
    while (event := _next(socket))["type"] not in ("response.completed", "error"):
        pass
    return event


def _url(server: ServeProcess) -> str:
    return server.origin.replace("http", "ws", 1) + "/v1/responses"


def _baseline(server: ServeProcess) -> int:
    """The server's RSS once a small turn has run every code path below."""
    with connect(_url(server)) as socket:
        socket.send(json.dumps({"type": "response.create", "model": "m", "input": "hi"}))
        assert _terminal(socket)["type"] == "response.completed"
    rss: int = wait_for(server.origin, lambda s: s["connections_open"] == 0)["rss"]
    return rss


def _open(server: ServeProcess, stack: contextlib.ExitStack) -> list[ClientConnection]:
    url = _url(server)
    sockets = [stack.enter_context(connect(url, close_timeout=0.2)) for _ in range(SOCKETS)]
    assert "permessage-deflate" in sockets[0].response.headers["Sec-WebSocket-Extensions"]
    return sockets


def unfinished_growth(flags: list[str]) -> int:
    """RSS growth with every socket's message left unfinished after two fragments."""
    with readme_server(flags) as server, contextlib.ExitStack() as stack:
        before = _baseline(server)
        sockets = _open(server, stack)
        finishing = threading.Event()
        with sending(sockets, lambda: unfinished_message(START, FRAGMENT_CHARS, finishing)):
            # Every message refused by the budget, or the rule broken.
            growth: int = held_rss(server.origin, before, BOUND, SOCKETS)["rss"] - before
            finishing.set()
        return growth


def warm_up_growth(flags: list[str]) -> int:
    """RSS growth once every socket's large warm-up was refused."""
    with readme_server(flags) as server, contextlib.ExitStack() as stack:
        before = _baseline(server)
        sockets = _open(server, stack)
        warm_up = START + "x" * (WARM_UP_CHARS - len(START) - 2) + '"}'
        for socket in sockets:
            socket.send(warm_up)
            refused = _next(socket)
            assert (refused["type"], refused["error"]["code"]) == (
                "error",
                "server_is_overloaded",
            )
        growth: int = stats(server.origin)["rss"] - before
        return growth


def test_messages_left_unfinished_keep_the_rule_under_the_readme_command() -> None:
    growth = unfinished_growth(readme_flags())
    assert growth <= BOUND, (
        f"RSS grew {growth / MiB:.0f} MiB with {SOCKETS} messages left unfinished after two "
        f"{FRAGMENT_CHARS / MiB:.0f} MiB fragments each; the rule allows {BOUND / MiB:.0f}"
    )


def test_large_warm_ups_keep_the_rule_under_the_readme_command() -> None:
    growth = warm_up_growth(readme_flags())
    assert growth <= BOUND, (
        f"RSS grew {growth / MiB:.0f} MiB after {SOCKETS} refused warm-ups of "
        f"{WARM_UP_CHARS / MiB:.0f} MiB; the rule allows {BOUND / MiB:.0f}"
    )


def _warnings(flags: list[str]) -> list[str]:
    """The lines of the server's output that name the budget, after two sockets' turns."""
    with readme_server(flags) as server:
        for _ in range(2):
            _baseline(server)
        server.process.terminate()
        assert server.process.stdout is not None
        output = server.process.stdout.read()
    return [line for line in output.splitlines() if "Limits.max_memory_bytes" in line]


@pytest.mark.parametrize("protocol", ["websockets-sansio", "wsproto"])
def test_uvicorn_s_own_protocol_is_named_once(protocol: str) -> None:
    [line] = _warnings([*uvicorn_own(readme_flags()), "--ws", protocol])
    assert "uvicorn's WebSocket protocol" in line
    assert f"--ws {BUDGET_PROTOCOL}" in line
    assert "ws-mode serve --app" in line


def test_no_warning_under_the_readme_command() -> None:
    assert _warnings(readme_flags()) == []


async def _naming_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers a socket with the warning the middleware would log under this server."""
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": outside_budget_warning(receive, scope)})
        await send({"type": "websocket.close"})


def test_hypercorn_is_named_with_what_stays_outside() -> None:
    with (
        serve(_naming_app, "hypercorn") as base_url,
        connect(base_url.replace("http", "ws", 1) + "/") as socket,
    ):
        line = str(socket.recv(timeout=10))
    assert line.startswith("hypercorn holds a message still arriving")
    assert "websocket_max_message_size" in line
    assert f"--ws {BUDGET_PROTOCOL}" in line
