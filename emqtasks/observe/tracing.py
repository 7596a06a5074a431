"""OpenTelemetry tracing of jobs: a PRODUCER span at enqueue, a CONSUMER span per run.

Optional (``emqtasks[otel]`` brings ``opentelemetry-api``). This module never imports
OpenTelemetry first: it uses it only once the process has (an application that installs
an SDK, or runs under ``opentelemetry-instrument``, has; so does redis-py 8 whenever the
package is installed), so without it a job costs one dict lookup and loads nothing; with
the API and no SDK no span is made (unless a context is current: then the API's no-op one,
which passes it on) and the job carries nothing. The producer's context travels in the
job's argument envelope as a W3C carrier (``"t"``, last, which workers before it ignore).

A retry's run is a new ``process`` span in the same trace, linked to the attempt before:
the retry verb keeps the failed attempt's traceparent on the job's row (``tlink``), which
the next run reads (one HMGET, only a traced run past its first attempt). A run whose child
died or was killed at its time limit gets its span from the master (``settling``), ERROR,
its traceparent kept on the row the same way.

A workflow's steps are in the workflow's trace, each a child of the step that released it:
the worker's ack names the run's span (its traceparent, only when it recorded one) and the
ack verb keeps it on each step it releases (``tparent``); a chord's callback, released by
its last member, keeps the other members' too (``tlinks``) and links to them. A step that
waits for another carries a mark in its envelope's carrier (``RELEASED``), so only its run
reads its row (one HMGET, as a retry's).
"""

from __future__ import annotations

import json
import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..producer.context import JobContext
    from ..store.replies import SpanRow

SYSTEM = "emqtasks"
_TRACER = "emqtasks"
#: The carrier's mark of a workflow step another step releases: its run's parent is on its
#: row (``tparent``), not in the carrier. No propagator reads it.
RELEASED = "emqtasks-released"


def active() -> bool:
    """Whether this process has OpenTelemetry's API (it imported it)."""
    return "opentelemetry.trace" in sys.modules


def _recording() -> bool:
    """Whether a span made now would be more than the API's no-op: an SDK is installed, or
    a context is current to pass on (the API alone makes a 17 us no-op span per call)."""
    api = sys.modules.get("opentelemetry.trace")
    if api is None:
        return False
    if not isinstance(api.get_tracer_provider(), api.ProxyTracerProvider):
        return True
    return bool(api.get_current_span().get_span_context().is_valid)


class _Off:
    """The span of a process that does not trace: does nothing, carries nothing."""

    carrier: dict[str, str] | None = None

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def job(self, job_id: str, group: str) -> None:
        return None

    def set(self, attributes: dict[str, Any]) -> None:
        return None


_OFF = _Off()


class _Send:
    """A PRODUCER span ``send <task>`` around an enqueue, current while it is open; its
    context injected into ``carrier`` for the job's envelope."""

    def __init__(self, task: str, queue: str | None, count: int | None) -> None:
        from opentelemetry import propagate, trace

        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM, "messaging.operation.type": "send",
            "emqtasks.task": task}
        if queue is not None:
            attributes["messaging.destination.name"] = queue
        if count is not None:
            attributes["messaging.batch.message_count"] = count
        self._cm = trace.get_tracer(_TRACER).start_as_current_span(
            f"send {task}", kind=trace.SpanKind.PRODUCER, attributes=attributes)
        self._span = self._cm.__enter__()
        self.carrier: dict[str, str] | None = {}
        propagate.inject(self.carrier)
        if not self.carrier:
            self.carrier = None   # nothing to propagate (no SDK, no context)

    def __enter__(self) -> _Send:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._cm.__exit__(kind, exc, tb)   # records an exception, status ERROR

    def job(self, job_id: str, group: str) -> None:
        """Name the one job this span sent (a batch's span names none)."""
        self._span.set_attribute("messaging.message.id", job_id)
        self._span.set_attribute("emqtasks.group", group)

    def set(self, attributes: dict[str, Any]) -> None:
        """Attributes known once the jobs are built (a workflow's queue, id and size)."""
        self._span.set_attributes(attributes)


def sending(task: str, queue: str | None, count: int | None = None) -> _Send | _Off:
    """The span of an enqueue (``count``: of a batch, ``map()``): a context manager whose
    ``carrier`` goes into each job's envelope (None when there is nothing to carry).
    ``queue`` None: named by ``set`` once known."""
    return _Send(task, queue, count) if _recording() else _OFF


def _process_attributes(ctx: JobContext) -> dict[str, Any]:
    return {"messaging.system": SYSTEM, "messaging.destination.name": ctx.queue,
            "messaging.operation.type": "process", "messaging.message.id": ctx.id,
            "emqtasks.task": ctx.task, "emqtasks.group": ctx.group,
            "emqtasks.attempt": ctx.attempts}


def released(carrier: dict[str, str] | None) -> dict[str, str] | None:
    """The carrier of a workflow step another step releases (the sender's, marked), or None
    when there is nothing to carry."""
    return {**carrier, RELEASED: "1"} if carrier else None


def _span_context(traceparent: str) -> Any:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return trace.get_current_span(
        TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    ).get_span_context()


def _links(row: SpanRow | None) -> list[Any]:
    """The links a row names: the attempt before (the traceparent the retry verb kept), and
    a chord callback's members before the last (the ack verb's)."""
    if row is None:
        return []
    from opentelemetry import trace

    found = (_span_context(t) for t in (row.link, *row.links) if t)
    return [trace.Link(c) for c in found if c.is_valid]


def _parent(carrier: dict[str, str], row: SpanRow | None) -> Any:
    """A run's parent context: its sender's (the carrier), or, a released workflow step,
    the span of the run that released it (in the same trace; the carrier's baggage kept)."""
    from opentelemetry import propagate, trace

    context = propagate.extract(carrier)
    if row is not None and row.parent:
        released_by = _span_context(row.parent)
        if released_by.is_valid:
            context = trace.set_span_in_context(trace.NonRecordingSpan(released_by), context)
    return context


def _row(ctx: JobContext, carrier: dict[str, str]) -> SpanRow | None:
    """The spans the job's row names, read (one HMGET) only for a retry or a released step."""
    if ctx.attempts <= 1 and RELEASED not in carrier:
        return None
    try:
        row: SpanRow = ctx._queue.trace_row(ctx.id)
        return row
    except Exception:   # a span without its parent and links, rather than a failed run
        return None


def _traceparent(span: Any) -> str | None:
    """A recording span's W3C traceparent (what the row keeps for the next attempt)."""
    if not span.is_recording():
        return None
    c = span.get_span_context()
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"


def _mark_failed(span: Any, failure: BaseException) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.record_exception(failure)
    span.set_status(Status(StatusCode.ERROR, f"{type(failure).__name__}: {failure}"[:300]))


class Firing:
    """The PRODUCER span ``send <task>`` of one slot of a schedule: a new root trace per
    firing (the master's park thread has no request to follow), ended only when the slot's
    job was enqueued (a slot another master fired, or overlap skipped, runs nothing)."""

    def __init__(self, task: str, queue: str, schedule: str, slot: int) -> None:
        from opentelemetry import context, propagate, trace

        self._span = trace.get_tracer(_TRACER).start_span(
            f"send {task}", context=context.Context(), kind=trace.SpanKind.PRODUCER,
            attributes={"messaging.system": SYSTEM, "messaging.operation.type": "send",
                        "messaging.destination.name": queue, "emqtasks.task": task,
                        "emqtasks.schedule": schedule, "emqtasks.schedule.slot": slot})
        #: The W3C context the slot's job carries in its envelope.
        self.carrier: dict[str, str] = {}
        propagate.inject(self.carrier, context=trace.set_span_in_context(self._span))

    def end(self, job_id: str, group: str, enqueued: bool) -> None:
        if not enqueued:
            return   # never ended: never exported
        self._span.set_attributes({"messaging.message.id": job_id, "emqtasks.group": group})
        self._span.end()


def firing(task: str, queue: str, schedule: str, slot: int) -> Firing | None:
    """The span of a schedule's slot (a master's), or None when this process does not
    trace."""
    return Firing(task, queue, schedule, slot) if _recording() else None


class _Process:
    """A CONSUMER span ``process <task>`` around one run, child of the sender's span (a
    released workflow step: of the span of the run that released it), linked to the attempt
    before (a retry) and to a chord's other members (its callback)."""

    def __init__(self, ctx: JobContext, payload: str) -> None:
        from opentelemetry import trace

        self._ctx = ctx
        carrier = _carrier(payload)
        row = _row(ctx, carrier)
        self._cm = trace.get_tracer(_TRACER).start_as_current_span(
            f"process {ctx.task}", context=_parent(carrier, row),
            kind=trace.SpanKind.CONSUMER, record_exception=False,
            set_status_on_exception=False, attributes=_process_attributes(ctx),
            links=_links(row))
        self._span = self._cm.__enter__()
        span_context = self._span.get_span_context()
        if span_context.is_valid:   # for the job's log lines and error reports
            ctx._trace_id = f"{span_context.trace_id:032x}"
        # for the ack: the workflow steps it releases are this span's children
        ctx._traceparent = _traceparent(self._span)

    def __enter__(self) -> _Process:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # The runner settles a task's failure itself (nothing propagates): the context
        # says what made the run fail.
        failure = exc if exc is not None else self._ctx.exception
        if failure is not None:
            _mark_failed(self._span, failure)
        self._cm.__exit__(kind, exc, tb)


def processing(ctx: JobContext, payload: str) -> _Process | _Off:
    """The span of one run of a job (``with``), its parent the context its sender put in
    the job's envelope; an exception of the run (or ``ctx.exception``) marks it ERROR."""
    if not active() or not (_recording() or ',"t":{' in payload):
        return _OFF   # nothing to record, and no context of the sender's to pass on
    return _Process(ctx, payload)


class Settling:
    """The ``process`` span of a run the master settles (its child died, or was killed at
    its time limit): begun at the run's start, in the job's trace, ended ERROR only once the
    master's write of the failure landed (a stale one: the child wrote it, and its span)."""

    def __init__(self, ctx: JobContext, payload: str, row: SpanRow | None,
                 started_ns: int) -> None:
        from opentelemetry import trace

        self._ctx = ctx
        self._span = trace.get_tracer(_TRACER).start_span(
            f"process {ctx.task}", context=_parent(_carrier(payload), row),
            kind=trace.SpanKind.CONSUMER, attributes={
                **_process_attributes(ctx), "emqtasks.settled_by": "master"},
            links=_links(row), start_time=started_ns)
        #: What the retry verb keeps on the row, for the next attempt's link.
        self.traceparent = _traceparent(self._span)
        span_context = self._span.get_span_context()
        if span_context.is_valid:
            ctx._trace_id = f"{span_context.trace_id:032x}"

    def end(self, landed: bool) -> None:
        if not landed:
            return   # never ended: never exported
        if self._ctx.exception is not None:
            _mark_failed(self._span, self._ctx.exception)
        self._span.end()


def settling(ctx: JobContext, payload: str, row: SpanRow | None,
             started_ns: int) -> Settling | None:
    """The span of a run the master settles, or None when this process does not trace.
    ``row``: the spans the job's row names (Reads.trace_of)."""
    return Settling(ctx, payload, row, started_ns) if _recording() else None


def recording() -> bool:
    """Whether this process makes spans (an SDK is installed): the master reads a settled
    job's envelope only then."""
    return _recording()


def traceparent() -> str | None:
    """The current span's traceparent if it records (a run failing now: the retry verb keeps
    it for the next attempt's link), else None."""
    if not active():
        return None
    from opentelemetry import trace

    return _traceparent(trace.get_current_span())


def span_of(ctx: JobContext | None) -> str | None:
    """The traceparent of a run's span, if it recorded one: what its ack sends (None: the
    ack sends nothing more)."""
    return ctx._traceparent if ctx is not None else None


def trace_id() -> str | None:
    """The current span's trace id (32 hex digits) if one is current, else None."""
    if not active():
        return None
    from opentelemetry import trace

    c = trace.get_current_span().get_span_context()
    return f"{c.trace_id:032x}" if c.is_valid else None


def _carrier(payload: str) -> dict[str, str]:
    try:
        env = json.loads(payload)
    except (TypeError, ValueError, RecursionError):
        return {}
    carrier = env.get("t") if isinstance(env, dict) else None
    if not isinstance(carrier, dict):
        return {}
    return {k: v for k, v in carrier.items() if isinstance(k, str) and isinstance(v, str)}


def flush(timeout_ms: int = 5000) -> None:
    """Flush the application's tracer provider, if it has one that can: a worker's child
    ends by ``os._exit`` and runs no atexit hook."""
    if not active():
        return
    from opentelemetry import trace

    force_flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if force_flush is not None:
        try:
            force_flush(timeout_ms)
        except Exception:   # an exporter's failure must not keep the child from exiting
            pass
