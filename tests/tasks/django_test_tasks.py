"""Django tasks (django.tasks, or the django-tasks backport) for tests/test_django.py; the
worker imports this module with -A beside --django."""

from __future__ import annotations

import os
from typing import Any

import emqtasks

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task
def add(a: int, b: int) -> int:
    return a + b


@task
async def async_add(a: int, b: int) -> int:
    return a + b


@task
def fail(message: str) -> None:
    raise LookupError(message)


@task(takes_context=True)
def attempt_of(context: Any, note: str) -> dict[str, Any]:
    return {"attempt": context.attempt, "id": context.task_result.id, "note": note}


@task
def record(key: str, label: str, account_id: str | None = None) -> str:
    """Push label onto a Redis list (the worker's server): the order jobs ran in."""
    emqtasks.default_app.client.rpush(key, label)
    return label


_opened = 0


def _count(**_kwargs: Any) -> None:
    global _opened
    _opened += 1


@task
def connections_opened() -> list[int]:
    """[this process's pid, connections Django opened in it so far]."""
    from django.db import connection
    from django.db.backends.signals import connection_created

    connection_created.connect(_count, dispatch_uid="django_test_tasks.count")
    connection.ensure_connection()
    return [os.getpid(), _opened]
