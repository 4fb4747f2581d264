"""``ws-mode bench``: what WebSocket mode saves an agent rollout, measured side by side.

One run compares three ways of running the same agent rollout against the reference server
(:mod:`ws_mode.reference`):

- ``HTTP``: ``POST /v1/responses`` with the whole history every turn (httpx, keep-alive, SSE);
- ``WS drop-in``: WebSocket mode with ``full_context="always"`` and no renderer: the client
  sends only the new items, the handler still gets (and parses) the whole history;
- ``WS cache-aware``: ``full_context="on_miss"`` with ``renderer=render_items``: the handler gets
  only the new items and resumes from the cached Turn.

each with the model at zero cost (``tokens_per_second=0``: nothing but the API plumbing) and at
the configured speed. The server runs in its own process (:mod:`ws_mode.bench_server`), so the
clients and the server never share a GIL; the modes run interleaved, their order rotated every
repetition, after a warm-up, and every number reported is a median over the repetitions.

A microbenchmark measures event forwarding: a handler streaming small
``response.output_text.delta`` events through the middleware to a websockets client, against a
bare Starlette WebSocket endpoint sending the same frames, already encoded, to the same client.

The results are a :class:`BenchReport`; :func:`format_report` prints it, :func:`plot` draws the
per-turn latency (matplotlib), and :func:`configure_parser` / :func:`run_from_args` are the
``ws-mode bench`` command. Needs the ``cli`` extra.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final, Literal

from .bench_forward import ForwardError, ForwardResult, forwarding_cost_in_process, run_forward
from .bench_server import PROFILE_PATH, READY_PREFIX, STATS_PATH, ServerSpec, mode_path

if TYPE_CHECKING:
    import httpx

    from .rollout import RolloutResult

__all__ = [
    "MODES",
    "BenchError",
    "BenchOptions",
    "BenchReport",
    "ForwardResult",
    "Goal",
    "ModeSummary",
    "ServerControl",
    "configure_parser",
    "format_report",
    "plot",
    "run_bench",
    "run_from_args",
    "server_process",
]

SERVER_START_SECONDS: Final = 60.0
WINDOW: Final = 3
"""Turns in the early and late windows (fewer on short rollouts)."""

GOAL_CACHE_AWARE: Final = 0.30
GOAL_FLAT: Final = 1.20
GOAL_DROP_IN: Final = 0.60
GOAL_FORWARD: Final = 0.67


class BenchError(Exception):
    """The benchmark could not run or its runs disagree; one line for the user."""


@dataclass(frozen=True)
class Mode:
    """One way of running the rollout: its label, its transport and its server path."""

    key: Literal["http", "always", "on_miss"]
    label: str
    transport: Literal["http", "socket"]


MODES: Final = (
    Mode("http", "HTTP", "http"),
    Mode("always", "WS drop-in", "socket"),
    Mode("on_miss", "WS cache-aware", "socket"),
)


@dataclass(frozen=True)
class BenchOptions:
    """A benchmark run's scenario and method (the ``ws-mode bench`` flags)."""

    turns: int = 25
    tool_output_bytes: int = 4096
    tokens_per_second: float = 1000.0
    time_to_first_token: float = 0.0
    concurrency: int = 1
    repeat: int = 7
    warmup: int = 1
    forward_events: int = 20_000
    forward_batch: int = 1
    plot: str | None = None
    json: str | None = None
    profile: str | None = None

    @property
    def speeds(self) -> tuple[float, ...]:
        """The model speeds run: zero cost, then the configured one (when not zero)."""
        return (0.0,) if self.tokens_per_second == 0 else (0.0, self.tokens_per_second)


# ----------------------------------------------------------------------------- the server


@contextlib.contextmanager
def server_process(spec: ServerSpec, *, python: str = sys.executable) -> Iterator[str]:
    """Run :mod:`ws_mode.bench_server` in a subprocess on a free loopback port; yield its
    origin. The process is terminated (killed if it lingers) when the block exits."""
    stderr = tempfile.TemporaryFile()  # noqa: SIM115  (closed in the finally below)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [python, "-m", "ws_mode.bench_server", "--spec", spec.to_json()],
        stdout=subprocess.PIPE,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=str(Path(__file__).resolve().parent.parent),
    )
    try:
        yield _wait_ready(process, stderr)
    finally:
        _stop(process)
        stderr.close()


def _wait_ready(process: subprocess.Popen[bytes], stderr: IO[bytes]) -> str:
    """The origin the server prints once it listens; BenchError if it exits or stays silent."""
    assert process.stdout is not None
    descriptor = process.stdout.fileno()  # read unbuffered: select() sees the pipe itself
    deadline = time.monotonic() + SERVER_START_SECONDS
    line = b""
    while b"\n" not in line:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([descriptor], [], [], min(left, 0.5))
        if ready:
            chunk = os.read(descriptor, 4096)
            if not chunk:
                break
            line += chunk
        elif process.poll() is not None:
            break
    text = line.decode(errors="replace").partition("\n")[0].strip()
    if not text.startswith(READY_PREFIX):
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(2.0)  # a server whose output ended is exiting
        stderr.seek(0)
        detail = stderr.read().decode(errors="replace").strip().splitlines()[-5:]
        status = "exited" if process.returncode is not None else "did not start in time"
        raise BenchError(f"the benchmark server {status}: " + (" | ".join(detail) or text))
    return text.removeprefix(READY_PREFIX)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stdout is not None:
        process.stdout.close()


class ServerControl:
    """The benchmark server's stats and profile routes."""

    def __init__(self, base_url: str, profile: bool) -> None:
        import httpx

        self.client: httpx.Client = httpx.Client(base_url=base_url, timeout=30.0)
        self.profile = profile

    def reset(self) -> dict[str, Any]:
        """Reset the reference counters and the peak RSS; the stats as they were."""
        answer: dict[str, Any] = self.client.post(STATS_PATH).raise_for_status().json()
        return answer

    def read(self) -> dict[str, Any]:
        answer: dict[str, Any] = self.client.get(STATS_PATH).raise_for_status().json()
        return answer

    def start_profile(self, name: str) -> None:
        if self.profile:
            command = {"action": "start", "name": name}
            self.client.post(PROFILE_PATH, json=command).raise_for_status()

    def stop_profile(self) -> None:
        if self.profile:
            self.client.post(PROFILE_PATH, json={"action": "stop"}).raise_for_status()

    def dump_profiles(self, directory: str) -> list[str]:
        answer = self.client.post(PROFILE_PATH, json={"action": "dump", "dir": directory})
        files: list[str] = answer.raise_for_status().json()["files"]
        return files

    def close(self) -> None:
        self.client.close()


# ----------------------------------------------------------------------------- rollouts


@dataclass
class Sample:
    """One mode's batch of concurrent rollouts in one repetition, and what the server did."""

    mode: str
    speed: float
    repetition: int
    results: list[RolloutResult]
    handler: dict[str, Any]
    server_cpu: float
    peak_rss: int | None


def _run_batch(
    base_url: str, mode: Mode, speed_index: int, options: BenchOptions, pool: ThreadPoolExecutor
) -> list[RolloutResult]:
    """``options.concurrency`` rollouts of ``mode`` at once; their results."""
    from .rollout import run_http, run_socket

    runner = run_http if mode.transport == "http" else run_socket
    path = mode_path(speed_index, mode.key)

    def one() -> RolloutResult:
        return runner(
            base_url, turns=options.turns, tool_output_bytes=options.tool_output_bytes, path=path
        )

    if options.concurrency == 1:
        return [one()]
    barrier = threading.Barrier(options.concurrency)

    def together() -> RolloutResult:
        barrier.wait()
        return one()

    futures = [pool.submit(together) for _ in range(options.concurrency)]
    return [future.result() for future in futures]


def _measure(
    base_url: str,
    mode: Mode,
    speed_index: int,
    speed: float,
    repetition: int,
    options: BenchOptions,
    control: ServerControl,
    pool: ThreadPoolExecutor,
) -> Sample:
    before = control.reset()
    control.start_profile(f"{_speed_key(speed)}-{mode.key}")
    try:
        results = _run_batch(base_url, mode, speed_index, options, pool)
    finally:
        control.stop_profile()
    after = control.read()
    for result in results:
        if result.turns != options.turns:
            raise BenchError(
                f"a {mode.label} rollout took {result.turns} turns instead of {options.turns}"
            )
    return Sample(
        mode=mode.key,
        speed=speed,
        repetition=repetition,
        results=results,
        handler=after["references"][speed_index],
        server_cpu=after["cpu_seconds"] - before["cpu_seconds"],
        peak_rss=after.get("peak_rss"),
    )


def _speed_key(speed: float) -> str:
    return "zero-cost" if speed == 0 else f"{speed:g}tps"


# ----------------------------------------------------------------------------- summaries


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def _optional_median(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def windows(turns: int) -> tuple[slice, slice]:
    """The early and late windows of a rollout's turn indices.

    The first turn (a fresh conversation; HTTP also connects in it) and the last (the model's
    answer instead of a tool call) are left out, so both windows hold like turns: a tool call
    continuing the previous response. Each holds up to 3 turns.
    """
    if turns < 4:
        return slice(0, turns), slice(0, turns)
    middle = turns - 2
    width = min(WINDOW, max(1, middle // 2))
    return slice(1, 1 + width), slice(turns - 1 - width, turns - 1)


@dataclass
class ModeSummary:
    """One mode at one model speed: the medians over the repetitions, per rollout.

    Attributes:
        end_to_end: a rollout's wall time, connecting included.
        turn_curve: each turn's median wall time, from sending to the terminal event.
        early, late: medians of the early and late windows (see :func:`windows`).
        bytes_sent: what the client sent over the rollout.
        handler_bytes: request body bytes the handler parsed.
        handler_cpu: the handler's own CPU time (ReferenceStats.cpu_seconds).
        tokens_rendered: tokens the handler rendered (ReferenceStats.tokens_rendered).
        items_seen: context items the handler looked at.
        resumed: requests the handler answered from the cached Turn.
        server_cpu: the server process's CPU time (middleware, uvicorn, handler).
        peak_rss: the server process's peak RSS while the mode ran (all its rollouts).
    """

    mode: str
    label: str
    speed: float
    end_to_end: float
    turn_curve: list[float]
    early: float
    late: float
    bytes_sent: float
    handler_bytes: float
    handler_cpu: float | None
    tokens_rendered: float | None
    items_seen: float | None
    resumed: float | None
    server_cpu: float
    peak_rss: float | None
    answer: str

    @property
    def growth(self) -> float:
        """late / early."""
        return self.late / self.early if self.early else math.nan


def _per_rollout(samples: Sequence[Sample], name: str, rollouts: int) -> float | None:
    values = [sample.handler.get(name) for sample in samples]
    return _optional_median([None if value is None else value / rollouts for value in values])


def summarize(mode: Mode, speed: float, samples: Sequence[Sample], turns: int) -> ModeSummary:
    """The medians of one mode's samples at one speed."""
    results = [result for sample in samples for result in sample.results]
    rollouts = len(samples[0].results)
    curve = [_median([result.turn_seconds[index] for result in results]) for index in range(turns)]
    early_window, late_window = windows(turns)
    answers = {result.answer for result in results}
    if len(answers) != 1:
        raise BenchError(f"the {mode.label} rollouts got different answers: {sorted(answers)}")
    return ModeSummary(
        mode=mode.key,
        label=mode.label,
        speed=speed,
        end_to_end=_median(
            [_median([result.total_seconds for result in sample.results]) for sample in samples]
        ),
        turn_curve=curve,
        early=_median(curve[early_window]),
        late=_median(curve[late_window]),
        bytes_sent=_median([result.bytes_sent for result in results]),
        handler_bytes=_per_rollout(samples, "bytes_parsed", rollouts) or 0.0,
        handler_cpu=_per_rollout(samples, "cpu_seconds", rollouts),
        tokens_rendered=_per_rollout(samples, "tokens_rendered", rollouts),
        items_seen=_per_rollout(samples, "items_seen", rollouts),
        resumed=_per_rollout(samples, "resumed", rollouts),
        server_cpu=_median([sample.server_cpu / rollouts for sample in samples]),
        peak_rss=_optional_median([sample.peak_rss for sample in samples]),
        answer=answers.pop(),
    )


# ----------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Goal:
    """One of the benchmark's goals, as measured."""

    text: str
    value: float
    limit: float
    at_most: bool
    detail: str = ""
    why: str = ""
    """Where the time goes, shown when the goal is not met."""

    @property
    def met(self) -> bool:
        """Whether the measured value is within the limit."""
        if math.isnan(self.value):
            return False
        return self.value <= self.limit if self.at_most else self.value >= self.limit


@dataclass
class BenchReport:
    """Everything one benchmark run measured."""

    options: BenchOptions
    summaries: dict[float, list[ModeSummary]]
    forward: ForwardResult | None
    samples: list[Sample]
    seconds: float
    profiles: list[str] = field(default_factory=list)

    def summary(self, speed: float, mode: str) -> ModeSummary:
        """The summary of ``mode`` at ``speed``."""
        return next(row for row in self.summaries[speed] if row.mode == mode)

    def goals(self) -> list[Goal]:
        """The goals, measured on the zero-cost model (and the forwarding microbenchmark)."""
        http, drop_in, cache_aware = (self.summary(0.0, mode.key) for mode in MODES)
        goals = [
            Goal(
                "cache-aware end-to-end / HTTP's (model at zero cost)",
                cache_aware.end_to_end / http.end_to_end,
                GOAL_CACHE_AWARE,
                at_most=True,
                why=f"cache-aware: the server spent {_seconds(cache_aware.server_cpu)} of CPU "
                f"per rollout ({_percent(cache_aware.server_cpu / cache_aware.end_to_end)} of "
                f"its end-to-end), the handler's own work {_seconds(cache_aware.handler_cpu)}",
            ),
            Goal(
                "cache-aware per-turn time flat: late / early (model at zero cost)",
                cache_aware.growth,
                GOAL_FLAT,
                at_most=True,
                detail=f"HTTP's late / early: {http.growth:.2f}, drop-in's: {drop_in.growth:.2f}",
            ),
            Goal(
                "drop-in end-to-end / HTTP's (model at zero cost)",
                drop_in.end_to_end / http.end_to_end,
                GOAL_DROP_IN,
                at_most=True,
                why=_drop_in_why(http, drop_in, self.options.concurrency),
            ),
        ]
        forward = self.forward
        if forward is not None:
            goals.append(
                Goal(
                    "event forwarding / bare WebSocket's throughput",
                    forward.ratio,
                    GOAL_FORWARD,
                    at_most=False,
                    detail=f"server CPU per event: bare {_seconds(forward.bare_cpu_per_event)}, "
                    f"middleware {_seconds(forward.middleware_cpu_per_event)}, "
                    f"ratio {forward.cpu_ratio:.2f}"
                    if forward.bare_cpu and forward.middleware_cpu
                    else "",
                    why=_forward_why(forward),
                )
            )
        return goals


def _forward_why(forward: ForwardResult) -> str:
    if not forward.in_process_cpu:
        return ""
    return (
        f"ws_mode's own work is {_seconds(forward.in_process_cpu_per_event)} per event "
        "(measured in-process with a send that does nothing: the handler's ASGI send, SSE "
        "decoding, the event's checks, Connection.send_text); uvicorn's frame send, which the "
        f"bare endpoint pays too, is the rest ({_seconds(forward.bare_cpu_per_event)} per "
        "event there)"
    )


def _drop_in_why(http: ModeSummary, drop_in: ModeSummary, concurrency: int) -> str:
    if drop_in.handler_cpu is None or not http.end_to_end:
        return ""
    # Concurrent rollouts queue on one server process: their handler work adds up.
    floor = concurrency * drop_in.handler_cpu / http.end_to_end
    shared = f", times {concurrency} rollouts sharing the server" if concurrency > 1 else ""
    return (
        "drop-in leaves the handler stateless: it still parsed and rendered the whole history "
        f"every turn ({_seconds(drop_in.handler_cpu)} of CPU per rollout{shared}: {floor:.2f} "
        "of HTTP's end-to-end), which no transport removes; drop-in saved the rest: "
        f"{_seconds(http.end_to_end - drop_in.end_to_end)} per rollout"
    )


def _rotated(modes: Sequence[Mode], repetition: int) -> list[Mode]:
    shift = repetition % len(modes)
    return [*modes[shift:], *modes[:shift]]


def run_bench(
    options: BenchOptions, *, progress: Callable[[str], None] | None = None
) -> BenchReport:
    """Start the benchmark server, run every mode at every speed and the forwarding
    microbenchmark, and stop the server; the measurements."""
    _check(options)
    say = progress or (lambda message: None)
    spec = ServerSpec(
        tool_calls=options.turns - 1,
        speeds=options.speeds,
        time_to_first_token=options.time_to_first_token,
        forward_events=options.forward_events,
        forward_batch=options.forward_batch,
    )
    from .rollout import RolloutError

    started = time.perf_counter()
    samples: list[Sample] = []
    forward: ForwardResult | None = None
    profiles: list[str] = []
    with (
        server_process(spec) as base_url,
        ThreadPoolExecutor(max_workers=max(1, options.concurrency)) as pool,
    ):
        control = ServerControl(base_url, profile=options.profile is not None)
        try:
            for speed_index, speed in enumerate(options.speeds):
                say(f"{_speed_label(speed, options.time_to_first_token)}: warming up")
                for _ in range(options.warmup):
                    for mode in MODES:
                        _run_batch(base_url, mode, speed_index, options, pool)
                for repetition in range(options.repeat):
                    say(
                        f"{_speed_label(speed, options.time_to_first_token)}: "
                        f"repetition {repetition + 1}/{options.repeat}"
                    )
                    for mode in _rotated(MODES, repetition):
                        samples.append(
                            _measure(
                                base_url,
                                mode,
                                speed_index,
                                speed,
                                repetition,
                                options,
                                control,
                                pool,
                            )
                        )
                if speed == 0 and options.forward_events:
                    say(f"event forwarding: {options.forward_events} events")
                    forward = run_forward(
                        base_url,
                        events=options.forward_events,
                        batch=options.forward_batch,
                        repeat=options.repeat,
                        control=control,
                        warmup=options.warmup > 0,
                    )
                    forward.in_process_cpu = forwarding_cost_in_process(
                        options.forward_events, batch=options.forward_batch, repeat=options.repeat
                    )
            if options.profile is not None:
                profiles = control.dump_profiles(str(Path(options.profile).resolve()))
        except (RolloutError, ForwardError) as exc:
            raise BenchError(str(exc)) from exc
        finally:
            control.close()
    summaries: dict[float, list[ModeSummary]] = {}
    for speed in options.speeds:
        rows = []
        for mode in MODES:
            chosen = [s for s in samples if s.speed == speed and s.mode == mode.key]
            rows.append(summarize(mode, speed, chosen, options.turns))
        answers = {row.answer for row in rows}
        if len(answers) != 1:
            raise BenchError(
                "the modes got different answers, so the model saw different contexts: "
                + " | ".join(sorted(answers))
            )
        summaries[speed] = rows
    report = BenchReport(
        options=options,
        summaries=summaries,
        forward=forward,
        samples=samples,
        seconds=time.perf_counter() - started,
        profiles=profiles,
    )
    if options.plot is not None:
        plot(report, options.plot)
    if options.json is not None:
        Path(options.json).write_text(json.dumps(report_json(report), indent=2) + "\n")
    return report


def _check(options: BenchOptions) -> None:
    if options.turns < 2:
        raise BenchError("--turns must be at least 2 (a tool call and the answer)")
    if options.repeat < 1 or options.concurrency < 1 or options.warmup < 0:
        raise BenchError("--repeat and --concurrency must be >= 1, --warmup >= 0")
    if options.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise BenchError(
                "--plot needs matplotlib: pip install matplotlib (or 'ws-mode[bench]')"
            ) from None


def report_json(report: BenchReport) -> dict[str, Any]:
    """The report as plain JSON: options, per-mode summaries, forwarding, goals."""
    forward = report.forward
    return {
        "options": asdict(report.options),
        "seconds": report.seconds,
        "summaries": {
            _speed_key(speed): [{**asdict(row), "growth": row.growth} for row in rows]
            for speed, rows in report.summaries.items()
        },
        "forward": None
        if forward is None
        else {
            **asdict(forward),
            "bare_rate": forward.bare_rate,
            "middleware_rate": forward.middleware_rate,
            "ratio": forward.ratio,
            "cpu_ratio": forward.cpu_ratio,
            "in_process_cpu_per_event": forward.in_process_cpu_per_event,
        },
        "goals": [{**asdict(goal), "met": goal.met} for goal in report.goals()],
    }


# ----------------------------------------------------------------------------- output


def _seconds(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    if value < 0:
        return "-" + _seconds(-value)
    if value >= 1.0:
        return f"{value:.2f} s"
    if value >= 0.001:
        return f"{value * 1000:.1f} ms"
    if value >= 0.00001:
        return f"{value * 1_000_000:.0f} µs"
    return f"{value * 1_000_000:.1f} µs"


def _bytes(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    if value >= 1024 * 1024:
        return f"{value / (1024 * 1024):.2f} MiB"
    if value >= 1024:
        return f"{value / 1024:.1f} KiB"
    return f"{value:.0f} B"


def _count(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:,.0f}"


def _ratio(value: float | None, reference: float | None, digits: int = 2) -> str:
    if value is None or reference is None or not reference or math.isnan(value):
        return "-"
    return f"{value / reference:.{digits}f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        return (indent + "  ".join([first, *rest])).rstrip()

    return [line(headers), indent + "-" * (sum(widths) + 2 * (len(widths) - 1)), *map(line, rows)]


def _speed_label(speed: float, time_to_first_token: float = 0.0) -> str:
    if speed == 0:
        return "model at zero cost (tokens_per_second=0: the API plumbing only)"
    first = f", {_seconds(time_to_first_token)} to first token" if time_to_first_token else ""
    return f"model at {speed:g} tokens/s{first}"


def _speed_tables(rows: Sequence[ModeSummary]) -> list[str]:
    http = rows[0]
    timing = [
        [
            row.label,
            _seconds(row.end_to_end),
            _ratio(row.end_to_end, http.end_to_end),
            _seconds(row.early),
            _seconds(row.late),
            f"{row.growth:.2f}",
            _bytes(row.bytes_sent),
            _ratio(row.bytes_sent, http.bytes_sent, 3),
        ]
        for row in rows
    ]
    work = [
        [
            row.label,
            _bytes(row.handler_bytes),
            _seconds(row.handler_cpu),
            _ratio(row.handler_cpu, http.handler_cpu),
            _count(row.tokens_rendered),
            _seconds(row.server_cpu),
            _ratio(row.server_cpu, http.server_cpu),
            _bytes(row.peak_rss),
        ]
        for row in rows
    ]
    return [
        *_table(
            [
                "mode",
                "end-to-end",
                "/HTTP",
                "early turn",
                "late turn",
                "late/early",
                "sent",
                "/HTTP",
            ],
            timing,
        ),
        "",
        *_table(
            [
                "mode",
                "handler parsed",
                "handler CPU",
                "/HTTP",
                "tokens rendered",
                "server CPU",
                "/HTTP",
                "server peak RSS",
            ],
            work,
        ),
    ]


def _breakdown(rows: Sequence[ModeSummary]) -> list[str]:
    """Where one rollout's time went at zero cost: the handler's CPU, the rest of the
    server's CPU (uvicorn, ws_mode, the middleware's renderer), and what is left (the client,
    loopback, scheduling). Meaningful with one rollout at a time, when nothing overlaps."""
    table = []
    for row in rows:
        handler = row.handler_cpu or 0.0
        table.append(
            [
                row.label,
                _seconds(row.end_to_end),
                f"{_seconds(handler)} ({_percent(handler / row.end_to_end)})",
                f"{_seconds(row.server_cpu - handler)} "
                f"({_percent((row.server_cpu - handler) / row.end_to_end)})",
                f"{_seconds(row.end_to_end - row.server_cpu)} "
                f"({_percent((row.end_to_end - row.server_cpu) / row.end_to_end)})",
            ]
        )
    return [
        "  Where the time went (per rollout):",
        *_table(
            [
                "mode",
                "end-to-end",
                "handler CPU",
                "rest of server CPU",
                "outside the server",
            ],
            table,
        ),
        "  rest of server CPU: uvicorn, ws_mode, the middleware's renderer; outside the server: "
        "the client, loopback, scheduling.",
    ]


def _saving_lines(report: BenchReport, speed: float) -> list[str]:
    http, drop_in, cache_aware = report.summaries[speed]
    zero_http, zero_drop_in, zero_cache_aware = report.summaries[0.0]
    lines = [
        f"At {speed:g} tokens/s the rollout took {_seconds(http.end_to_end)} over HTTP, "
        f"{_seconds(drop_in.end_to_end)} drop-in "
        f"(saved {_seconds(http.end_to_end - drop_in.end_to_end)}, "
        f"{_percent(1 - drop_in.end_to_end / http.end_to_end)}) and "
        f"{_seconds(cache_aware.end_to_end)} cache-aware "
        f"(saved {_seconds(http.end_to_end - cache_aware.end_to_end)}, "
        f"{_percent(1 - cache_aware.end_to_end / http.end_to_end)}); at zero cost the savings "
        f"were {_seconds(zero_http.end_to_end - zero_drop_in.end_to_end)} and "
        f"{_seconds(zero_http.end_to_end - zero_cache_aware.end_to_end)}.",
    ]
    if report.options.concurrency == 1:
        model_time = cache_aware.end_to_end - zero_cache_aware.end_to_end
        lines.append(
            "WebSocket mode saves API plumbing, which the model's speed does not change; "
            f"generating the tokens (about {_seconds(model_time)} per rollout: cache-aware at "
            f"{speed:g} tokens/s minus at zero cost) takes the same time in every mode, so the "
            "ratio to HTTP moves towards 1 as the model gets slower."
        )
    else:
        lines.append(
            "WebSocket mode saves API plumbing, which the model's speed does not change; with "
            f"{report.options.concurrency} rollouts sharing one server process, it also saves "
            "the time each waited for the others' plumbing."
        )
    return lines


def _percent(value: float) -> str:
    return f"{value * 100:.0f}%"


def format_report(report: BenchReport) -> list[str]:
    """The report as lines of text: the scenario, one table pair per model speed, the
    forwarding microbenchmark, and the goals."""
    options = report.options
    concurrency = (
        "1 rollout at a time"
        if options.concurrency == 1
        else f"{options.concurrency} concurrent rollouts per mode"
    )
    early, late = windows(options.turns)
    lines = [
        f"ws-mode bench: an agent rollout of {options.turns} turns ({options.turns - 1} tool "
        f"calls, {_bytes(options.tool_output_bytes)} per tool output), {concurrency}; "
        f"median of {options.repeat} repetitions, modes interleaved (order rotated), "
        f"server in its own process; {os.cpu_count()} CPUs.",
        f"Per rollout. Early / late turn: median time of turns {early.start + 1}-{early.stop} "
        f"/ {late.start + 1}-{late.stop} (send to terminal event). sent: bytes the client "
        "sent. handler: the reference server's own work (parse, render, digest, encode). "
        "server: the whole server process (uvicorn, ws_mode, handler).",
    ]
    for speed, rows in report.summaries.items():
        lines += ["", _speed_label(speed, options.time_to_first_token), *_speed_tables(rows)]
        if speed == 0 and options.concurrency == 1:
            lines += ["", *_breakdown(rows)]
        if speed != 0:
            lines += ["", *_saving_lines(report, speed)]
        for row in rows:
            if row.mode == "on_miss" and not row.resumed:
                lines.append(
                    "warning: the cache-aware handler resumed no request from the Turn: "
                    "it redid the whole history every turn"
                )
    forward = report.forward
    if forward is not None:
        lines += [
            "",
            f"Event forwarding: {forward.events:,} response.output_text.delta events "
            f"({forward.batch} per handler body chunk) to a websockets client, median of "
            f"{len(forward.bare_rates)}",
            *_table(
                ["endpoint", "events/s", "server CPU/event"],
                [
                    [
                        "bare Starlette WebSocket",
                        _count(forward.bare_rate),
                        _seconds(forward.bare_cpu_per_event if forward.bare_cpu else None),
                    ],
                    [
                        "through the middleware",
                        _count(forward.middleware_rate),
                        _seconds(
                            forward.middleware_cpu_per_event if forward.middleware_cpu else None
                        ),
                    ],
                ],
            ),
            f"  ratio: {forward.ratio:.2f} (events/s), {forward.cpu_ratio:.2f} (server CPU/event)",
        ]
        if forward.in_process_cpu:
            lines.append(
                f"  ws_mode's own CPU per event, in-process with no socket: "
                f"{_seconds(forward.in_process_cpu_per_event)}"
            )
    lines += ["", "Goals:"]
    for goal in report.goals():
        relation = "<=" if goal.at_most else ">="
        verdict = "met" if goal.met else "NOT MET"
        detail = f" ({goal.detail})" if goal.detail else ""
        lines.append(
            f"  goal: {goal.text} {relation} {goal.limit:.2f}: {goal.value:.2f} - {verdict}{detail}"
        )
        if not goal.met and goal.why:
            lines.append(f"    why: {goal.why}")
    if report.profiles:
        lines += ["", "Server profiles (cProfile; times are inflated by profiling):"]
        lines += [f"  {path}" for path in report.profiles]
    if options.plot is not None:
        lines += ["", f"Per-turn latency plot: {options.plot}"]
    lines.append(f"({report.seconds:.0f} s)")
    return lines


def plot(report: BenchReport, path: str) -> None:
    """Draw each mode's per-turn latency against the turn number, one panel per model
    speed, as a PNG (matplotlib's Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    speeds = list(report.summaries)
    figure, axes = plt.subplots(
        1, len(speeds), figsize=(6.0 * len(speeds), 4.2), squeeze=False, layout="constrained"
    )
    for axis, speed in zip(axes[0], speeds, strict=True):
        for row in report.summaries[speed]:
            turns = range(1, len(row.turn_curve) + 1)
            axis.plot(
                turns, [value * 1000 for value in row.turn_curve], marker=".", label=row.label
            )
        axis.set_title(
            "model at zero cost"
            if speed == 0
            else _speed_label(speed, report.options.time_to_first_token),
            fontsize=11,
        )
        axis.set_xlabel("turn")
        axis.set_ylabel("turn latency (ms, median)")
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.legend()
    options = report.options
    figure.suptitle(
        f"ws-mode bench: {options.turns} turns, {_bytes(options.tool_output_bytes)} tool outputs,"
        f" concurrency {options.concurrency}",
        fontsize=12,
    )
    figure.savefig(path, dpi=120)
    plt.close(figure)


# ----------------------------------------------------------------------------- the command


def _number(kind: type[int] | type[float], minimum: float) -> Callable[[str], Any]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
            ) from None
        if not math.isfinite(value) or value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum:g}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the ``ws-mode bench`` flags to ``parser``."""
    defaults = BenchOptions()
    parser.add_argument(
        "--turns",
        type=_number(int, 2),
        default=defaults.turns,
        help="model calls per rollout, the last one answering (default: %(default)s)",
    )
    parser.add_argument(
        "--tool-output-bytes",
        type=_number(int, 0),
        default=defaults.tool_output_bytes,
        help="bytes of each tool output (default: %(default)s)",
    )
    parser.add_argument(
        "--tokens-per-second",
        type=_number(float, 0),
        default=defaults.tokens_per_second,
        help="the model speed measured besides zero cost; 0 runs zero cost only "
        "(default: %(default)g)",
    )
    parser.add_argument(
        "--time-to-first-token",
        type=_number(float, 0),
        default=defaults.time_to_first_token,
        help="seconds before each response's first token at the configured speed "
        "(default: %(default)g)",
    )
    parser.add_argument(
        "--concurrency",
        type=_number(int, 1),
        default=defaults.concurrency,
        help="rollouts run at once per mode (default: %(default)s)",
    )
    parser.add_argument(
        "--repeat",
        type=_number(int, 1),
        default=defaults.repeat,
        help="repetitions; every number is their median (default: %(default)s)",
    )
    parser.add_argument(
        "--warmup",
        type=_number(int, 0),
        default=defaults.warmup,
        help="unmeasured rollouts per mode before measuring (default: %(default)s)",
    )
    parser.add_argument(
        "--forward-events",
        type=_number(int, 0),
        default=defaults.forward_events,
        help="events of the forwarding microbenchmark; 0 skips it (default: %(default)s)",
    )
    parser.add_argument(
        "--forward-batch",
        type=_number(int, 1),
        default=defaults.forward_batch,
        help="events per body chunk the forwarding handler sends (default: %(default)s)",
    )
    parser.add_argument("--plot", metavar="FILE.png", help="draw per-turn latency (matplotlib)")
    parser.add_argument("--json", metavar="FILE", help="write the measurements as JSON")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="cProfile the server during each mode's measured runs and write DIR/*.pstats "
        "(slows the server: for finding where the time goes, not for the numbers)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """The :class:`BenchOptions` of parsed ``ws-mode bench`` arguments."""
    return BenchOptions(
        turns=args.turns,
        tool_output_bytes=args.tool_output_bytes,
        tokens_per_second=args.tokens_per_second,
        time_to_first_token=args.time_to_first_token,
        concurrency=args.concurrency,
        repeat=args.repeat,
        warmup=args.warmup,
        forward_events=args.forward_events,
        forward_batch=args.forward_batch,
        plot=args.plot,
        json=args.json,
        profile=args.profile,
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Run ``ws-mode bench``: measure, print the report; raise :class:`BenchError`."""
    options = options_from_args(args)

    def progress(message: str) -> None:
        print(f"ws-mode bench: {message}", file=sys.stderr, flush=True)

    report = run_bench(options, progress=None if args.quiet else progress)
    for line in format_report(report):
        print(line)
    return 0
