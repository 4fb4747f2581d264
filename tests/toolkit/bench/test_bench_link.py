"""``ws-mode bench --link``: every mode's client goes through the relay, so no turn can be
faster than the link's round trip (a lower bound that follows from the design), and the report
says which link it modelled; the flags that do not go together are refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ws_mode.toolkit.bench.options import BenchError, BenchOptions
from ws_mode.toolkit.cli import main

RTT = 0.08


def test_link_makes_every_turn_of_every_mode_last_a_round_trip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measurements = tmp_path / "bench.json"
    argv = [
        *("bench", "--turns", "3", "--repeat", "1", "--warmup", "0"),
        *("--tokens-per-second", "0", "--forward-events", "0", "--quiet"),
        *("--link", "rtt=80ms,up=10mbit", "--json", str(measurements)),
    ]
    status = main(argv)
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "through a relay modelling rtt 80 ms, up 10 Mbit/s, down unlimited" in captured.out
    data = json.loads(measurements.read_text())
    assert data["link"] == "rtt 80 ms, up 10 Mbit/s, down unlimited"
    rows = data["summaries"]["zero-cost"]
    assert len(rows) == 3
    for row in rows:
        # A request and its answer cross the relay both ways: at least one round trip.
        assert all(seconds >= RTT for seconds in row["turn_curve"]), row["label"]
        assert row["end_to_end"] >= RTT * 3


@pytest.mark.slow  # four processes and two relays: about 5 s
def test_link_works_with_the_proxy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    measurements = tmp_path / "proxy.json"
    argv = [
        *("bench", "--proxy", "--turns", "2", "--repeat", "1", "--warmup", "0"),
        *("--tokens-per-second", "0", "--quiet", "--link", "rtt=80ms"),
        *("--json", str(measurements)),
    ]
    status = main(argv)
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "each through a relay modelling rtt 80 ms" in captured.out
    data = json.loads(measurements.read_text())
    for row in data["summaries"]["zero-cost"]:
        assert all(seconds >= RTT for seconds in row["row"]["turn_curve"]), row["row"]["label"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--proxy", "--url", "http://127.0.0.1:1"], "--proxy and --url"),
        (["--proxy", "--concurrency", "2"], "--concurrency 1"),
        (["--proxy", "--plot", "x.png"], "--plot"),
        (["--model", "m"], "go with --url"),
        (["--api-key", "k"], "go with --url"),
        (["--url", "ftp://127.0.0.1:1", "--model", "m"], "http:// or https://"),
        (["--url", "http://127.0.0.1:1"], "--url needs --model"),
        (["--url", "http://127.0.0.1:1", "--model", "m", "--header", "bad"], "Name: value"),
        (["--url", "http://127.0.0.1:1", "--model", "m", "--check"], "not with --url"),
        (["--url", "https://127.0.0.1:1", "--model", "m", "--link", "rtt=1ms"], "https"),
    ],
)
def test_options_that_do_not_go_together_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *argv, "--quiet"]) == 1
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("link", ["rtt=fast", "latency=30ms", "up=0mbit", "rtt=-1ms"])
def test_a_link_that_does_not_parse_is_a_usage_error(
    link: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--link", link]) == 2
    assert "--link" in capsys.readouterr().err
    with pytest.raises(BenchError, match="--link"):
        BenchOptions(link=link).validate()
