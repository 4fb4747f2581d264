"""``POST /v1/responses/compact`` in the reference server: a context compacted into the user
messages of the input and one compaction item (:mod:`ws_mode.toolkit.reference.compaction`),
answered as OpenAI's ``response.compaction`` object.

The answer used as ``input`` of a new response, without ``previous_response_id``, starts a new
chain whose context the model reads exactly as the context that was compacted. The server
keeps nothing: a ``previous_response_id`` it cannot resolve (it never can over plain HTTP) is
``previous_response_not_found``.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from . import context as _context
from .compaction import compacted_output
from .model import output_tokens
from .request import RequestError, parse
from .response import usage
from .stats import ReferenceStats
from .tokenizer import ReferenceTokenizer

__all__ = ["compact"]


def compact(raw: bytes, stats: ReferenceStats, tokenizer: ReferenceTokenizer) -> dict[str, Any]:
    """The ``response.compaction`` object for a compact request body; raises
    :class:`RequestError` for one OpenAI refuses (no ``model``, bad items, an unknown
    ``previous_response_id``)."""
    stats.bytes_parsed += len(raw)
    parsed = parse(raw)
    if parsed.body.get("model") is None:
        raise RequestError(
            "Missing required parameter: 'model'.",
            code="missing_required_parameter",
            param="model",
        )
    if parsed.previous_response_id is not None:
        raise RequestError(
            f"Previous response with id '{parsed.previous_response_id}' not found.",
            code="previous_response_not_found",
            param="previous_response_id",
        )
    context = _context.stateless(parsed.input, parsed.instructions, tokenizer)
    stats.items_seen += context.items_seen
    stats.tokens_rendered += context.tokens_rendered
    output = compacted_output(parsed.input, context.folded)
    return {
        "id": f"resp_{secrets.token_hex(16)}",
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": output,
        "usage": usage(context.input_tokens, output_tokens(output[-1])),
    }
