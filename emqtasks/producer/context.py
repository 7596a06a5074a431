"""The job's own context: ``current_job()`` inside a task, and the log fields of a job.

A worker sets the context for the length of each job (a ``ContextVar``, so every async job
on a child's event loop sees its own). The context names the job and carries its ``fence``:
an integer that grows with every claim of the job and never goes back, for guarding writes
to other systems (store it with the write, refuse a write that brings a smaller one).
"""

from __future__ import annotations

import logging
import time
from contextvars import ContextVar
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..errors import NoCurrentJob

if TYPE_CHECKING:
    from ..store.queue import Lease, Queue

_CURRENT: ContextVar[JobContext | None] = ContextVar("emqtasks_job", default=None)


class JobContext:
    """One claim of one job, as the task running it sees it."""

    __slots__ = ("id", "task", "queue", "group", "attempts", "fence", "exception", "args",
                 "kwargs", "give_up", "result", "aborted", "_lease", "_queue", "_row",
                 "_started",
                 "_trace_id", "_traceparent")

    def __init__(self, lease: Lease, queue: Queue) -> None:
        self.id: str = lease.id
        self.task: str = lease.task
        self.queue: str = queue.name
        self.group: str = lease.group
        self.attempts: int = lease.attempts
        self.fence: int = lease.fence
        #: What made the job fail, in the task_retried / task_dead hooks (else None).
        self.exception: BaseException | None = None
        #: What the task returned, in the task_succeeded hooks (else None).
        self.result: Any = None
        #: The call's arguments, once decoded (``Task.request.args`` / ``.kwargs``).
        self.args: tuple[Any, ...] = ()
        self.kwargs: dict[str, Any] = {}
        #: Set by ``Task.retry()`` past max_retries: this attempt's failure is final (dead
        #: at once, whatever the retry policy says of the exception re-raised).
        self.give_up = False
        #: True once this attempt was aborted (``App.abort``): a long loop that checks it
        #: can stop cleanly. The job ends ``aborted`` whatever the task returns then.
        self.aborted = False
        self._lease = lease
        self._queue = queue
        self._row: tuple[int, datetime | None] | None = None
        #: When this run began (time.monotonic): the duration its outcome log line gives.
        self._started = time.monotonic()
        #: The trace this run is in (32 hex digits; observe/tracing.py sets it), else None.
        self._trace_id: str | None = None
        #: This run's span (a W3C traceparent) if it records one: its ack sends it, for the
        #: workflow steps the ack releases (observe/tracing.py).
        self._traceparent: str | None = None

    def _read_row(self) -> tuple[int, datetime | None]:
        if self._row is None:
            max_attempts, created = self._queue.client.hmget(
                self._queue.keys.job(self.id), "max", "created")
            when = (datetime.fromtimestamp(int(created) / 1000, timezone.utc)
                    if created else None)
            self._row = (int(max_attempts or 0), when)
        return self._row

    @property
    def max_attempts(self) -> int:
        """The job's attempts budget (read from its row on first use)."""
        return self._read_row()[0]

    @property
    def enqueued_at(self) -> datetime | None:
        """When the job was enqueued, server clock, UTC (read from its row on first use)."""
        return self._read_row()[1]

    def still_holds(self) -> bool:
        """Whether this claim is still the job's current one: one read of the row (state,
        attempts, nonce). False once the lease was lost and the job claimed again (or the
        job ended): a write made now could race the new holder's."""
        return self._queue.holds(self._lease)

    def __repr__(self) -> str:
        return (f"<JobContext {self.task} {self.id} queue={self.queue} group={self.group!r} "
                f"attempts={self.attempts} fence={self.fence}>")


def current_job() -> JobContext:
    """The context of the job this code runs in; NoCurrentJob outside a worker's task."""
    ctx = _CURRENT.get()
    if ctx is None:
        raise NoCurrentJob("current_job() is only available inside a task run by a worker")
    return ctx


def current_or_none() -> JobContext | None:
    """The current job's context, or None outside a job (for log filters: no exception)."""
    return _CURRENT.get()


def set_current(ctx: JobContext | None) -> Any:
    """Worker side: make ctx the current job; returns the token for reset_current."""
    return _CURRENT.set(ctx)


def reset_current(token: Any) -> None:
    _CURRENT.reset(token)


class JobLogFilter(logging.Filter):
    """Adds ``emq_job_id`` and ``emq_task`` to every record ("-" outside a job), for
    formats such as ``%(emq_job_id)s``. The worker installs the same fields on every record
    (install_log_fields); add this filter to handlers of your own elsewhere."""

    def filter(self, record: logging.LogRecord) -> bool:
        _annotate(record)
        return True


def _annotate(record: logging.LogRecord) -> None:
    ctx = _CURRENT.get()
    record.emq_job_id = ctx.id if ctx is not None else "-"
    record.emq_task = ctx.task if ctx is not None else "-"
    record.emq_queue = ctx.queue if ctx is not None else "-"


_installed = False


def install_log_fields() -> None:
    """Give every log record of this process the job fields (a record factory, so handlers
    added later by user code get them too). Idempotent."""
    global _installed
    if _installed:
        return
    _installed = True
    old = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = old(*args, **kwargs)
        _annotate(record)
        return record

    logging.setLogRecordFactory(factory)
