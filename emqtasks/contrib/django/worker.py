"""``emqtasks worker --django``: Django set up in the master before it forks, the ``tasks``
module of every installed app imported, and Django's database connections handled the way
Django's own request cycle handles them.

- The master closes every connection it opened while setting up, before it forks, so a
  child never shares a database socket with it (or with a sibling).
- A child drops (without closing: that would end the master's session) any connection it
  inherited anyway, when it starts.
- Each job runs between two ``close_old_connections()``, as a request does between
  ``request_started`` and ``request_finished``: a connection past its CONN_MAX_AGE, or
  left unusable by the job, is closed, and the next job opens a fresh one.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from ...errors import ConfigError
from ...producer.app import default_app
from ...producer.hooks import HookEvent

APP = "emqtasks.contrib.django"
log = logging.getLogger("emqtasks.worker")
#: The hooks a job's run starts and ends with (whatever its outcome).
AROUND_A_JOB: tuple[HookEvent, ...] = ("task_started", "task_succeeded", "task_retried",
                                       "task_dead")
#: Inherited connections a child dropped: kept referenced so that nothing ever finalises
#: (closes) them in the child; a child leaves by os._exit, running no finaliser.
_dropped: list[Any] = []


def setup() -> dict[str, Any]:
    """Set Django up and import the ``tasks`` module of every installed app; returns the
    default App's settings (``settings.EMQTASKS``, ``EMQ_*`` winning) for the worker, its
    queue followed by the queues of the TaskBackends on the same server (each of weight 1:
    ``-Q`` or ``EMQ_QUEUE`` chooses otherwise). A misconfiguration is ConfigError, one line
    naming the setting."""
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        raise ConfigError("--django needs DJANGO_SETTINGS_MODULE (e.g. DJANGO_SETTINGS_MODULE="
                          "mysite.settings emqtasks worker --django)")
    try:
        import django
        from django.apps import apps
    except ImportError:
        raise ConfigError("--django needs Django: pip install 'emqtasks[django]'") from None
    try:
        django.setup()
    except Exception as exc:
        raise ConfigError(f"Django setup failed ({os.environ['DJANGO_SETTINGS_MODULE']}): "
                          f"{type(exc).__name__}: {_one_line(exc)}") from None
    if not apps.is_installed(APP):
        raise ConfigError(f"add {APP!r} to settings.INSTALLED_APPS: --django reads "
                          "settings.EMQTASKS through it")
    found = autodiscover()
    log.info("django: settings %s, tasks modules: %s", os.environ["DJANGO_SETTINGS_MODULE"],
             ", ".join(found) or "none")
    from django.db import connections

    connections.close_all()   # before the fork: children open their own
    default_app.on("child_started")(drop_inherited)
    for event in AROUND_A_JOB:
        default_app.on(event)(close_old)
    url, queue = default_app.settings.redis_url, default_app.settings.queue
    queues = [queue] + [q for q in backend_queues(url) if q != queue]
    return {"redis_url": url, "queue": ",".join(f"{q}:1" for q in queues) if len(queues) > 1
            else queue}


def autodiscover() -> list[str]:
    """Import ``<app>.tasks`` of every installed app that has one (Celery's
    ``autodiscover_tasks``); returns their names. An error inside one propagates."""
    from django.apps import apps
    from django.utils.module_loading import autodiscover_modules, module_has_submodule

    found = [f"{c.name}.tasks" for c in apps.get_app_configs()
             if module_has_submodule(c.module, "tasks")]
    autodiscover_modules("tasks")
    return found


def drop_inherited() -> None:
    """child_started: forget the connections the master held at the fork, unclosed."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if conn.connection is not None:
            _dropped.append(conn.connection)
            conn.connection = None


def close_old(_job: object = None) -> None:
    """Around each job: Django's ``close_old_connections()`` (the request cycle's). Not on
    an async child's running loop, where Django refuses sync database calls (async tasks
    reach the database through sync_to_async threads, which manage their own)."""
    try:
        asyncio.get_running_loop()
        return
    except RuntimeError:
        pass
    from django.db import close_old_connections

    close_old_connections()


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""


def backend_queues(redis_url: str) -> list[str]:
    """The emqtasks queues of the TaskBackends in ``settings.TASKS`` that use ``redis_url``
    (a backend elsewhere needs a worker of its own: ``--redis-url``)."""
    from django.conf import settings

    ours = [alias for alias, params in getattr(settings, "TASKS", {}).items()
            if str(params.get("BACKEND", "")).startswith(APP)]
    if not ours:
        return []
    from . import _framework
    from .backend import TaskBackend

    queues: list[str] = []
    for alias in ours:
        backend = _framework.task_backends[alias]
        if isinstance(backend, TaskBackend) and backend.app.settings.redis_url == redis_url:
            queues += [backend.queue_of(name) for name in sorted(backend.queues)
                       if backend.queue_of(name) not in queues]
    return queues
