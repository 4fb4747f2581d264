"""``ws-mode check`` against a hostile endpoint: one that answers every message with a frame far
larger than the checker reads (``--max-message-bytes``). Each check that reads such an answer
fails with the limit named, the others go on, the run exits 1, and nothing prints or logs a
traceback; the checker never reads the frame (websockets refuses it at its header), which is
what bounds its memory (measured in docs/deployment.md: 42 MiB of RSS against 256 MiB frames).
A flood of small events is bounded by the same limit, over all the messages of a socket.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hostile_endpoint import hostile_endpoint
from tests.toolkit.cli.checks import FAST, flat, row, run
from ws_mode.testing._client import MESSAGE_OVERHEAD, ReadLimitExceeded
from ws_mode.testing._program import Step
from ws_mode.toolkit.check import (
    CHECKS,
    CheckOptions,
    Target,
    open_socket,
    response_create,
    run_turn,
    too_large_detail,
)
from ws_mode.toolkit.cli import main

MiB = 1024 * 1024
#: The checks that read an answer (all but the handshake), every one failing against the
#: endpoint.
assert CHECKS[0] == "handshake"
READING = CHECKS[1:]


@pytest.fixture(scope="module")
def hostile_url() -> Iterator[str]:
    """An endpoint answering each message with one 8 MiB frame (against a 1 MiB limit)."""
    with hostile_endpoint(8 * MiB) as url:
        yield url


def test_an_answer_past_the_message_limit_fails_each_check_without_a_traceback(
    hostile_url: str,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    caplog.set_level(logging.WARNING)
    results = tmp_path / "check.json"
    status, out, rows, err = run(
        capsys, hostile_url, "--idle", "0.2", "--max-probe-bytes", "128KiB", "--timeout", "10",
        "--max-message-bytes", "1MiB", "--case", "lanes.fifo", "--json", str(results),
    )  # fmt: skip
    assert status == 1, out
    assert rows["handshake"] == "ok"
    assert {name: rows[name] for name in READING} == dict.fromkeys(READING, "FAILED"), out
    limit = "over --max-message-bytes (1048576 B): the checker closed the socket (1009)"
    for name in READING:
        assert limit in row(out, name), row(out, name)
    assert "the endpoint sent a message of 8388608 B" in row(out, "warm-up")
    assert "the answer to a 65536 B message" in row(out, "largest message")
    assert "pass a larger --max-message-bytes" in flat(out)
    # The conformance case reads under the same limit (its socket compressed: no size).
    assert "over the client's limit of 1048576 bytes" in row(out, "lanes.fifo")
    written = json.loads(results.read_text())
    probes = written["checks"][6]["data"]["probes"]
    assert [probe["failure"] for probe in probes] == ["answer_too_large"]
    assert written["cases"][0]["outcome"] == "failed"
    assert "Traceback" not in out + err
    logged = [record for record in caplog.records if record.exc_info]
    assert not logged, [(record.name, record.getMessage()) for record in logged]


def test_answers_within_the_limit_are_read(
    hostile_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same endpoint under a limit above its frames: the answers are read (and fail as
    what they are, no WebSocket mode turn), not refused for their size."""
    status, out, rows, _ = run(capsys, hostile_url, *FAST, "--max-message-bytes", "16MiB")
    assert status == 1
    assert rows["warm-up"] == "FAILED"
    assert "--max-message-bytes" not in row(out, "warm-up")


def test_the_limit_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "http://127.0.0.1:9", "--max-message-bytes", "0"]) == 1
    assert "--max-message-bytes must be at least 1 byte" in capsys.readouterr().err


def test_a_flood_of_small_events_is_bounded_by_the_same_limit() -> None:
    """An endpoint that never ends a turn, sending 1 KiB deltas as fast as it can: the turn the
    checker reads stops once the socket's messages pass the limit (each counted with what its
    event costs), where it read until --timeout before (4 GiB of RSS in 5 s, measured). The
    run's table says it as the oversized message's does (``too_large_detail``)."""
    options = CheckOptions(timeout=30, max_message_bytes=1 * MiB)
    request = response_create(options, "hi", generate=False)
    with (
        hostile_endpoint(1024, flood=True) as url,
        open_socket(Target(url, "/v1/responses"), options) as socket,
        pytest.raises(ReadLimitExceeded) as stopped,
    ):
        run_turn(socket, request, options, Step(generate=False))
    assert stopped.value.limit == 1 * MiB
    assert 1 * MiB < stopped.value.received <= 1 * MiB + 1024 + MESSAGE_OVERHEAD
    assert too_large_detail(stopped.value).startswith(
        "the endpoint sent more than --max-message-bytes (1048576 B) of messages on one socket"
    )
