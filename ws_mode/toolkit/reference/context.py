"""What the reference model needs of a request's context, computed in one of two ways.

The model's answer depends on the context only through three numbers: its folded digest state
(:func:`~ws_mode.toolkit.reference.model.fold_items`), the tool calls since the last user message,
and (for ``usage`` and compaction) its rendered token count. All three can be extended item by item,
and a compaction item resets them (:mod:`ws_mode.toolkit.reference.compaction`: the context is read
from the latest one on), so:

- :func:`stateless` computes them from the whole context, the way a stateless server must on
  every request: render every item, fold every item, scan back for the last user message.
- :func:`resume` continues them from what the parent response left on its
  :attr:`ws_mode.Turn.artifacts` (:func:`save`), looking only at the new items; with a
  middleware renderer it takes the token count from the Turn and renders nothing at all.

Both give the same values for the same context; ``resume`` returns None when there is nothing to
resume from, and the caller falls back to ``stateless``. Both refuse a ``function_call_output``
that answers no call of the context (:mod:`ws_mode.toolkit.reference.calls`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeGuard

from .calls import chain_lookup, check_outputs
from .compaction import EMPTY, Folded, advance
from .model import Function, context_function
from .tokenizer import ReferenceTokenizer

if TYPE_CHECKING:
    from ws_mode._cache import CachedResponse
    from ws_mode._turn import Turn

__all__ = ["ARTIFACT_KEY", "Context", "Saved", "resume", "save", "stateless"]

ARTIFACT_KEY: Final = "ws_mode.toolkit.reference"
"""The key of :class:`Saved` (as a plain JSON-able dict) in a Turn's artifacts."""
_FORMAT: Final = 3  # bumped whenever what is saved, or how it is computed, changes


@dataclass(frozen=True, slots=True)
class Saved:
    """What one response leaves for the turn that continues it: the values of :class:`Context`
    for its whole context followed by its output.

    ``tokens`` is None when the middleware renders (the next Turn carries the tokens), unless
    the context was compacted (``compacted``: it starts at a compaction item, and the Turn's
    tokens cover what came before too). ``open_calls`` are the calls no output answers yet.
    ``instructions`` and ``instruction_tokens`` spare re-encoding unchanged instructions.
    ``declared`` is the first function the context's ``additional_tools`` items declare.
    It is kept in the artifacts as a plain JSON-able dict, so a store that serializes
    artifacts keeps it too; anything unexpected there reads as nothing saved.
    """

    digest_state: bytes
    tool_calls: int
    tokens: int | None
    instructions: str | None
    instruction_tokens: int
    open_calls: tuple[str, ...] = ()
    compacted: bool = False
    declared: Function | None = None

    @property
    def folded(self) -> Folded:
        """The values the model needs, to continue from."""
        return Folded(self.digest_state, self.tool_calls, self.open_calls)

    def to_artifact(self) -> dict[str, Any]:
        """The plain dict kept under :data:`ARTIFACT_KEY`."""
        return {
            "format": _FORMAT,
            "digest_state": self.digest_state.hex(),
            "tool_calls": self.tool_calls,
            "tokens": self.tokens,
            "instructions": self.instructions,
            "instruction_tokens": self.instruction_tokens,
            "open_calls": list(self.open_calls),
            "compacted": self.compacted,
            "declared": list(self.declared) if self.declared is not None else None,
        }

    @classmethod
    def from_artifact(cls, value: object) -> Saved | None:
        """Read back :meth:`to_artifact`'s dict; None for anything else."""
        if not isinstance(value, dict) or value.get("format") != _FORMAT:
            return None
        state, calls, tokens = (
            value.get("digest_state"),
            value.get("tool_calls"),
            value.get("tokens"),
        )
        instructions, instruction_tokens = (
            value.get("instructions"),
            value.get("instruction_tokens"),
        )
        pending, compacted = value.get("open_calls"), value.get("compacted")
        declared = _function(value.get("declared"))
        if not (
            isinstance(state, str)
            and _is_count(calls)
            and (tokens is None or _is_count(tokens))
            and (instructions is None or isinstance(instructions, str))
            and _is_count(instruction_tokens)
            and isinstance(pending, list)
            and all(isinstance(call_id, str) for call_id in pending)
            and isinstance(compacted, bool)
            and (tokens is not None or not compacted)
            and (declared is not None or value.get("declared") is None)
        ):
            return None
        try:
            digest_state = bytes.fromhex(state)
        except ValueError:
            return None
        return cls(
            digest_state,
            calls,
            tokens,
            instructions,
            instruction_tokens,
            tuple(pending),
            compacted,
            declared,
        )


def _function(value: object) -> Function | None:
    """A saved :data:`~ws_mode.toolkit.reference.model.Function` (``[name, namespace]``)."""
    if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str):
        namespace = value[1]
        if namespace is None or isinstance(namespace, str):
            return value[0], namespace
    return None


def _is_count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True, slots=True)
class Context:
    """A request's context as the model needs it, and what computing it cost.

    ``tokens`` counts the rendered context items (from the latest compaction item on, when
    ``compacted``); ``instruction_tokens`` the ``instructions``; ``open_calls`` the calls no
    output answers yet; ``declared`` the first function its ``additional_tools`` items
    declare. ``items_seen`` and ``tokens_rendered`` are the work done: items looked at, tokens
    rendered.
    """

    digest_state: bytes
    tool_calls: int
    tokens: int
    instructions: str | None
    instruction_tokens: int
    items_seen: int
    tokens_rendered: int
    resumed: bool
    open_calls: tuple[str, ...] = ()
    compacted: bool = False
    declared: Function | None = None

    @property
    def input_tokens(self) -> int:
        """``usage.input_tokens``: the context's tokens plus the instructions'."""
        return self.tokens + self.instruction_tokens

    @property
    def folded(self) -> Folded:
        """The values the model needs (what a compaction item of this context stands for)."""
        return Folded(self.digest_state, self.tool_calls, self.open_calls)


def stateless(
    context: list[dict[str, Any]], instructions: str | None, tokenizer: ReferenceTokenizer
) -> Context:
    """Everything from the whole context: check the tool outputs, then render, fold and scan
    every item from the latest compaction item on."""
    check_outputs(context)
    folded, at = advance(EMPTY, context)
    rendered = len(tokenizer.render(context if at is None else context[at:]))
    instruction_tokens = len(tokenizer.encode(instructions)) if instructions else 0
    return Context(
        digest_state=folded.digest_state,
        tool_calls=folded.tool_calls,
        tokens=rendered,
        instructions=instructions,
        instruction_tokens=instruction_tokens,
        items_seen=len(context),
        tokens_rendered=rendered + instruction_tokens,
        resumed=False,
        open_calls=folded.open_calls,
        compacted=at is not None,
        declared=context_function(context),
    )


def _nearest_saved(
    previous: CachedResponse,
) -> tuple[Saved, list[dict[str, Any]]] | tuple[None, None]:
    """The nearest :class:`Saved` up the parent chain and the items of the responses after it.

    A ``generate: false`` warm-up leaves no artifacts (the handler never ran): its items are
    taken from the cache. None when no response of the chain saved anything.
    """
    skipped: list[CachedResponse] = []
    node: CachedResponse | None = previous
    while node is not None:
        saved = Saved.from_artifact(node.artifacts.get(ARTIFACT_KEY))
        if saved is not None:
            items = [
                item
                for after in reversed(skipped)
                for item in (*after.input_items, *after.output_items)
            ]
            return saved, items
        skipped.append(node)
        node = node.parent
    return None, None


def resume(turn: Turn, instructions: str | None, tokenizer: ReferenceTokenizer) -> Context | None:
    """Continue the parent's saved values over the new items only; None when the parent chain
    saved nothing to continue from (or saved no token count and there is no renderer).

    The new items' tool outputs are checked against the calls the parent left open, and only
    for another id against the whole cached chain."""
    if turn.previous is None:
        return None
    saved, items = _nearest_saved(turn.previous)
    if saved is None or items is None:
        return None
    items.extend(turn.new_input)
    check_outputs(items, saved.open_calls, chain_lookup(turn.previous))
    folded, at = advance(saved.folded, items)
    rendered = 0
    if at is not None:
        # A new compaction item: the context starts there.
        rendered = tokens = len(tokenizer.render(items[at:]))
    elif turn.prefix_tokens is not None and turn.new_tokens is not None and not saved.compacted:
        # The middleware rendered the prefix once, and the new input on arrival.
        tokens = len(turn.prefix_tokens) + len(turn.new_tokens)
    elif saved.tokens is not None:
        rendered = len(tokenizer.render(items))
        tokens = saved.tokens + rendered
    else:
        return None
    if instructions == saved.instructions:
        # Keep the saved string: a chain holds its instructions once.
        instructions, instruction_tokens = saved.instructions, saved.instruction_tokens
    else:
        instruction_tokens = len(tokenizer.encode(instructions)) if instructions else 0
        rendered += instruction_tokens
    return Context(
        digest_state=folded.digest_state,
        tool_calls=folded.tool_calls,
        tokens=tokens,
        instructions=instructions,
        instruction_tokens=instruction_tokens,
        items_seen=len(items),
        tokens_rendered=rendered,
        resumed=True,
        open_calls=folded.open_calls,
        compacted=saved.compacted or at is not None,
        declared=context_function(items, saved.declared),
    )


def save(
    turn: Turn, context: Context, output: list[dict[str, Any]], tokenizer: ReferenceTokenizer
) -> int:
    """Leave the values after ``output`` on ``turn.artifacts`` for the next turn; return the
    tokens rendered to do it (the output's, unless the middleware renders and nothing was
    compacted)."""
    folded, at = advance(context.folded, output)
    compacted = context.compacted or at is not None
    rendered = 0
    tokens: int | None = None
    if turn.new_tokens is None or compacted:
        rendered = len(tokenizer.render(output if at is None else output[at:]))
        tokens = rendered if at is not None else context.tokens + rendered
    turn.artifacts[ARTIFACT_KEY] = Saved(
        digest_state=folded.digest_state,
        tool_calls=folded.tool_calls,
        tokens=tokens,
        instructions=context.instructions,
        instruction_tokens=context.instruction_tokens,
        open_calls=folded.open_calls,
        compacted=compacted,
        declared=context_function(output, context.declared),
    ).to_artifact()
    return rendered
