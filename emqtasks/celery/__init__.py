"""emqtasks.celery: the API a Celery project uses day to day, on emqtasks.

A project moves by its import lines (``from celery import Celery, shared_task`` becomes
``from emqtasks.celery import Celery, shared_task``) and its worker command
(``emqtasks worker -A proj``). Nothing here needs Celery installed, and ``import emqtasks``
does not import this package. See the README, "Coming from Celery".
"""

from __future__ import annotations

from ..errors import (
    MaxRetriesExceededError,
    Reject,
    Retry,
    SoftTimeLimitExceeded,
    TimeLimitExceeded,
)
from ..producer import states
from .app import AsyncResult, Celery, current_app, shared_task
from .beat import crontab
from .canvas import Signature, chain, chord, group, signature, subtask
from .task import ExceptionInfo, Task

__all__ = [
    "Celery", "shared_task", "current_app", "Task", "ExceptionInfo",
    "signature", "subtask", "chain", "group", "chord", "Signature",
    "crontab", "states",
    "Retry", "Reject", "SoftTimeLimitExceeded", "TimeLimitExceeded", "MaxRetriesExceededError",
    "AsyncResult",
]
