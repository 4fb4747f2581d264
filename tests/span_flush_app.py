"""The reference server behind the middleware, its spans going through a `BatchSpanProcessor`
that would hold them for ten minutes to a file exporter (`SPAN_FILE`, a span name a line): what
reaches the file was exported by a flush. For `tests/library/test_tracing_flush.py`."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from ws_mode import WebSocketModeMiddleware
from ws_mode.toolkit.reference import create_app


class FileExporter(SpanExporter):
    """Appends each exported span's name to a file; with `SPAN_EXPORT_HANGS` set, never
    returns from an export instead (a collector that does not answer; a `StuckProcessor` is
    added then too)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if os.environ.get("SPAN_EXPORT_HANGS"):
            threading.Event().wait()
        with open(self.path, "a") as file:
            file.writelines(span.name + "\n" for span in spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


class StuckProcessor(SpanProcessor):
    """A span processor whose flush never returns, whatever timeout it is given."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        threading.Event().wait()
        return True


provider = TracerProvider()
provider.add_span_processor(
    BatchSpanProcessor(FileExporter(os.environ["SPAN_FILE"]), schedule_delay_millis=600_000)
)
if os.environ.get("SPAN_EXPORT_HANGS"):
    provider.add_span_processor(StuckProcessor())
app = WebSocketModeMiddleware(create_app(), tracer_provider=provider)
