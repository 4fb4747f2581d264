"""The worker processes of a running `ws-mode serve --workers N`, found through /proc (Linux).

`workers_of(pid)` lists the uvicorn workers (multiprocessing spawn children) of the command's
process, `wait_for_workers` waits until there are N; `serving_worker` finds the one holding
the client sockets of a port, to kill the worker under a client; `listens` tells whether a
worker still accepts; `replaced(pid, old)` waits until a rolling restart (SIGHUP) has
replaced every worker of `old`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["listens", "replaced", "serving_worker", "wait_for_workers", "workers_of"]

#: `st` of an established TCP connection, and of a listening socket, in /proc/net/tcp.
_ESTABLISHED = "01"
_LISTEN = "0A"


def _children(pid: int) -> list[int]:
    try:
        return [
            int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        ]
    except FileNotFoundError:
        return []


def _is_worker(pid: int) -> bool:
    try:
        return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False


def workers_of(pid: int) -> list[int]:
    """The pids of the worker processes of `pid` right now (a stopping one included)."""
    return [child for child in _children(pid) if _is_worker(child)]


def wait_for_workers(
    pid: int, count: int, timeout: float = 20.0, *, without: int | None = None
) -> list[int]:
    """The pids of `pid`'s workers once there are `count` of them (none of them `without`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = workers_of(pid)
        if len(workers) == count and without not in workers:
            return workers
        time.sleep(0.05)
    raise AssertionError(f"process {pid} did not have {count} workers in {timeout:g} s")


def replaced(pid: int, old: list[int], timeout: float = 60.0) -> list[int]:
    """Wait until none of the workers `old` is left and as many new ones run; their pids."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = workers_of(pid)
        if len(workers) == len(old) and not set(workers) & set(old):
            return workers
        time.sleep(0.05)
    raise AssertionError(f"the workers {old} of {pid} were not replaced in {timeout:g} s")


def _tcp_inodes(port: int, state: str) -> set[str]:
    """The inodes of the TCP sockets whose local port is `port`, in `state`."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == state:
                inodes.add(fields[9])
    return inodes


def listens(pid: int, port: int) -> bool:
    """Whether process `pid` still holds the socket listening on `port` (a worker accepts
    from it until it closes its copy)."""
    return bool(_socket_inodes(pid) & _tcp_inodes(port, _LISTEN))


def _socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process `pid` has open."""
    found: set[str] = set()
    try:
        descriptors = list(Path(f"/proc/{pid}/fd").iterdir())
    except (FileNotFoundError, ProcessLookupError):
        return found
    for descriptor in descriptors:
        try:
            link = os.readlink(descriptor)
        except OSError:
            continue  # closed meanwhile
        if link.startswith("socket:["):
            found.add(link[len("socket:[") : -1])
    return found


def serving_worker(pid: int, port: int) -> int:
    """The one worker of `pid` that holds connections of clients to `port` (a test with one
    client open: the worker serving it)."""
    inodes = _tcp_inodes(port, _ESTABLISHED)  # the server's ends of its clients' connections
    holders = []
    for worker in workers_of(pid):
        if _socket_inodes(worker) & inodes:
            holders.append(worker)
    assert len(holders) == 1, f"workers holding clients of port {port}: {holders}"
    return holders[0]
