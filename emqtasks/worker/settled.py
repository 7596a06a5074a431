"""The hooks of a job its master settles: its child died, or was killed at its time limit.

The child that ran the job is gone, so the master fires ``task_retried`` / ``task_dead``
itself, through the same Hooks.fire as a child (a hook that raises is logged; an async one
runs to its end on a fresh loop). Once: only when the master's own fenced write of the
failure landed. A child that settled the job before it died made that write stale, and
fired the hook itself.

The hook gets a JobContext as a child's hook does: id and attempts from the slot, task,
group and fence read from the job's row (one HMGET, only when a hook is registered), the
master's queue; ``job.exception`` is the WorkerLost or TimeLimitExceeded whose text the
master wrote. Neither the arguments nor the original exception are passed: a JobContext
carries no arguments, and the exception object died with the child.

When the master traces (the tasks module installed an SDK), the run gets its ``process``
span here, ERROR, in the job's trace (``traced``): the child's own span died unfinished.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..observe import tracing
from ..producer.context import JobContext, reset_current, set_current
from ..producer.hooks import Hooks
from ..store.queue import Lease, Queue
from ..verdicts import RetryVerdict

log = logging.getLogger("emqtasks.hooks")
_EVENTS = {RetryVerdict.RETRIED: "task_retried", RetryVerdict.DEAD: "task_dead"}


def context(queue: Queue, lease: Lease, exc: BaseException) -> JobContext:
    """The context of a job known only by its slot (id, attempts, nonce): the rest from its
    row. A field the row lacks (a row written by hand) reads as empty."""
    task, group, fence = queue.client.hmget(queue.keys.job(lease.id), "task", "group", "fence")
    full = lease._replace(task=task or "", group=group or "",
                          fence=int(fence) if fence and str(fence).isdigit() else 0)
    ctx = JobContext(full, queue)
    ctx.exception = exc
    return ctx


def traced(queue: Queue, lease: Lease, exc: BaseException, started: float,
           call: Callable[..., Any]) -> tuple[JobContext, tracing.Settling] | None:
    """The context and span of a run the master settles, before it writes the failure (the
    span's traceparent goes on the row); None when the master does not trace. ``started``:
    the run's start, time.monotonic() (the slot's)."""
    if not tracing.recording():
        return None
    try:
        ctx: JobContext = call(context, queue, lease, exc)
        payload, row = call(queue.trace_of, lease.id)
    except Exception:   # the failure is written all the same, untraced
        log.exception("could not read the row of job %s: its run is not traced", lease.id)
        return None
    started_ns = time.time_ns() - int((time.monotonic() - started) * 1e9)
    span = tracing.settling(ctx, payload, row, started_ns)
    return (ctx, span) if span is not None else None


def fire(hooks: Hooks, verdict: RetryVerdict, queue: Queue, lease: Lease,
         exc: BaseException, call: Callable[..., Any], ctx: JobContext | None = None) -> None:
    """Fire the hook of a failure the master wrote (``verdict``), if one is registered;
    ``call`` makes the row's read (the master's outage-aware call) unless ``ctx`` was read
    already (``traced``)."""
    event = _EVENTS.get(verdict)
    if event is None or not hooks.has(event):
        return
    try:
        if ctx is None:
            ctx = call(context, queue, lease, exc)
    except Exception:   # the job is settled already: only its hook is lost
        log.exception("could not read the row of job %s: its %s hook does not fire",
                      lease.id, event)
        return
    assert ctx is not None
    token = set_current(ctx)   # current_job() in the hook, as in a child's
    try:
        hooks.fire(event, ctx)
    finally:
        reset_current(token)
