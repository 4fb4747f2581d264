"""The runner the peer comparisons share (``peer_litellm.py``, ``peer_agentic.py``).

Each comparison puts proxies ("fronts") in child processes in front of one recording upstream
(``recorded_upstream.py``) and runs the same 25-turn tool loop through each of them, interleaved
round after round, with direct HTTP to the upstream as the baseline. This module holds what
they have in common: starting a front (:func:`front_process`) and ``ws-mode proxy``'s command
line, one measured rollout (:func:`run_one`: client wall time, the front process's CPU read from
outside, the history check), the whole interleaved run (:func:`compare`: warm-up, RSS after it,
the untimed conversation check, the rounds, peak RSS), and the Markdown table (:func:`report`).
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ws_mode.testing._loopback import HOST, bind_loopback, wait_answering
from ws_mode.toolkit.agent import DEFAULT_PROMPT, user_message
from ws_mode.toolkit.bench.control import process_cpu
from ws_mode.toolkit.measure import format_bytes, format_seconds, median, memory
from ws_mode.toolkit.rollout import RolloutResult, run_http, run_socket

from .recorded_upstream import (
    CONVERSATION_FIELDS,
    PROMPTS,
    Check,
    check_history,
    conversation_follow,
    converse_http,
    converse_socket,
    fetch_records,
    tool_loop_fields,
    tool_outputs,
)

#: How long after a rollout's answer a front's CPU is still counted (work it does later).
SETTLE_SECONDS: Final = 0.3
HTTP: Final = "http"
"""The baseline's name: the client straight to the upstream over HTTP."""


# ----------------------------------------------------------------------------- the processes


@dataclass(frozen=True)
class Front:
    """A proxy running in a child process: its base URL and process id."""

    base_url: str
    pid: int


def free_port() -> int:
    """A loopback port nothing listens on (now)."""
    with bind_loopback() as sock:
        port: int = sock.getsockname()[1]
    return port


@contextlib.contextmanager
def front_process(
    command: Callable[[int], list[str]],
    ready_path: str,
    log: Path,
    env: Mapping[str, str] | None = None,
) -> Iterator[Front]:
    """Run ``command(port)`` until the block ends; yield it once it answers ``GET ready_path``."""
    port = free_port()
    base_url = f"http://{HOST}:{port}"
    with log.open("wb") as output:
        process = subprocess.Popen(
            command(port),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=log.parent,
            start_new_session=True,
        )
        try:
            wait_answering(base_url, process, path=ready_path, timeout=180)
            yield Front(base_url, process.pid)
        except Exception:
            print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
        finally:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def ws_mode_command(upstream: str, *flags: str) -> Callable[[int], list[str]]:
    """The command line of ``ws-mode proxy`` in front of the upstream, with ``flags``."""
    start = [sys.executable, "-m", "ws_mode.toolkit.cli", "proxy", "--upstream", upstream + "/v1"]
    return lambda port: [
        *start,
        *flags,
        "--host",
        HOST,
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]


def cpu_seconds(pid: int) -> float:
    """Process `pid`'s CPU time so far (user + system, all threads), read from outside."""
    seconds = process_cpu(pid)
    if seconds is None:
        raise RuntimeError("this system cannot read another process's CPU-time clock")
    return seconds


# ----------------------------------------------------------------------------- the run


@dataclass
class Measured:
    """What one mode measured over the rounds."""

    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)
    turns: int = 0
    exact: int = 0
    exact_input: int = 0
    differences: list[str] = field(default_factory=list)
    rss_after_warmup: int | None = None
    peak_rss: int | None = None
    conversation: Check | None = None


@dataclass(frozen=True)
class Mode:
    """One way of running the rollout: its table label, the front it goes through (None:
    straight to the upstream over HTTP), and where the client connects when that is not the
    front (or the upstream) itself (a link relay in front of it)."""

    label: str
    front: Front | None
    via: str | None = None


def run_one(
    run: Callable[[], RolloutResult],
    upstream: str,
    pid: int | None,
    tool_output_bytes: int,
    measured: Measured,
) -> None:
    """One rollout: its wall time, the proxy's CPU, and the check of the upstream's requests."""
    fetch_records(upstream, reset=True)
    before = cpu_seconds(pid) if pid is not None else 0.0
    result = run()
    if pid is not None:
        time.sleep(SETTLE_SECONDS)
        measured.cpus.append(cpu_seconds(pid) - before)
    measured.walls.append(result.total_seconds)
    measured.sent.append(result.bytes_sent)
    records = fetch_records(upstream, reset=True)
    check = check_history(
        records, tool_loop_fields(), [user_message(DEFAULT_PROMPT)], tool_outputs(tool_output_bytes)
    )
    measured.turns += check.turns
    measured.exact += check.exact
    measured.exact_input += check.exact_input
    if check.differences and not measured.differences:
        measured.differences = check.differences


def round_order(names: Sequence[str], round_: int) -> list[str]:
    """The modes' order in round ``round_``: shuffled, the same for the same round. A rotation
    would keep each mode behind the same other one every round, and a front's work after its
    answer (agentic-api's store writes) would always land on the same neighbour."""
    order = list(names)
    random.Random(round_).shuffle(order)
    return order


def compare(
    upstream: str,
    modes: Mapping[str, Mode],
    options: Mapping[str, Any],
    rounds: int,
) -> dict[str, Measured]:
    """Run every mode's rollout (``options``: :class:`~ws_mode.toolkit.rollout.RolloutOptions`)
    once as a warm-up (checked, not timed; each front's RSS read after it), check a short
    conversation once per mode, then ``rounds`` rounds in :func:`round_order`;
    each front's peak RSS at the end."""
    headers: dict[str, str] = dict(options.get("headers") or {})
    tool_output_bytes: int = options["tool_output_bytes"]

    def url_of(mode: Mode) -> str:
        return mode.via or (upstream if mode.front is None else mode.front.base_url)

    def rollout(mode: Mode) -> Callable[[], RolloutResult]:
        base_url = url_of(mode)
        if mode.front is None:
            return lambda: run_http(base_url, **options)
        return lambda: run_socket(base_url, **options)

    def pid_of(mode: Mode) -> int | None:
        return None if mode.front is None else mode.front.pid

    results = {name: Measured() for name in modes}
    for name, mode in modes.items():  # warm-up, checked but not timed
        run_one(rollout(mode), upstream, pid_of(mode), tool_output_bytes, Measured())
        if mode.front is not None:
            results[name].rss_after_warmup = memory(mode.front.pid).rss
    for name, mode in modes.items():
        fetch_records(upstream, reset=True)
        if mode.front is None:
            converse_http(url_of(mode), headers)
        else:
            converse_socket(url_of(mode), headers)
        records = fetch_records(upstream, reset=True)
        first = [user_message(PROMPTS[0])]
        results[name].conversation = check_history(
            records, CONVERSATION_FIELDS, first, conversation_follow
        )
    names = list(modes)
    for round_ in range(rounds):
        for name in round_order(names, round_):
            mode = modes[name]
            run_one(rollout(mode), upstream, pid_of(mode), tool_output_bytes, results[name])
        print(f"round {round_ + 1}/{rounds} done", file=sys.stderr, flush=True)
    for name, mode in modes.items():
        if mode.front is not None:
            results[name].peak_rss = memory(mode.front.pid).peak
    return results


# ----------------------------------------------------------------------------- the table


def report(
    results: Mapping[str, Measured],
    modes: Mapping[str, Mode],
    *,
    turns: int,
    tool_output_bytes: int,
    rounds: int,
    against: str | None = None,
) -> None:
    """Print the table (Markdown: medians, wall time against direct HTTP, and, with ``against``
    (a mode's name), wall, CPU and RSS as ratios to that mode's; the best rollout's wall and CPU
    too, steadier than the medians on a busy machine) and each mode's first history
    difference."""
    base = median(results[HTTP].walls)
    print(f"{turns}-turn tool loop, {tool_output_bytes} B tool outputs, ", end="")
    print(f"median of {rounds} interleaved rollouts\n")
    columns = [
        "client -> front",
        "wall per rollout",
        "vs HTTP",
        "proxy CPU per rollout",
        "proxy CPU per turn",
        "best rollout: wall, proxy CPU",
        "proxy RSS after warm-up",
        "proxy peak RSS",
        "client sent",
        "exact history: tool loop",
        "exact history: conversation",
    ]
    if against is not None:
        columns.insert(3, f"wall / CPU / peak RSS vs {against}")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for name, mode in modes.items():
        m = results[name]
        wall = median(m.walls)
        cpu = median(m.cpus) if m.cpus else None
        per_turn = cpu / (m.turns / len(m.walls)) if cpu is not None and m.turns else None
        cells = [
            mode.label,
            format_seconds(wall),
            f"{wall / base:.2f}x",
            format_seconds(cpu) if cpu is not None else "-",
            format_seconds(per_turn) if per_turn is not None else "-",
            f"{format_seconds(min(m.walls))}, {format_seconds(min(m.cpus)) if m.cpus else '-'}",
            format_bytes(m.rss_after_warmup),
            format_bytes(m.peak_rss),
            format_bytes(median(m.sent)),
            _exact(m.exact, m.exact_input, m.turns),
            _exact(m.conversation.exact, m.conversation.exact_input, m.conversation.turns)
            if m.conversation
            else "-",
        ]
        if against is not None:
            cells.insert(3, _ratios(m, results[against]))
        print("| " + " | ".join(cells) + " |")
    for name in modes:
        conversation = results[name].conversation
        for line in results[name].differences:
            print(f"\n{name}, tool loop, first difference: {line}")
        for line in conversation.differences if conversation else ():
            print(f"\n{name}, conversation, first difference: {line}")


def _exact(exact: int, exact_input: int, turns: int) -> str:
    """``exact/turns turns``, and how many had the exact input when fewer were exact."""
    inputs = f" (input: {exact_input})" if exact_input != exact else ""
    return f"{exact}/{turns} turns{inputs}"


def _ratios(measured: Measured, other: Measured) -> str:
    """``wall / CPU / peak RSS`` of ``measured`` as ratios to ``other``'s ("-" where unknown)."""

    def ratio(
        mine: Sequence[float] | int | None,
        theirs: Sequence[float] | int | None,
        pick: Callable[[Sequence[float]], float] = median,
    ) -> str:
        if not mine or not theirs:
            return "-"
        a = mine if isinstance(mine, int) else pick(mine)
        b = theirs if isinstance(theirs, int) else pick(theirs)
        return f"{a / b:.2f}" if b else "-"

    walls = f"{ratio(measured.walls, other.walls)} (best {ratio(measured.walls, other.walls, min)})"
    cpus = f"{ratio(measured.cpus, other.cpus)} (best {ratio(measured.cpus, other.cpus, min)})"
    return f"{walls} / {cpus} / {ratio(measured.peak_rss, other.peak_rss)}"
