"""Tool outputs checked against the calls they answer, as OpenAI checks them: a
``function_call_output`` whose ``call_id`` matches no ``function_call`` of the context is a 400
(``No tool call found for function call output with call_id ...``, param ``input``, code null).

Over plain HTTP (or with the whole history in ``input``) the check covers the items in order;
a cache-aware continuation checks its new items against the calls its parent left unanswered
and, for anything else, looks back along the cached chain (:func:`chain_lookup`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .compaction import COMPACTION, decode
from .request import RequestError

if TYPE_CHECKING:
    from ws_mode._cache import CachedResponse

__all__ = ["chain_lookup", "check_outputs", "missing_call"]


def missing_call(call_id: str) -> RequestError:
    """OpenAI's answer to an output for a call the context does not hold."""
    return RequestError(
        f"No tool call found for function call output with call_id {call_id}.",
        code=None,
        param="input",
    )


def check_outputs(
    items: Sequence[dict[str, Any]],
    known: Iterable[str] = (),
    lookup: Callable[[str], bool] | None = None,
) -> None:
    """Raise :class:`RequestError` for the first ``function_call_output`` of ``items`` whose
    call is neither among ``known``, nor an earlier ``function_call`` of ``items``, nor one a
    compaction item of ``items`` left unanswered, nor found by ``lookup``."""
    seen = set(known)
    for index, item in enumerate(items):
        kind = item.get("type")
        if kind == "function_call":
            call_id = item.get("call_id")
            if isinstance(call_id, str):
                seen.add(call_id)
        elif kind == COMPACTION:
            seen.update(decode(item, index).open_calls)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise RequestError(
                    f"Missing required parameter: 'input[{index}].call_id'.",
                    code="missing_required_parameter",
                    param=f"input[{index}].call_id",
                )
            if call_id not in seen and not (lookup is not None and lookup(call_id)):
                raise missing_call(call_id)


def chain_lookup(previous: CachedResponse) -> Callable[[str], bool]:
    """Whether a call id is made (or left unanswered by a compaction item) anywhere in the
    context of ``previous``: the slow path, walked only for an id the fast one missed."""

    def lookup(call_id: str) -> bool:
        node: CachedResponse | None = previous
        while node is not None:
            for items in (node.output_items, node.input_items):
                for index, item in enumerate(items):
                    kind = item.get("type")
                    if kind == "function_call" and item.get("call_id") == call_id:
                        return True
                    if kind == COMPACTION and call_id in decode(item, index).open_calls:
                        return True
            node = node.parent
        return False

    return lookup
