"""Tasks of tests/test_tracing.py. Like an application's tasks module, it installs the
worker's tracer provider: a SimpleSpanProcessor exporting each span as a JSON line to the
file EMQ_TEST_SPANS names."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from emqtasks import current_job, task

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "support"))
from spanfile import JsonLinesExporter

provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(os.environ["EMQ_TEST_SPANS"])))
trace.set_tracer_provider(provider)


@task(name="t.otel.add")
def add(a: int, b: int) -> int:
    return a + b


@task(name="t.otel.second_time", retry_delay=0.01, max_attempts=3)
def second_time() -> int:
    if current_job().attempts == 1:
        raise ValueError("not the first time")
    return current_job().attempts


@task(name="t.otel.total")
def total(values: list[int]) -> int:
    return sum(values)


@task(name="t.otel.dies_once", retry_delay=0.01, max_attempts=3)
def dies_once() -> int:
    """Its child dies on the first attempt: the master settles it (WorkerLost)."""
    if current_job().attempts == 1:
        os._exit(1)
    return current_job().attempts


@task(name="t.otel.says")
def says(word: str) -> str:
    logging.getLogger("app.tasks").warning("saying %s", word)
    return word


@task(name="t.otel.ignores_its_limit", retry_delay=0.01, max_attempts=3, time_limit=0.2)
def ignores_its_limit() -> int:
    """Its first attempt runs past its time limit with SIGTERM blocked: only the master's
    SIGKILL ends it (TimeLimitExceeded, settled by the master)."""
    if current_job().attempts == 1:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        time.sleep(30)
    return current_job().attempts
