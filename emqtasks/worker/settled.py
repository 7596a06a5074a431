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
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

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


def fire(hooks: Hooks, verdict: RetryVerdict, queue: Queue, lease: Lease,
         exc: BaseException, call: Callable[..., Any]) -> None:
    """Fire the hook of a failure the master wrote (``verdict``), if one is registered;
    ``call`` makes the row's read (the master's outage-aware call)."""
    event = _EVENTS.get(verdict)
    if event is None or not hooks.has(event):
        return
    try:
        ctx: JobContext = call(context, queue, lease, exc)
    except Exception:   # the job is settled already: only its hook is lost
        log.exception("could not read the row of job %s: its %s hook does not fire",
                      lease.id, event)
        return
    token = set_current(ctx)   # current_job() in the hook, as in a child's
    try:
        hooks.fire(event, ctx)
    finally:
        reset_current(token)
