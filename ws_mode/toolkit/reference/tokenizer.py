"""A real, offline tokenizer for the reference server: a small byte-level BPE, and a chat
template that renders Responses API items to token ids.

The BPE is trained at first use from a fixed built-in corpus (a few milliseconds with the
``tokenizers`` package) and shared by the whole process. Training is deterministic, so every
process gets the same ids.

Rendering is item by item: ``render(a + b) == render(a) + render(b)``. That makes it usable as
the middleware's ``renderer=`` (each turn's new items are rendered once and appended to the
tokens of the prefix) with exactly the ids a full re-render of the history gives.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from ws_mode._install import install_hint

from ._corpus import CORPUS
from ._json import canonical_json

if TYPE_CHECKING:
    import tokenizers

__all__ = [
    "END",
    "START",
    "VOCAB_SIZE",
    "ReferenceTokenizer",
    "default_tokenizer",
    "item_text",
    "render_items",
]

START: Final = "<|im_start|>"
"""Opens an item; followed by its role or type marker and a newline."""
END: Final = "<|im_end|>"
"""Closes an item; followed by a newline."""
VOCAB_SIZE: Final = 3072
"""The vocabulary the trainer aims for; the corpus yields a little over 2,000 tokens."""

_INSTALL_HINT: Final = (
    f'The reference tokenizer needs the "tokenizers" package: {install_hint("cli")}'
)


def _train() -> tokenizers.Tokenizer:
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[START, END],
    )
    tokenizer.train_from_iterator(list(CORPUS), trainer=trainer)
    return tokenizer


_shared: tokenizers.Tokenizer | None = None
_shared_lock = threading.Lock()


def _shared_tokenizer() -> tokenizers.Tokenizer:
    global _shared
    if _shared is None:
        with _shared_lock:
            if _shared is None:
                _shared = _train()
    return _shared


def _text(value: Any) -> str:
    return value if isinstance(value, str) else canonical_json(value).decode()


def _content_text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(
            part["text"]
            if isinstance(part, dict) and isinstance(part.get("text"), str)
            else _text(part)
            for part in content
        )
    return _text(content)


def item_text(item: dict[str, Any]) -> str:
    """The chat-template text of one item.

    A message (``type`` ``"message"``, or no type and a ``role``) is its role then its text
    (a string content, or its content parts' ``text``, one per line); a ``function_call`` is its
    name then its arguments; a ``function_call_output`` its output; a ``compaction`` item its
    id; any other item its type then its canonical JSON. Each is wrapped as
    ``<|im_start|>marker\\n...<|im_end|>\\n``.
    """
    kind = item.get("type")
    if kind == "message" or (kind is None and "role" in item):
        marker, body = _text(item.get("role")), _content_text(item.get("content"))
    elif kind == "function_call":
        marker = f"function_call {_text(item.get('name'))}"
        body = _text(item.get("arguments"))
    elif kind == "function_call_output":
        marker, body = "function_call_output", _text(item.get("output"))
    elif kind == "compaction":
        # What it stands for is opaque: it costs the same few tokens whatever it replaced.
        marker, body = "compaction", _text(item.get("id"))
    else:
        marker, body = _text(kind), canonical_json(item).decode()
    return f"{START}{marker}\n{body}{END}\n"


class ReferenceTokenizer:
    """The reference BPE and chat template.

    ``ReferenceTokenizer()`` shares the process-wide model, trained on first use;
    :meth:`trained` trains a separate one (the same ids: training is deterministic).
    Raises :class:`ImportError` when the ``tokenizers`` package is missing.
    """

    __slots__ = ("_tokenizer",)

    def __init__(self) -> None:
        self._tokenizer = _shared_tokenizer()

    @classmethod
    def trained(cls) -> ReferenceTokenizer:
        """A tokenizer trained now from the built-in corpus, not the shared one."""
        fresh = cls.__new__(cls)
        fresh._tokenizer = _train()
        return fresh

    @property
    def vocab_size(self) -> int:
        """The number of token ids, special tokens included."""
        return int(self._tokenizer.get_vocab_size())

    def to_json(self) -> str:
        """The whole model (vocabulary, merges, configuration) as JSON."""
        return str(self._tokenizer.to_str())

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text``."""
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def token_ends(self, text: str) -> list[int]:
        """For each token of ``text``, the index just past its last character."""
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        return [end for _start, end in encoding.offsets]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids`` (special tokens included)."""
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=False))

    def render(self, items: Iterable[dict[str, Any]]) -> list[int]:
        """The chat-template token ids of ``items``, rendered one item at a time."""
        encode = self._tokenizer.encode
        ids: list[int] = []
        for item in items:
            ids += encode(item_text(item), add_special_tokens=False).ids
        return ids


_default: ReferenceTokenizer | None = None


def default_tokenizer() -> ReferenceTokenizer:
    """The process-wide :class:`ReferenceTokenizer`."""
    global _default
    if _default is None:
        _default = ReferenceTokenizer()
    return _default


def render_items(items: list[dict[str, Any]]) -> list[int]:
    """Render items with the process-wide tokenizer; a ``ws_mode.Renderer`` for the
    middleware's ``renderer=``."""
    return default_tokenizer().render(items)
