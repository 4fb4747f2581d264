"""The reference server behind the middleware, its spans going through a `BatchSpanProcessor`
that would hold them for ten minutes to a file exporter (`SPAN_FILE`, a span name a line): what
reaches the file was exported by a flush. For `tests/library/test_tracing_flush.py`."""

from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from ws_mode import WebSocketModeMiddleware
from ws_mode.toolkit.reference import create_app


class FileExporter(SpanExporter):
    """Appends each exported span's name to a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a") as file:
            file.writelines(span.name + "\n" for span in spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


provider = TracerProvider()
provider.add_span_processor(
    BatchSpanProcessor(FileExporter(os.environ["SPAN_FILE"]), schedule_delay_millis=600_000)
)
app = WebSocketModeMiddleware(create_app(), tracer_provider=provider)
