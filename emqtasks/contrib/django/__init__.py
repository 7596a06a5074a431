"""emqtasks in a Django project (``pip install 'emqtasks[django]'``).

- ``INSTALLED_APPS += ["emqtasks.contrib.django"]``: ``settings.EMQTASKS`` configures the
  default App (conf.py); the ``EMQ_*`` environment variables still win.
- ``DJANGO_SETTINGS_MODULE=mysite.settings emqtasks worker --django``: Django set up before
  the fork, every installed app's ``tasks`` module imported, database connections handled
  as Django's request cycle does (worker.py).
- ``task.delay_on_commit(...)`` / ``apply_async(..., on_commit=True)``: enqueued when the
  transaction commits (emqtasks.producer.oncommit).
- ``TASKS = {"default": {"BACKEND": "emqtasks.contrib.django.TaskBackend", ...}}``: Django's
  ``django.tasks`` (or the ``django-tasks`` backport) run by emqtasks workers (backend.py).

``TaskBackend`` is imported on first use, so that listing the app never needs
``django.tasks``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TaskBackend"]


def __getattr__(name: str) -> Any:
    if name == "TaskBackend":
        from .backend import TaskBackend

        return TaskBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
