"""What ``emqtasks worker`` does for the Celery apps of the modules it imported: import the
tasks modules they name (``include``, ``imports``, ``autodiscover_tasks``) and declare their
beat_schedule, for the worker to store with the other schedules declared in code."""

from __future__ import annotations

import logging
import sys

from ..errors import UnknownTask
from ..producer.app import all_apps
from ..schedules.cron import Cron
from .app import celery_apps
from .beat import BeatEntry

log = logging.getLogger("emqtasks.worker")


def prepare() -> None:
    """Called by the worker command after it imported -A, while schedules are deferred.
    Raises what a tasks module raises, or a ScheduleError naming a bad beat entry."""
    for app in celery_apps():
        app.import_tasks_modules()
    if "django" in sys.modules:
        handle_django_connections()
    known = {name for app in all_apps() for name in app.tasks}
    for app in celery_apps():
        app.on_after_configure.dispatch(app)
        app.on_after_finalize.dispatch(app)
        entries = app.beat_entries()
        for entry in entries:
            if entry.schedule.task not in known:
                raise UnknownTask(f"beat_schedule[{entry.label!r}] names task "
                                  f"{entry.schedule.task!r}, which no module of this worker "
                                  f"registers (-A, include, autodiscover_tasks)")
        for entry in entries:
            app.declared_schedules[entry.schedule.name] = entry.schedule
            if entry.queue is not None:
                app.declared_queues[entry.schedule.name] = entry.queue
        if entries:
            log.info("beat_schedule of %r: %d entries loaded: %s", app.main, len(entries),
                     "; ".join(_described(e) for e in entries))


def _described(entry: BeatEntry) -> str:
    s = entry.schedule
    tz = f" {s.tz}" if isinstance(s.timing, Cron) else ""
    queue = f", queue {entry.queue}" if entry.queue else ""
    return f"{s.name} ({s.task}, {s.timing}{tz}{queue})"


def handle_django_connections() -> None:
    """A Celery project set Django up (autodiscover_tasks()): its database connections are
    handled as under ``--django`` (emqtasks.contrib.django.worker): closed before the fork,
    dropped by each child, closed when old around each job."""
    from django.apps import apps

    if not apps.ready:
        return
    from django.db import connections

    from ..contrib.django import worker as django_worker
    from ..producer.app import default_app

    connections.close_all()
    default_app.on("child_started")(django_worker.drop_inherited)
    for event in django_worker.AROUND_A_JOB:
        default_app.on(event)(django_worker.close_old)
