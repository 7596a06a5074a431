"""Error reporting to Sentry: ``pip install 'emqtasks[sentry]'``.

In the tasks module (so the worker's master and every child run it)::

    import emqtasks.contrib.sentry
    emqtasks.contrib.sentry.init(dsn=..., report_retries=False)   # sentry_sdk.init's options

or, where ``sentry_sdk.init`` is called already, ``integrations=[EmqtasksIntegration()]``.

- Every event made while a job runs (a ``capture_message`` in a task, an error a logging
  integration turns into an event, a report below) gets the job's tags ``emqtasks.task``,
  ``emqtasks.job_id``, ``emqtasks.queue``, ``emqtasks.group``, ``emqtasks.attempt`` and an
  ``emqtasks`` context (the same, and the fence); with OpenTelemetry on, the tag
  ``otel.trace_id`` (and ``trace_id`` in the context): the trace of the job's run. A
  global event processor reads them from the job context (``current_job``), a ContextVar:
  each async job on a child's loop sees its own, and nothing is left on a scope between jobs.
- A job that goes dead is reported once, from the ``task_dead`` hook, as an unhandled error
  event with its exception (in the master for a child that died or was killed at its time
  limit: ``WorkerLost`` / ``TimeLimitExceeded``). An attempt that will be retried is not
  reported unless ``report_retries=True`` (then one warning event per retried attempt).

A worker's child flushes the events still queued as it ends (a finalizer set in
``child_started``). The hooks are registered on the default App when this module is
imported (before the worker gathers the hooks of every App); they do nothing unless the
integration is enabled on the current Sentry client, so ``init`` may run later, in a
``child_started`` hook too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sentry_sdk
from sentry_sdk.integrations import Integration
from sentry_sdk.scope import add_global_event_processor
from sentry_sdk.utils import event_from_exception

from ..observe import tracing
from ..producer.app import default_app
from ..producer.context import JobContext, current_or_none

if TYPE_CHECKING:
    from sentry_sdk._types import Event

__all__ = ["EmqtasksIntegration", "init"]

#: Sentry keeps tag values to 200 characters; a group may be longer.
_TAG_MAX = 200


class EmqtasksIntegration(Integration):
    """Tags events with the job they come from; reports dead jobs (and, if asked, retries)."""

    identifier = "emqtasks"

    def __init__(self, report_retries: bool = False) -> None:
        self.report_retries = report_retries

    @staticmethod
    def setup_once() -> None:
        add_global_event_processor(_tag_event)


def init(*, report_retries: bool = False, **options: Any) -> None:
    """``sentry_sdk.init(**options)`` with the EmqtasksIntegration added to ``integrations``."""
    integrations = list(options.pop("integrations", None) or ())
    integrations.append(EmqtasksIntegration(report_retries=report_retries))
    sentry_sdk.init(integrations=integrations, **options)


def job_tags(job: JobContext) -> dict[str, str]:
    """The tags of an event made in ``job`` (tenant: jobs have none yet); ``otel.trace_id``
    when its run is in an OpenTelemetry trace."""
    tags = {"emqtasks.task": job.task[:_TAG_MAX], "emqtasks.job_id": job.id[:_TAG_MAX],
            "emqtasks.queue": job.queue, "emqtasks.group": job.group[:_TAG_MAX],
            "emqtasks.attempt": str(job.attempts)}
    trace_id = _trace_id(job)
    if trace_id is not None:
        tags["otel.trace_id"] = trace_id
    return tags


def _trace_id(job: JobContext) -> str | None:
    """The OpenTelemetry trace of the job's run (its span's), else the current span's."""
    return job._trace_id or tracing.trace_id()


def _job_context(job: JobContext) -> dict[str, Any]:
    context = {"task": job.task, "job_id": job.id, "queue": job.queue, "group": job.group,
               "attempt": job.attempts, "fence": job.fence}
    trace_id = _trace_id(job)
    if trace_id is not None:
        context["trace_id"] = trace_id
    return context


def _active() -> EmqtasksIntegration | None:
    return sentry_sdk.get_client().get_integration(EmqtasksIntegration)


def _tag_event(event: Event, _hint: dict[str, Any]) -> Event:
    """Every event of a job: its tags and context, unless the event has them already."""
    job = current_or_none()
    if job is None or _active() is None:
        return event
    tags = event.setdefault("tags", {})
    for key, value in job_tags(job).items():
        tags.setdefault(key, value)
    event.setdefault("contexts", {}).setdefault("emqtasks", _job_context(job))
    return event


def _report(job: JobContext, outcome: str) -> None:
    """One event for a failed attempt, tagged from ``job`` (the hook's own context: a
    result that could not be encoded fails after the job context was reset)."""
    exc = job.exception
    client = sentry_sdk.get_client()
    with sentry_sdk.new_scope() as scope:
        for key, value in job_tags(job).items():
            scope.set_tag(key, value)
        scope.set_tag("emqtasks.outcome", outcome)
        scope.set_context("emqtasks", {**_job_context(job), "outcome": outcome})
        if outcome == "retry":
            scope.set_level("warning")
        if exc is None:   # not from the runner, which always sets it; still say what ended
            sentry_sdk.capture_message(f"job {job.id} ({job.task}): {outcome}")
            return
        # handled=False: the task's exception escaped it (as Sentry's Celery integration
        # reports a failed task); a retried attempt is one the retry policy handles
        event, hint = event_from_exception(
            exc, client_options=client.options,
            mechanism={"type": "emqtasks", "handled": outcome == "retry"})
        sentry_sdk.capture_event(event, hint=hint)


def _on_dead(job: JobContext) -> None:
    if _active() is not None:
        _report(job, "dead")


def _on_retried(job: JobContext) -> None:
    integration = _active()
    if integration is not None and integration.report_retries:
        _report(job, "retry")


def _on_child_started() -> None:
    """A worker's child ends with ``os._exit`` (its fork start method), so no ``atexit``
    runs there, Sentry's flush at exit included: the events still queued for sending (a job
    that went dead just before a warm stop) would die with the child. A finalizer of the
    child's process flushes them as it ends. (The master exits normally: Sentry's own.)"""
    import multiprocess.util  # the worker's process library; only a worker child gets here

    multiprocess.util.Finalize(None, sentry_sdk.flush, exitpriority=100)


default_app.on("task_dead")(_on_dead)
default_app.on("task_retried")(_on_retried)
default_app.on("child_started")(_on_child_started)
