"""A stateless reference Responses server with a scripted, deterministic model.

It serves ``POST /v1/responses`` like OpenAI's HTTP API (JSON or SSE) and is the default handler
of the demo, the benchmark and the tests::

    from ws_mode.reference import ReferenceConfig, create_app

    app = create_app(ReferenceConfig(tool_calls=3, tokens_per_second=1000))
    app.state.reference_stats  # ReferenceStats: requests, bytes_parsed, items_seen
"""

from ws_mode.reference.model import ReferenceConfig, context_digest, script
from ws_mode.reference.server import ReferenceStats, create_app

__all__ = ["ReferenceConfig", "ReferenceStats", "context_digest", "create_app", "script"]
