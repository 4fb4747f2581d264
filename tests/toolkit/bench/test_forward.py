"""The event-forwarding microbenchmark (`ws_mode.toolkit.bench.forward`): against the benchmark
server it measures positive rates, in-process a positive cost per event, and its frames are
one response.

No test asserts a time or a ratio: the machine is shared and the numbers are noisy.
"""

from __future__ import annotations

import json

import pytest

from ws_mode.toolkit.bench.control import server_process
from ws_mode.toolkit.bench.forward import forward_frames, forwarding_cost_in_process, run_forward
from ws_mode.toolkit.bench.server import ServerSpec


def test_forwarding_microbenchmark_measures_positive_rates() -> None:
    spec = ServerSpec(tool_calls=1, forward_events=200)
    with server_process(spec) as base_url:
        result = run_forward(base_url, events=200, repeat=2)
    assert len(result.bare_rates) == len(result.middleware_rates) == len(result.objects_rates) == 2
    assert result.bare_rate > 0
    assert result.middleware_rate > 0
    assert result.objects_rate > 0
    assert result.ratio > 0


@pytest.mark.parametrize("objects", [False, True])
def test_forwarding_cost_in_process_is_positive(objects: bool) -> None:
    costs = forwarding_cost_in_process(200, repeat=2, objects=objects)
    assert len(costs) == 2
    assert all(cost > 0 for cost in costs)


def test_forward_frames_frame_one_response() -> None:
    frames = [json.loads(frame) for frame in forward_frames(3)]
    assert [frame["type"] for frame in frames] == [
        "response.created",
        *["response.output_text.delta"] * 3,
        "response.completed",
    ]
    assert [frame["sequence_number"] for frame in frames] == [0, 1, 2, 3, 4]
