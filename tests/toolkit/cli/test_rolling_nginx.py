"""Two servers behind the documented nginx, restarted back to back under conversations.

The two-server block of docs/deployment.md ("Several servers behind nginx") runs in a real nginx
(tests/nginx.py) in front of two `ws-mode serve` processes (each a `ws_mode.server.Server`) on
two ports, sharing a real Redis store. While clients of `examples/client_resume.py` hold
conversations (tests/rolling.py), the first server is stopped (SIGTERM: it stops listening,
drains, exits), started again on its port, and as soon as it serves the second one is too.
Every conversation finishes with the answer plain HTTP gives for its history, no upgrade is
answered 426 (a draining server listens no more, so nginx passes new sockets to the other),
and no request gets nginx's 502 (`max_fails=0`: neither server is ever marked down).

`test_figure` (`--run-slow`, with `-s`) measures the roll the issue describes, 40 conversations
of 6 questions, with the documented block and with nginx's default passive check
(`max_fails=1 fail_timeout=10s`), and prints the lines docs/deployment.md quotes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nginx import documented_block, needs_nginx, nginx, with_upstream
from tests.redis_server import RedisServer
from tests.rolling import Rolled, converse, http_answer
from tests.servers import free_port, ws_mode_serve

SEVERAL_SERVERS = "### Several servers behind nginx: rolling restarts"
#: The reference model's speed: turns of a tenth of a second in the fast test, a few tenths
#: for the figures (no tool calls: a conversation is its questions).
FAST = "300"
FIGURE = "100"


class Servers:
    """`ws-mode serve` on each of `ports`, sharing the Redis at `store`; restartable."""

    def __init__(self, ports: list[int], store: str, cwd: Path, tokens_per_second: str) -> None:
        self.ports = ports
        self.store = store
        self.cwd = cwd
        self.flags = ("--tool-calls", "0", "--tokens-per-second", tokens_per_second)
        self.running: list[contextlib.ExitStack] = []

    def _start(self, port: int) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        # The banner is printed once the server listens.
        stack.enter_context(
            ws_mode_serve(*self.flags, "--store", self.store, "--port", str(port), cwd=self.cwd)
        )
        return stack

    def __enter__(self) -> Servers:
        self.running = [self._start(port) for port in self.ports]
        return self

    def __exit__(self, *exc_info: object) -> None:
        for stack in self.running:
            stack.close()

    def roll(self) -> None:
        """Restart each server in turn, the next one as soon as the last serves again."""
        for index, port in enumerate(self.ports):
            self.running[index].close()  # SIGTERM, and wait until it exited
            self.running[index] = self._start(port)


@contextlib.contextmanager
def two_servers_behind_nginx(
    cwd: Path, upstream: str, tokens_per_second: str
) -> Iterator[tuple[Servers, str]]:
    """Two servers on a Redis behind nginx running the documented block with `upstream` (the
    documented two-server one, or a variant); the servers and nginx's origin."""
    ports = [free_port(), free_port()]
    block = with_upstream(documented_block(), upstream, ports)
    with (
        RedisServer() as redis_server,
        Servers(ports, redis_server.url, cwd, tokens_per_second) as servers,
        nginx(None, block, lifetime=600) as proxied,
    ):
        yield servers, proxied


def check(rolled: Rolled, origin: str) -> None:
    assert not rolled.lost, rolled.lost
    assert all(client.conversations for client in rolled.clients), rolled.figure()
    assert rolled.refused_426 == 0, rolled.causes
    assert not [cause for cause in rolled.causes if "HTTP 502" in cause], rolled.causes
    for client in rolled.clients:
        last = client.conversations[-1]
        assert last.final.output_text == http_answer(origin, last.history)


@needs_nginx
def test_a_back_to_back_roll_of_two_servers_behind_nginx_loses_nothing(tmp_path: Path) -> None:
    upstream = documented_block(SEVERAL_SERVERS)
    assert upstream.count("max_fails=0") == 2
    with two_servers_behind_nginx(tmp_path, upstream, FAST) as (servers, proxied):
        rolled = converse(proxied, clients=8, turns=5, roll=servers.roll)
        check(rolled, proxied)
    # The roll closed the clients' sockets: they came back through nginx to the other server.
    assert rolled.resends, rolled.figure()
    print(rolled.figure())


@pytest.mark.slow
@needs_nginx
@pytest.mark.parametrize("check_", ["max_fails=0", "nginx's default"])
def test_figure(tmp_path: Path, check_: str) -> None:
    """The figures in docs/deployment.md: 40 conversations of 6 questions."""
    upstream = documented_block(SEVERAL_SERVERS)
    if check_ != "max_fails=0":
        upstream = upstream.replace(" max_fails=0", "")
    with two_servers_behind_nginx(tmp_path, upstream, FIGURE) as (servers, proxied):
        rolled = converse(proxied, clients=40, turns=6, roll=servers.roll)
        print(f"{check_}: {rolled.figure()}")
        if check_ == "max_fails=0":
            check(rolled, proxied)
        else:  # both ports marked down for 10 s: 502 for longer than the clients retry
            assert rolled.lost, rolled.figure()
            assert any("HTTP 502" in cause for cause in rolled.causes), rolled.causes
