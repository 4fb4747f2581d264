"""``ws-mode bench``'s options (`ws_mode.toolkit.bench.options`): the flags that do not go together
are refused in one line, and a ``--link`` that does not parse is a usage error.
"""

from __future__ import annotations

import pytest

from ws_mode.toolkit.bench.options import BenchError, BenchOptions
from ws_mode.toolkit.cli import main


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
