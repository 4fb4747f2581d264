"""Recipe (a), `examples/cache_aware_tokens.py`: a handler that renders a chat template and
tokenizes. Over the socket it answers exactly as over plain HTTP with the whole history, while
every item is rendered once instead of once per later turn."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

import pytest

from examples.cache_aware_tokens import GENERATE, create_app
from tests.servers import serve
from ws_mode.toolkit.reference import ReferenceTokenizer
from ws_mode.toolkit.rollout import run_http, run_socket

TURNS = 4
FOLLOW_UPS = ["What does it return?", "And on an error?", "Thanks, one more thing."]
OPTIONS = {"turns": TURNS, "follow_ups": FOLLOW_UPS, "tools": None, "timeout": 10.0}


class CountingTokenizer:
    """The stand-in tokenizer, counting how often each text is tokenized."""

    def __init__(self) -> None:
        self.encode = ReferenceTokenizer().encode
        self.lock = threading.Lock()
        self.texts: Counter[str] = Counter()

    def __call__(self, text: str) -> list[int]:
        with self.lock:
            self.texts[text] += 1
        return self.encode(text)

    def items_rendered(self) -> Counter[str]:
        """The item texts tokenized since the last call (not the system or generation prompt),
        with how often each was."""
        with self.lock:
            counted, self.texts = self.texts, Counter()
        return Counter(
            {
                text: count
                for text, count in counted.items()
                if text != GENERATE and not text.startswith("<|im_start|>system")
            }
        )


@pytest.fixture(scope="module")
def app() -> Iterator[tuple[str, CountingTokenizer]]:
    tokenizer = CountingTokenizer()
    with serve(create_app(tokenizer), lifetime=60) as base_url:
        yield base_url, tokenizer


def test_each_item_rendered_once_and_the_answers_equal_http(
    app: tuple[str, CountingTokenizer],
) -> None:
    base_url, tokenizer = app
    http = run_http(base_url, **OPTIONS)  # type: ignore[arg-type]
    over_http = tokenizer.items_rendered()
    socket = run_socket(base_url, **OPTIONS)  # type: ignore[arg-type]
    over_socket = tokenizer.items_rendered()

    # The answer checksums every prompt token, earlier answers included: equal answers mean
    # equal prompts on every turn.
    assert socket.answer == http.answer
    assert socket.answer.startswith("I read ")
    assert socket.turns == http.turns == TURNS
    # HTTP renders the whole history each turn: 1 + 3 + 5 + 7 items over 4 turns.
    assert sum(over_http.values()) == sum(range(1, 2 * TURNS, 2))
    assert max(over_http.values()) == TURNS  # the first question, once per turn
    # The socket renders each item once: 4 inputs and the first 3 answers (the last answer
    # is rendered after its response went out, for a turn that never comes).
    assert set(over_socket.values()) == {1}
    assert 2 * TURNS - 1 <= len(over_socket) <= 2 * TURNS
    last_answer = f"<|im_start|>assistant\n{socket.answer}<|im_end|>\n"
    assert set(over_socket) - set(over_http) <= {last_answer}


def test_plain_http_refuses_previous_response_id(app: tuple[str, CountingTokenizer]) -> None:
    import httpx

    base_url, _ = app
    body = {"model": "m", "input": "Hi", "previous_response_id": "resp_1"}
    reply = httpx.post(base_url + "/v1/responses", json=body, timeout=10)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "previous_response_id"
