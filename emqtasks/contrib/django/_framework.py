"""Which ``django.tasks`` this process has: Django's own (6.0 and later), else the
``django-tasks`` backport (module ``django_tasks``, for Django 4.2 to 5.2). Their APIs are
the same but for two exception names; this module gives both under one set of names."""

from __future__ import annotations

from typing import Any


def _load() -> tuple[Any, Any, Any, Any, Any]:
    try:
        from django import tasks
        from django.tasks import base, exceptions, signals
        from django.tasks.backends import base as backends
        return tasks, base, backends, exceptions, signals
    except ImportError:
        pass
    try:
        import django_tasks as bp_tasks
        from django_tasks import base as bp_base
        from django_tasks import exceptions as bp_exceptions
        from django_tasks import signals as bp_signals
        from django_tasks.backends import base as bp_backends
    except ImportError:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            "emqtasks.contrib.django.TaskBackend needs django.tasks (Django 6.0 or later) "
            "or the django-tasks backport (pip install django-tasks)") from None
    return bp_tasks, bp_base, bp_backends, bp_exceptions, bp_signals


_tasks, _base, _backends, _exceptions, _signals = _load()

#: Where the task functions come from, for a message: "django.tasks" or "django_tasks".
MODULE: str = _tasks.__name__
task_backends: Any = _tasks.task_backends

BaseTaskBackend: Any = _backends.BaseTaskBackend
Task: Any = _base.Task
TaskContext: Any = _base.TaskContext
TaskError: Any = _base.TaskError
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
InvalidTask: type[Exception] = getattr(_exceptions, "InvalidTask", None) or \
    _exceptions.InvalidTaskError
InvalidTaskBackend: type[Exception] = getattr(_exceptions, "InvalidTaskBackend", None) or \
    _exceptions.InvalidTaskBackendError
TaskResultDoesNotExist: type[Exception] = _exceptions.TaskResultDoesNotExist
task_enqueued: Any = _signals.task_enqueued
task_started: Any = _signals.task_started
task_finished: Any = _signals.task_finished
