"""The scripted model (`ws_mode.toolkit.reference.model`): tool calls, then an answer, as a pure
function of the whole context; and its configuration."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.toolkit.reference.helpers import TOOLS, USER, call_output
from ws_mode.toolkit.reference import ReferenceConfig, context_digest, script
from ws_mode.toolkit.reference.model import text_deltas, tool_calls_since_user

# --- the scripted model -------------------------------------------------------------------


def test_script_calls_tools_then_answers() -> None:
    config = ReferenceConfig(tool_calls=3, answer_tokens=10)
    context: list[dict[str, Any]] = [USER]
    for step in range(1, 4):
        (item,) = script(context, "Be brief.", TOOLS, config)
        assert item["type"] == "function_call"
        assert item["name"] == "get_weather"
        assert item["status"] == "completed"
        digest = context_digest(context, "Be brief.", TOOLS)
        assert item["id"] == f"fc_{digest}"
        assert item["call_id"] == f"call_{digest}"
        assert orjson.loads(item["arguments"]) == {"step": step, "context_digest": digest}
        context = [*context, item, call_output(item)]
    (answer,) = script(context, "Be brief.", TOOLS, config)
    digest = context_digest(context, "Be brief.", TOOLS)
    assert answer["type"] == "message"
    assert answer["role"] == "assistant"
    assert answer["id"] == f"msg_{digest}"
    (part,) = answer["content"]
    assert part["type"] == "output_text"
    assert part["annotations"] == []
    assert part["text"].startswith(f"[{digest}] answered after 3 tool calls.")
    assert len(part["text"].split(" ")) == 10


def test_count_restarts_after_a_new_user_message() -> None:
    config = ReferenceConfig(tool_calls=1)
    (first,) = script([USER], None, None, config)
    context = [USER, first, call_output(first)]
    assert script(context, None, None, config)[0]["type"] == "message"
    context = [
        *context,
        script(context, None, None, config)[0],
        {"role": "user", "content": "More"},
    ]
    (again,) = script(context, None, None, config)
    assert again["type"] == "function_call"
    assert orjson.loads(again["arguments"])["step"] == 1
    # A user message given as an explicit `type: "message"` item counts too.
    typed = [*context[:-1], {"type": "message", "role": "user", "content": "More"}]
    assert tool_calls_since_user(typed) == 0
    # Outputs before any user message count as well.
    assert tool_calls_since_user([call_output(first), call_output(first)]) == 2


def test_zero_tool_calls_answers_at_once() -> None:
    (item,) = script([USER], None, None, ReferenceConfig(tool_calls=0, answer_tokens=3))
    assert item["type"] == "message"
    assert item["content"][0]["text"] == f"[{context_digest([USER], None, None)}] answered after"


def test_tool_name_defaults_to_lookup() -> None:
    config = ReferenceConfig()
    assert script([USER], None, None, config)[0]["name"] == "lookup"
    assert script([USER], None, [{"type": "web_search"}], config)[0]["name"] == "lookup"
    assert script([USER], None, TOOLS, config)[0]["name"] == "get_weather"


def test_output_depends_on_the_whole_context() -> None:
    config = ReferenceConfig(tool_calls=5)
    base = script([USER, {"role": "user", "content": "b"}], None, None, config)
    changed_first = script(
        [{**USER, "content": "x"}, {"role": "user", "content": "b"}], None, None, config
    )
    assert base != changed_first
    assert base != script([USER, {"role": "user", "content": "b"}], "instructions", None, config)
    assert base != script([USER, {"role": "user", "content": "b"}], None, TOOLS[:1], config)
    # Key order does not matter: the digest is over canonical JSON.
    reordered = [{"content": USER["content"], "role": "user"}, {"content": "b", "role": "user"}]
    assert base == script(reordered, None, None, config)


def test_script_is_deterministic_and_pure() -> None:
    context = [USER]
    snapshot = copy.deepcopy(context)
    config = ReferenceConfig(argument_padding=10)
    assert script(context, "i", TOOLS, config) == script(copy.deepcopy(context), "i", TOOLS, config)
    assert context == snapshot


def test_argument_padding_and_answer_length() -> None:
    (item,) = script([USER], None, None, ReferenceConfig(argument_padding=100))
    arguments = orjson.loads(item["arguments"])
    assert len(arguments["padding"]) == 100
    (plain,) = script([USER], None, None, ReferenceConfig())
    assert "padding" not in orjson.loads(plain["arguments"])
    for words in (1, 6, 7, 250):
        (answer,) = script([USER], None, None, ReferenceConfig(tool_calls=0, answer_tokens=words))
        text = answer["content"][0]["text"]
        assert len(text.split(" ")) == words
        assert context_digest([USER], None, None) in text
        assert "".join(text_deltas(text)) == text


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tool_calls": -1}, "tool_calls"),
        ({"tool_calls": 1.5}, "tool_calls"),
        ({"tool_calls": True}, "tool_calls"),
        ({"answer_tokens": 0}, "answer_tokens"),
        ({"argument_padding": -3}, "argument_padding"),
        ({"tokens_per_second": -1.0}, "tokens_per_second"),
        ({"tokens_per_second": float("inf")}, "tokens_per_second"),
        ({"tokens_per_second": float("nan")}, "tokens_per_second"),
        ({"tokens_per_second": "fast"}, "tokens_per_second"),
        ({"time_to_first_token": -0.1}, "time_to_first_token"),
        ({"time_to_first_token": float("nan")}, "time_to_first_token"),
        ({"time_to_first_token": None}, "time_to_first_token"),
    ],
)
def test_config_validation(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ReferenceConfig(**kwargs)


def test_config_accepts_valid_values_and_is_frozen() -> None:
    config = ReferenceConfig(tool_calls=0, tokens_per_second=500, answer_tokens=1)
    assert config.tokens_per_second == 500
    with pytest.raises(AttributeError):
        config.tool_calls = 4  # type: ignore[misc]


# --- hypothesis ---------------------------------------------------------------------------

text = st.text(max_size=12)
call_ids = st.text(alphabet="abc123", min_size=1, max_size=6).map(lambda s: f"call_{s}")
items = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, text),
    st.builds(
        lambda t: {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": t, "annotations": []}],
        },
        text,
    ),
    st.builds(
        lambda c, a: {"type": "function_call", "call_id": c, "name": "f", "arguments": a},
        call_ids,
        text,
    ),
    st.builds(
        lambda c, o: {"type": "function_call_output", "call_id": c, "output": o}, call_ids, text
    ),
)


def mutate(item: dict[str, Any]) -> dict[str, Any]:
    """A copy of `item` whose text field differs."""
    changed = copy.deepcopy(item)
    if item.get("type") == "message":
        changed["content"][0]["text"] += "!"
    elif item.get("type") == "function_call":
        changed["arguments"] += "!"
    elif item.get("type") == "function_call_output":
        changed["output"] += "!"
    else:
        changed["content"] += "!"
    return changed


@settings(max_examples=200, deadline=None)
@given(
    context=st.lists(items, max_size=12),
    data=st.data(),
    tool_calls=st.integers(0, 4),
    instructions=st.none() | text,
)
def test_script_is_a_function_of_the_whole_context(
    context: list[dict[str, Any]],
    data: st.DataObject,
    tool_calls: int,
    instructions: str | None,
) -> None:
    config = ReferenceConfig(tool_calls=tool_calls, answer_tokens=5)
    output = script(context, instructions, None, config)
    assert output == script(copy.deepcopy(context), instructions, None, config)
    (item,) = output
    expected = "function_call" if tool_calls_since_user(context) < tool_calls else "message"
    assert item["type"] == expected
    if context:
        index = data.draw(st.integers(0, len(context) - 1))
        changed = [*context[:index], mutate(context[index]), *context[index + 1 :]]
        assert script(changed, instructions, None, config) != output
        assert script(context[:index] + context[index + 1 :], instructions, None, config) != output
