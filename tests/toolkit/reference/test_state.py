"""The model's context state: a resumable digest and tool-call count, so a continuation can be
answered from its parent's state plus the new items, exactly as from the whole context."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ws_mode.toolkit.reference import ReferenceConfig, context_digest, fold_items, script
from ws_mode.toolkit.reference._json import canonical_json
from ws_mode.toolkit.reference.model import (
    count_tool_calls,
    finish_digest,
    script_from_state,
    tool_calls_since_user,
)

text = st.text(max_size=10)
items = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, text),
    st.builds(lambda t: {"type": "message", "role": "user", "content": t}, text),
    st.builds(lambda t: {"role": "assistant", "content": t}, text),
    st.builds(lambda a: {"type": "function_call", "name": "f", "arguments": a}, text),
    st.builds(lambda o: {"type": "function_call_output", "call_id": "c", "output": o}, text),
    st.builds(lambda n: {"type": "other", "n": n}, st.integers(-(2**70), 2**70)),
)
contexts = st.lists(items, max_size=10)


def test_the_digest_is_the_documented_chain() -> None:
    context: list[dict[str, Any]] = [{"role": "user"}, {"type": "x", "b": 1, "a": 0}]
    state = b""
    for item in context:
        state = hashlib.sha256(state + canonical_json(item)).digest()
    assert fold_items(b"", context) == state
    assert canonical_json(context[1]) == b'{"a":0,"b":1,"type":"x"}'
    settings_json = canonical_json({"instructions": "i", "tools": None})
    expected = hashlib.sha256(state + settings_json).hexdigest()[:16]
    assert context_digest(context, "i", None) == finish_digest(state, "i", None) == expected
    assert fold_items(b"", []) == b""


@settings(max_examples=200, deadline=None)
@given(first=contexts, second=contexts, start=st.binary(max_size=32))
def test_folding_resumes(
    first: list[dict[str, Any]], second: list[dict[str, Any]], start: bytes
) -> None:
    assert fold_items(fold_items(start, first), second) == fold_items(start, first + second)
    assert count_tool_calls(count_tool_calls(0, first), second) == tool_calls_since_user(
        first + second
    )


@settings(max_examples=200, deadline=None)
@given(context=contexts, data=st.data(), instructions=st.none() | text)
def test_the_digest_covers_every_item(
    context: list[dict[str, Any]], data: st.DataObject, instructions: str | None
) -> None:
    digest = context_digest(context, instructions, None)
    # Equal contexts (key order aside) have equal digests.
    reordered = [dict(reversed(item.items())) for item in copy.deepcopy(context)]
    assert context_digest(reordered, instructions, None) == digest
    assert context_digest(context, instructions, [{"type": "function", "name": "f"}]) != digest
    assert context_digest(context, (instructions or "") + "!", None) != digest
    if not context:
        return
    index = data.draw(st.integers(0, len(context) - 1))
    changed = copy.deepcopy(context)
    changed[index]["extra"] = True
    assert context_digest(changed, instructions, None) != digest
    dropped = context[:index] + context[index + 1 :]
    assert context_digest(dropped, instructions, None) != digest
    swapped = [*context[index + 1 :], *context[: index + 1]]
    if swapped != context:
        assert context_digest(swapped, instructions, None) != digest


@settings(max_examples=100, deadline=None)
@given(context=contexts, tool_calls=st.integers(0, 3))
def test_script_from_state_is_script(context: list[dict[str, Any]], tool_calls: int) -> None:
    config = ReferenceConfig(tool_calls=tool_calls, answer_tokens=4)
    state = fold_items(b"", context)
    calls = count_tool_calls(0, context)
    assert script_from_state(state, calls, "i", None, config) == script(context, "i", None, config)


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        ([], 0),
        ([{"type": "function_call_output", "output": ""}] * 2, 2),
        ([{"type": "function_call_output"}, {"role": "user", "content": "x"}], 0),
        ([{"role": "user"}, {"type": "function_call_output"}, {"role": "assistant"}], 1),
        ([{"type": "message", "role": "user"}, {"type": "function_call_output"}], 1),
    ],
)
def test_count_tool_calls(context: list[dict[str, Any]], expected: int) -> None:
    assert count_tool_calls(0, context) == tool_calls_since_user(context) == expected
    # Continuing from 5 calls: only a user message starts the count again.
    has_user = any(item.get("role") == "user" for item in context)
    assert count_tool_calls(5, context) == expected + (0 if has_user else 5)
