"""``ws-mode check URL --all``: the deployment checks and every conformance case, against
``ws-mode serve`` and through ``ws-mode proxy`` in front of it (real servers in child
processes, on loopback; the reference model answers the model ``limited`` with 429, through the
proxy too). Every case passes but the connection lifetime's, which a run must be told how to
trigger: it is skipped, which does not fail the run. ``--case``
picks cases, ``--list`` lists them, ``--json`` holds them, a failed case exits 1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import ServeProcess, serve, ws_mode_proxy, ws_mode_serve
from tests.toolkit.cli.checks import FAST, run
from ws_mode.testing import CONFORMANCE_CASES
from ws_mode.toolkit.cli import main

#: What the reference model needs for every case: a tool call before each answer (the
#: pending steer), streams slow enough to steer into, a model answered with 429.
SERVE_FLAGS = ("--tool-calls", "1", "--tokens-per-second", "400", "--rate-limited-model", "limited")
#: Tells the run which request the server answers with 429.
RATE_LIMITED = ("--rate-limited-request", '{"model": "limited"}')
#: The case a run must be told how to trigger (a lifetime short enough), skipped without it.
SKIPPED = {"errors.connection_lifetime": "lifetime"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    with ws_mode_serve(*SERVE_FLAGS, cwd=tmp_path_factory.mktemp("conform")) as process:
        yield process


@pytest.fixture(scope="module")
def proxied(served: ServeProcess) -> Iterator[ServeProcess]:
    with ws_mode_proxy("--upstream", served.origin + "/v1") as process:
        yield process


def case_rows(out: str) -> dict[str, str]:
    """Each conformance row's outcome, by case name."""
    names = {case.name for case in CONFORMANCE_CASES}
    rows = {}
    for line in out.splitlines():
        cells = line.split()
        if len(cells) >= 2 and cells[0] in names:
            rows[cells[0]] = cells[1]
    return rows


def report_cases(out: str) -> list[tuple[str, str]]:
    """Each conformance row's name and the rest of its line."""
    names = {case.name for case in CONFORMANCE_CASES}
    return [
        (line.split()[0], line)
        for line in out.splitlines()
        if line.split() and line.split()[0] in names
    ]


def check_all(capsys: pytest.CaptureFixture[str], origin: str, tmp_path: Path) -> dict[str, Any]:
    written = tmp_path / "check.json"
    status, out, rows, _ = run(
        capsys, origin, "--all", *RATE_LIMITED, *FAST, "--json", str(written)
    )
    assert status == 0, out
    assert set(rows.values()) <= {"ok", "skipped"}, out
    outcomes = case_rows(out)
    assert list(outcomes) == [case.name for case in CONFORMANCE_CASES]
    expected = {name: "skipped" if name in SKIPPED else "passed" for name in outcomes}
    assert outcomes == expected, out
    limited = next(case for case in report_cases(out) if case[0] == "errors.rate_limit_headers")
    assert "retry-after" in limited[1], out
    assert "x-ratelimit-remaining-requests" in limited[1], out
    total = len(CONFORMANCE_CASES)
    assert f"conformance: {total - 1} passed, 0 failed, 1 skipped" in out
    report: dict[str, Any] = json.loads(written.read_text())
    assert report["ok"] is True
    return report


@pytest.mark.timeout(120)
def test_every_case_passes_or_is_skipped_against_ws_mode_serve(
    served: ServeProcess, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    report = check_all(capsys, served.origin, tmp_path)
    cases = {case["name"]: case for case in report["cases"]}
    for name, why in SKIPPED.items():
        assert cases[name]["outcome"] == "skipped"
        assert why in cases[name]["detail"]
    assert cases["steering.accepted"]["source"].startswith("OpenAI steering guide")
    assert "steer_" in cases["steering.accepted"]["detail"]


@pytest.mark.timeout(120)
def test_every_case_passes_or_is_skipped_through_ws_mode_proxy(
    proxied: ServeProcess, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    check_all(capsys, proxied.origin, tmp_path)


def test_case_picks_cases_and_list_lists_them(
    served: ServeProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _, _ = run(capsys, served.origin, "--case", "frames.*", "--case", "lanes.fifo",
                            *FAST)  # fmt: skip
    assert status == 0, out
    assert list(case_rows(out)) == [
        "lanes.fifo", "frames.bad_json", "frames.not_object", "frames.binary",
        "frames.unknown_event",
    ]  # fmt: skip
    assert "conformance: 5 passed, 0 failed, 0 skipped" in out
    assert main(["check", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == [case.name for case in CONFORMANCE_CASES]
    assert "(OpenAI WebSocket mode guide, stream_id" in listed[0]


def test_a_pattern_that_matches_no_case_is_refused(
    served: ServeProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["check", served.origin, "--case", "nothing.*", *FAST])
    assert status == 1
    assert "no conformance case matches 'nothing.*'" in capsys.readouterr().err


def test_a_failed_case_fails_the_run(
    served: ServeProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    # ws-mode serve answers only the model "limited" with 429: told another is, the case fails.
    status, out, rows, _ = run(
        capsys, served.origin, "--case", "errors.rate_limit_headers",
        "--rate-limited-request", '{"model": "any"}', *FAST,
    )  # fmt: skip
    assert status == 1, out
    assert rows["handshake"] == "ok"
    assert case_rows(out) == {"errors.rate_limit_headers": "FAILED"}
    assert "not 429" in out
    assert "conformance: 0 passed, 1 failed, 0 skipped" in out
    assert out.splitlines()[-1] == "verdict: 1 conformance case failed (exit status 1)"
    assert "works here" not in out


def test_cases_are_skipped_when_the_handshake_fails(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, rows, _ = run(capsys, "http://127.0.0.1:9", "--case", "lanes.f*", *FAST)
    assert status == 1
    assert rows["handshake"] == "FAILED"
    assert case_rows(out) == {"lanes.fifo": "skipped", "lanes.fork": "skipped"}
    assert "the handshake failed" in out


@pytest.mark.timeout(120)
def test_a_correct_endpoint_that_streams_faster_than_a_case_can_act_passes_with_skips(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The README's app answers at once: the cases that need a response still streaming when
    # they act (lanes at once, steering, interrupts) skip, saying so; none fails.
    with serve("examples.fastapi_app:app") as origin:
        status, out, rows, _ = run(capsys, origin, "--all", *FAST)
    assert status == 0, out
    assert set(rows.values()) <= {"ok", "skipped"}, out
    outcomes = case_rows(out)
    assert "FAILED" not in outcomes.values(), out
    for name in ("lanes.concurrent", "interrupt.accepted", "interrupt.continued"):
        assert outcomes[name] == "skipped", out
    assert "streams too fast" in dict(report_cases(out))["interrupt.accepted"]
    assert outcomes["interrupt.unknown_mode"] == "passed", out
    # One verdict, the last line, as the exit status says it.
    assert out.count("works here") == 1, out
    assert out.splitlines()[-1].startswith("verdict: WebSocket mode works here"), out
