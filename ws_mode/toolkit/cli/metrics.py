"""``--metrics PATH`` of ``ws-mode serve`` and ``ws-mode proxy``: the Prometheus metrics of the
served middleware at ``PATH``, on the API's port (:func:`ws_mode.prometheus.with_metrics`).

Needs ``prometheus-client`` (the ``prometheus`` extra), imported only when the flag is given.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable

from ws_mode._asgi import ASGIApp

from .common import API_PATH

__all__ = ["add_metrics_argument", "metrics_banner", "metrics_path", "serve_metrics"]


def metrics_path(text: str) -> str:
    """A ``--metrics`` value checked: a path of its own (not the API's), with
    prometheus-client installed."""
    if not text.startswith("/") or "?" in text or "#" in text:
        raise argparse.ArgumentTypeError(f"expected a path such as /metrics, got {text!r}")
    if text.rstrip("/") == API_PATH or text.startswith(API_PATH + "/"):
        raise argparse.ArgumentTypeError(f"{text!r} is the API's own path; use /metrics")
    if importlib.util.find_spec("prometheus_client") is None:
        raise argparse.ArgumentTypeError(
            "metrics need prometheus-client (the prometheus extra): pip install prometheus-client"
        )
    return text


def add_metrics_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--metrics PATH``."""
    parser.add_argument(
        "--metrics",
        type=metrics_path,
        default=None,
        metavar="PATH",
        help="serve Prometheus metrics (connections, turns, the cache, the store, errors, "
        "latency, the memory budget) at this path on the API's port, e.g. /metrics; needs "
        "prometheus-client (default: none)",
    )


def serve_metrics(app: ASGIApp, path: str | None) -> ASGIApp:
    """``app`` with the metrics answering HTTP requests to ``path`` (``app`` itself when
    ``path`` is None)."""
    if path is None:
        return app
    from ws_mode.prometheus import with_metrics

    return with_metrics(app, path)


def metrics_banner(banner: Callable[[str], str], path: str | None) -> Callable[[str], str]:
    """``banner`` with where the metrics are, when they are served."""
    if path is None:
        return banner
    return lambda origin: f"{banner(origin)}; Prometheus metrics at http://{origin}{path}"
