"""A reference Responses server with a scripted, deterministic model and a real tokenizer.

It serves ``POST /v1/responses`` like OpenAI's HTTP API (JSON or SSE; response objects with
every field the Open Responses schema requires; ``context_management`` compaction) and
``POST /v1/responses/compact``, and is the default handler of the demo, the benchmark and the
tests::

    from . import ReferenceConfig, create_app, render_items

    app = create_app(ReferenceConfig(tool_calls=3, tokens_per_second=1000))
    app.state.reference_stats  # ReferenceStats: requests, bytes_parsed, items_seen, ...

Over plain HTTP it re-does the work on the whole history every turn, like any stateless server.
Behind ``WebSocketModeMiddleware(app, full_context="on_miss", renderer=render_items)`` it resumes
each continuation from its parent's artifacts and works on the new items only; the answers are
the same. Needs the ``tokenizers`` package (the ``cli`` extra: ``pip install ".[cli]"`` in a
clone of ws_mode).
"""

from .model import ReferenceConfig, context_digest, fold_items, script
from .server import create_app
from .stats import ReferenceStats
from .tokenizer import ReferenceTokenizer, render_items

__all__ = [
    "ReferenceConfig",
    "ReferenceStats",
    "ReferenceTokenizer",
    "context_digest",
    "create_app",
    "fold_items",
    "render_items",
    "script",
]
