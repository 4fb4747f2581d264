"""The compaction flows with the real openai SDK, sync and async, against the reference server
as ``ws-mode serve`` builds it (`build_app`) on a real socket: ``responses.compact()`` output
starting a new chain over ``responses.connect()``, and a chain compacted by
``context_management`` continued with ``previous_response_id``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from openai import AsyncOpenAI, OpenAI

from tests.integration.clients import (
    async_until_terminal,
    call_output,
    completed_response,
    sdk_until_terminal,
)
from tests.servers import serve
from ws_mode.toolkit.cli.serve import build_app

MODEL = "reference"
HISTORY: list[dict[str, Any]] = [
    {"type": "message", "role": "user", "content": "The meeting moved to Thursday."},
    {"type": "message", "role": "assistant", "content": "Noted. " * 60},
    {"type": "message", "role": "user", "content": "Compact, please."},
]
NEXT: dict[str, Any] = {"type": "message", "role": "user", "content": "When is the meeting?"}
COMPACT_AT = [{"type": "compaction", "compact_threshold": 120}]


@pytest.fixture(scope="module", params=["always", "on_miss"])
def base(request: pytest.FixtureRequest) -> Iterator[str]:
    with serve(build_app(tool_calls=1, full_context=request.param)) as url:
        yield url + "/v1"


def items(output: list[Any]) -> list[dict[str, Any]]:
    """SDK output items as input items, as a client passes them back."""
    return [item.model_dump(exclude_none=True) for item in output]


def test_compact_output_starts_a_new_chain_sync(base: str) -> None:
    with OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=10) as client:
        raw = client.responses.with_raw_response.compact(model=MODEL, input=HISTORY)  # type: ignore[arg-type]
        compacted = raw.parse()
        assert compacted.object == "response.compaction"
        assert compacted.output[-1].type == "compaction"
        # Passed back as it came: the SDK types the user messages of the output as assistant
        # output messages, so dumping its models would not give them back unchanged.
        window = raw.http_response.json()["output"]
        full = client.responses.create(model=MODEL, input=[*HISTORY, NEXT])  # type: ignore[arg-type]
        with client.responses.connect() as conn:
            conn.response.create(model=MODEL, input=[*window, NEXT])
            response = completed_response(sdk_until_terminal(conn))
        assert response.previous_response_id is None
        assert items(response.output) == items(full.output)
        assert response.usage.input_tokens < full.usage.input_tokens


@pytest.mark.anyio
async def test_context_management_chain_async(base: str) -> None:
    """A tool loop with a low threshold: the compaction item comes first in the output, and
    the chain goes on from it with only new items, answering as the full history does."""
    async with AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=10) as client:
        async with client.responses.connect() as conn:
            await conn.response.create(
                model=MODEL,
                input=HISTORY,
                context_management=COMPACT_AT,  # type: ignore[arg-type]
            )
            first = completed_response(await async_until_terminal(conn))
            assert [item.type for item in first.output] == ["compaction", "function_call"]
            call = first.output[-1]
            await conn.response.create(
                model=MODEL,
                previous_response_id=first.id,
                input=[call_output(call)],  # type: ignore[list-item]
                context_management=COMPACT_AT,  # type: ignore[arg-type]
            )
            second = completed_response(await async_until_terminal(conn))
        assert [item.type for item in second.output] == ["message"]  # read from the compaction
        full = await client.responses.create(
            model=MODEL,
            input=[*HISTORY, call.model_dump(exclude_none=True), call_output(call)],  # type: ignore[list-item]
        )
        assert items(second.output) == items(full.output)
