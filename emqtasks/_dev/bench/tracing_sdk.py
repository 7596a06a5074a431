"""The worker's tracer provider of ``emqtasks bench --tracing``'s sdk runs: the SDK with a
BatchSpanProcessor exporting to an in-memory exporter (what a span costs the worker, no
network). Imported by the worker beside the bench tasks, as an application's tasks module
would set its provider."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(exporter))
trace.set_tracer_provider(provider)
