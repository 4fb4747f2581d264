"""The reference tokenizer: a deterministic byte-level BPE and an item-by-item chat template."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ws_mode.toolkit.reference import ReferenceTokenizer, render_items
from ws_mode.toolkit.reference.tokenizer import END, START, item_text

text = st.text(max_size=40)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(text, children, max_size=3),
    max_leaves=6,
)
content_parts = st.lists(
    st.builds(lambda t: {"type": "input_text", "text": t}, text)
    | st.builds(lambda url: {"type": "input_image", "image_url": url}, text),
    max_size=3,
)
items = st.one_of(
    st.builds(lambda r, t: {"role": r, "content": t}, st.sampled_from(["user", "system"]), text),
    st.builds(
        lambda r, parts: {"type": "message", "role": r, "content": parts},
        st.sampled_from(["user", "assistant", "developer"]),
        content_parts,
    ),
    st.builds(
        lambda n, a: {"type": "function_call", "call_id": "call_1", "name": n, "arguments": a},
        text,
        text,
    ),
    st.builds(
        lambda o: {"type": "function_call_output", "call_id": "call_1", "output": o},
        text | json_values,
    ),
    st.builds(lambda kind, data: {"type": kind, "data": data}, text, json_values),
)


def test_instances_give_the_same_ids() -> None:
    shared, other = ReferenceTokenizer(), ReferenceTokenizer()
    fresh = ReferenceTokenizer.trained()  # trained again, not the process-wide model
    assert fresh.to_json() == shared.to_json() == other.to_json()
    sample = "def load_users(path):\n    return json.loads(path.read_text())  # Paris, 18°C"
    assert fresh.encode(sample) == shared.encode(sample) == other.encode(sample)


def test_training_is_the_same_in_another_process() -> None:
    code = (
        "import hashlib; from ws_mode.toolkit.reference import ReferenceTokenizer; "
        "print(hashlib.sha256(ReferenceTokenizer().to_json().encode()).hexdigest())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "123", "RAYON_NUM_THREADS": "1"}
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    here = hashlib.sha256(ReferenceTokenizer().to_json().encode()).hexdigest()
    assert other.stdout.strip() == here


def test_a_real_bpe() -> None:
    tokenizer = ReferenceTokenizer()
    assert 2000 <= tokenizer.vocab_size <= 4000
    for phrase in ("the weather in Paris", " tokens", "function", "response", "import json"):
        assert len(tokenizer.encode(phrase)) < len(phrase), phrase
    # Any text round-trips, whatever it holds (byte-level: no unknown token).
    for sample in ("Ünïcödé 日本語 🙂", "\x00\t\r\n", ""):
        assert tokenizer.decode(tokenizer.encode(sample)) == sample
    # The item markers are single tokens.
    assert len(tokenizer.encode(START)) == len(tokenizer.encode(END)) == 1


def test_item_text() -> None:
    user = {"role": "user", "content": "Hi"}
    assert item_text(user) == f"{START}user\nHi{END}\n"
    parts = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "a", "annotations": []}, {"type": "x"}],
    }
    assert item_text(parts) == f'{START}assistant\na\n{{"type":"x"}}{END}\n'
    call = {"type": "function_call", "call_id": "c", "name": "grep", "arguments": '{"q":1}'}
    assert item_text(call) == f'{START}function_call grep\n{{"q":1}}{END}\n'
    output = {"type": "function_call_output", "call_id": "c", "output": "found"}
    assert item_text(output) == f"{START}function_call_output\nfound{END}\n"
    other = {"type": "reasoning", "summary": [], "id": "rs_1"}
    canonical = '{"id":"rs_1","summary":[],"type":"reasoning"}'
    assert item_text(other) == f"{START}reasoning\n{canonical}{END}\n"
    rendered = render_items([user, call])
    assert ReferenceTokenizer().decode(rendered) == item_text(user) + item_text(call)


@settings(max_examples=150, deadline=None)
@given(first=st.lists(items, max_size=5), second=st.lists(items, max_size=5))
def test_rendering_is_additive(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> None:
    tokenizer = ReferenceTokenizer()
    assert tokenizer.render(first + second) == tokenizer.render(first) + tokenizer.render(second)
    assert render_items(first + second) == tokenizer.render(first + second)
    assert tokenizer.decode(render_items(first)) == "".join(map(item_text, first))


def test_a_missing_package_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes `import tokenizers` fail
    with pytest.raises(ImportError, match=r'pip install "\.\[cli\]" in a clone of ws_mode'):
        ReferenceTokenizer.trained()
