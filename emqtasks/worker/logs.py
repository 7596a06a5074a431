"""The worker's log lines: today's text, or one JSON object per line (``--log-format json``).

A JSON line has ``ts``, ``level``, ``logger``, ``pid``, ``msg`` (and ``exc``, a traceback
as one string); a job's line adds the job's fields. The worker's own lines about a job pass
them as ``extra=job_extra(...)``; a record made inside a task (user code calling
``logging.getLogger(...).info``) gets them from JobFieldsFilter, which reads the current job
context. Only the stdlib: json and logging (``trace_id``: observe/tracing.py, which
imports OpenTelemetry never itself).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TYPE_CHECKING, Any

from ..observe import tracing
from ..producer.context import current_or_none

if TYPE_CHECKING:
    from ..producer.context import JobContext
    from ..store.queue import Lease

FORMATS = ("text", "json")
#: Today's text line, kept as it was.
TEXT_FORMAT = "%(asctime)s %(levelname)s emqtasks[%(process)d] %(message)s"
#: The job fields in the order a JSON line gives them. ``trace_id`` joins them once a job's
#: context knows its trace (OpenTelemetry, issue 28): job_extra adds it when given one.
JOB_FIELDS = ("queue", "task", "job_id", "group", "attempt", "duration_ms", "outcome",
              "trace_id")
_ATTR = "emq_job"   # the record attribute that holds a job's fields (one name: no clash)

#: The level of a job's success line. A JSON log is for a pipeline that wants every job:
#: INFO. Text logs had no success line at INFO, and keep none (--loglevel DEBUG shows it).
done_level = logging.DEBUG


def job_extra(job_id: str, task: str, queue: str, group: str, attempt: int, *,
              outcome: str | None = None, started: float | None = None,
              trace_id: str | None = None) -> dict[str, Any]:
    """The ``extra=`` of a log call about one job; ``started``: time.monotonic() at its
    start, for ``duration_ms``."""
    fields: dict[str, Any] = {"queue": queue, "task": task, "job_id": job_id,
                              "group": group, "attempt": attempt}
    if started is not None:
        fields["duration_ms"] = round((time.monotonic() - started) * 1000, 2)
    if outcome is not None:
        fields["outcome"] = outcome
    if trace_id is not None:
        fields["trace_id"] = trace_id
    return {_ATTR: fields}


def context_extra(ctx: JobContext, outcome: str | None = None) -> dict[str, Any]:
    """job_extra for a job the child runs: the duration from its context's start; the
    trace its run's span is in (the span may have ended: the done line), else the current
    span's (a context passed on without an SDK, a span the task opened)."""
    return job_extra(ctx.id, ctx.task, ctx.queue, ctx.group, ctx.attempts,
                     outcome=outcome, started=None if outcome is None else ctx._started,
                     trace_id=ctx._trace_id or tracing.trace_id())


def lease_extra(lease: Lease, queue: str, outcome: str, started: float,
                trace_id: str | None = None) -> dict[str, Any]:
    """job_extra for a job the master settles (its child died or was killed). The master
    knows a running job from its child's slot (id, attempts, nonce), not its task and
    group: those fields are left out rather than given empty. ``trace_id``: of the span
    the master gave the run, when it traces."""
    extra = job_extra(lease.id, lease.task, queue, lease.group, lease.attempts,
                      outcome=outcome, started=started, trace_id=trace_id)
    for name in ("task", "group"):
        if not extra[_ATTR][name]:
            del extra[_ATTR][name]
    return extra


class JobFieldsFilter(logging.Filter):
    """Gives a record made inside a task the job's fields (a record that names its job
    already, a worker line, keeps its own)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, _ATTR):
            ctx = current_or_none()
            if ctx is not None:
                setattr(record, _ATTR, context_extra(ctx)[_ATTR])
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (a traceback is the ``exc`` string)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                  + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "msg": record.getMessage(),
        }
        fields = getattr(record, _ATTR, None)
        if isinstance(fields, dict):
            line.update((k, fields[k]) for k in JOB_FIELDS if k in fields)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str)


def configure(log_format: str, level: str) -> None:
    """Set the worker's logging up, before the fork (its children inherit the handler)."""
    global done_level
    if log_format == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        handler.addFilter(JobFieldsFilter())
        logging.basicConfig(level=level.upper(), handlers=[handler])
        logging.captureWarnings(True)   # warnings.warn's lines are JSON lines too
        done_level = logging.INFO
    else:
        logging.basicConfig(level=level.upper(), stream=sys.stderr, format=TEXT_FORMAT)
