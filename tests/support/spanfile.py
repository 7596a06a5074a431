"""A span exporter that appends each finished span as one JSON line to a file: what a
worker's child exports, for the test process to read (tests/test_tracing.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


def as_record(span: ReadableSpan) -> dict[str, Any]:
    """The fields of a span the test asserts on, ids as hex."""
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "name": span.name, "kind": span.kind.name,
        "trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "error": span.status.description,
        "events": [e.name for e in span.events],
        "links": [f"{link.context.span_id:016x}" for link in span.links],
    }


class JsonLinesExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.path.open("a") as out:
            for span in spans:
                out.write(json.dumps(as_record(span)) + "\n")
        return SpanExportResult.SUCCESS


def read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]
