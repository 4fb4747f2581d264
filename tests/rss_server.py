"""A server in a child process whose RSS the tests read: the memory tests' one harness.

The child runs a script that ends with `SERVE` (its app under
`ws_mode.testing._loopback.ServerThread`): it prints its base URL and serves until its standard
input closes; its app answers `GET /stats` with its RSS (`rss`; `peak_rss` and
`reset_peak_rss` are there for its peak) beside whatever else it reports. Only the server's own
memory counts: the clients, and what they build, live in the test's process.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx

MiB = 1024 * 1024


def rss() -> int:
    """This process's resident set, in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def peak_rss() -> int:
    """This process's peak resident set (VmHWM) since it started or `reset_peak_rss`, in
    bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def reset_peak_rss() -> None:
    """Make this process's peak resident set its current one (Linux's clear_refs, 5)."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


#: The child's `rss()`, `peak_rss()` and `reset_peak_rss()`, the same functions, for the
#: scripts that do not import this module.
RSS = "".join("\n" + inspect.getsource(f) for f in (rss, peak_rss, reset_peak_rss))


#: The child's last lines: its `middleware` served on loopback, its base URL printed, until its
#: standard input closes (`ServerThread` and `sys` imported by the script); the server's frame
#: limit is the one for the middleware's `Limits.max_message_bytes`.
SERVE = """
from ws_mode.testing._loopback import ws_max_size
with ServerThread(
    middleware, lifetime=120, ws_max_size=ws_max_size(middleware.settings.limits)
) as base_url:
    print(base_url, flush=True)
    sys.stdin.read()  # until the test closes it
"""


@contextmanager
def child_server(script: str, *args: str) -> Iterator[str]:
    """Run `script` (dedented) in a child Python with `args`; yield the base URL it prints,
    and stop it when done (its standard input closed, killed if it lingers)."""
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        yield child.stdout.readline().strip()
    finally:
        child.stdin.close()
        child.stdout.close()
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def stats(base_url: str) -> dict[str, Any]:
    """What the child's `/stats` reports."""
    answer: dict[str, Any] = httpx.get(base_url + "/stats", timeout=10).json()
    return answer


def wait_for(
    base_url: str, condition: Callable[[dict[str, Any]], bool], tries: int = 1500
) -> dict[str, Any]:
    """Poll `/stats` until `condition` holds of it; what it reported then."""
    for _ in range(tries):
        reported = stats(base_url)
        if condition(reported):
            return reported
        time.sleep(0.02)
    raise AssertionError(f"never reached: {reported}")


def unfinished_message(start: str, size: int, finishing: threading.Event) -> Iterator[str]:
    """The fragments of a message left unfinished: two of `size` characters (`start` first),
    its end only once `finishing` is set."""
    yield start + "x" * (size - len(start))
    yield "x" * size
    finishing.wait(60)
    yield '"}'


@contextmanager
def sending(sockets: Iterable[Any], message: Callable[[], str | Iterable[str]]) -> Iterator[None]:
    """Every socket sends a `message()` (a text, or its fragments) in a thread of its own, all
    at once; the senders are waited for when the block exits."""
    senders = [
        threading.Thread(target=socket.send, args=(message(),), daemon=True) for socket in sockets
    ]
    for sender in senders:
        sender.start()
    try:
        yield
    finally:
        for sender in senders:
            sender.join(60)


def held_rss(base_url: str, before: int, bound: int, refusals: int) -> dict[str, Any]:
    """What the child reports once `refusals` messages were refused by its budget, or its RSS
    grew past `bound` over `before`: then read on a few times, since what the server reads
    meanwhile shows in its RSS (the worst of it is kept)."""
    held = wait_for(
        base_url, lambda s: s["memory_refusals"] == refusals or s["rss"] - before > bound
    )
    for _ in range(25):
        held = stats(base_url)
        if held["rss"] - before > bound:
            break
    return held
