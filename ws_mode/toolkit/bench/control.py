"""The bench's hold on the processes it measures: start them, read them, put a link in front.

:func:`server_process` runs a measured server (:mod:`ws_mode.toolkit.bench.server`) and
:func:`measured_process` any module serving the same stats and profile routes (the proxy of
:mod:`ws_mode.toolkit.bench.proxy`) in a child process; :class:`ServerControl` calls those
routes; :func:`process_cpu` reads a child's CPU time from outside, at no cost to it;
:func:`linked` puts the ``--link`` relay (:func:`ws_mode.toolkit.link.link_process`) in front of
a server, or nothing.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

from ws_mode.testing._loopback import ServerProcess, ServerStartError
from ws_mode.testing._loopback import server_process as loopback_process

from .options import BenchError
from .server import PROFILE_PATH, STATS_PATH, ServerSpec

if TYPE_CHECKING:
    from ..http_client import HttpClient
    from ..link import LinkSpec

__all__ = ["ServerControl", "linked", "measured_process", "process_cpu", "server_process"]

SERVER_START_SECONDS: Final = 60.0


@contextlib.contextmanager
def measured_process(
    module: str, arguments: Sequence[str], what: str, *, python: str = sys.executable
) -> Iterator[ServerProcess]:
    """Run ``python -m module`` (a server with the stats route) on a loopback socket bound
    here; yield it once its stats route answers. Terminated (killed if it lingers) when the
    block exits; BenchError naming ``what`` when it cannot start."""
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(
                loopback_process(
                    module,
                    arguments,
                    python=python,
                    ready_path=STATS_PATH,
                    start_timeout=SERVER_START_SECONDS,
                )
            )
        except ServerStartError as exc:
            raise BenchError(f"{what} {exc}") from exc
        yield server


@contextlib.contextmanager
def server_process(spec: ServerSpec, *, python: str = sys.executable) -> Iterator[str]:
    """Run :mod:`ws_mode.toolkit.bench.server` in a subprocess on a loopback socket bound here;
    yield its origin. The process is terminated (killed if it lingers) when the block exits."""
    arguments = ["--spec", spec.to_json()]
    with measured_process(
        "ws_mode.toolkit.bench.server", arguments, "the benchmark server", python=python
    ) as server:
        yield server.base_url


@contextlib.contextmanager
def linked(spec: LinkSpec | None, target: str) -> Iterator[str]:
    """The base URL clients should use for ``target``: a relay modelling ``spec`` in front of
    it (in its own process, stopped on exit), or ``target`` itself without a spec."""
    if spec is None:
        yield target
        return
    from ..link import link_process

    with contextlib.ExitStack() as stack:
        try:
            relay = stack.enter_context(link_process(spec, target))
        except ServerStartError as exc:
            raise BenchError(f"the link relay {exc}") from exc
        yield relay


def process_cpu(pid: int) -> float | None:
    """Process ``pid``'s CPU time so far (all its threads, user and system) in seconds, read
    from outside with nanosecond resolution (Linux: the process's CPU-time clock); None where
    that clock cannot be read."""
    clock = (~pid << 3) | 2  # the kernel's MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
    try:
        return time.clock_gettime(clock)
    except (OSError, OverflowError):
        return None


class ServerControl:
    """A measured server's stats and profile routes."""

    def __init__(self, base_url: str, profile: bool) -> None:
        from ..http_client import HttpClient

        self.client: HttpClient = HttpClient(base_url, timeout=30.0)
        self.profile = profile

    def reset(self) -> dict[str, Any]:
        """Reset the reference counters and the peak RSS; the stats as they were."""
        return self.client.post_json(STATS_PATH)

    def read(self) -> dict[str, Any]:
        """The stats as they are."""
        return self.client.get_json(STATS_PATH)

    def start_profile(self, name: str) -> None:
        """Start (or resume) the cProfile profile ``name``, when profiling."""
        if self.profile:
            self.client.post_json(PROFILE_PATH, {"action": "start", "name": name})

    def stop_profile(self) -> None:
        """Stop the running profile, when profiling."""
        if self.profile:
            self.client.post_json(PROFILE_PATH, {"action": "stop"})

    def dump_profiles(self, directory: str) -> list[str]:
        """Write every profile to ``directory/NAME.pstats``; the files written."""
        answer = self.client.post_json(PROFILE_PATH, {"action": "dump", "dir": directory})
        files: list[str] = answer["files"]
        return files

    def close(self) -> None:
        """Close the HTTP client."""
        self.client.close()
