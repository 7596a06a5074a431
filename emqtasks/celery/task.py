"""Celery's ``Task`` base class: ``class MyTask(Task)`` with ``on_success`` / ``on_failure``
/ ``on_retry`` / ``after_return``, used as ``@app.task(base=MyTask)``.

The handlers run in the worker, from the App's hooks (emqtasks.hooks): ``on_success`` after
the job's result is stored (task_succeeded), ``on_retry`` when a failed attempt is retried
(task_retried), ``on_failure`` when the job goes to dead (task_dead: no retry left, or an
exception not retried), and ``after_return`` after each of the three. A handler that raises
is logged; the job's outcome stands.

Options a Celery base class sets as class attributes (``autoretry_for = (IOError,)``,
``max_retries = 5``, ``retry_kwargs = {"max_retries": 5}``...) are the defaults of the tasks
made with it; the decorator's own options win. A base class that overrides ``__call__``
(Flask's ``ContextTask``) has it called around each run; ``self.run`` is the function.
"""

from __future__ import annotations

import functools
import inspect
import traceback
from collections.abc import Callable
from typing import Any

from ..errors import Retry
from ..producer import states
from ..producer.app import App, all_apps
from ..producer.context import JobContext
from ..producer.registry import TaskOptions, TaskSpec
from ..producer.result import AsyncResult
from ..producer.task import Task as _Task

#: Class attributes of a base class read as task options (the decorator's own win).
CLASS_OPTIONS = (TaskOptions.__optional_keys__ | {
    "retry_kwargs", "serializer", "compression", "typing", "throws", "backend",
    "track_started", "reject_on_worker_lost", "store_errors_even_if_ignored", "priority",
    "trail"}) - {"name", "bind", "schedule"}
_RUN = "__emq_celery_run__"


class ExceptionInfo:
    """Celery's ``einfo``: the exception, its type and its traceback as text."""

    def __init__(self, exc: BaseException) -> None:
        self.exception = exc
        self.type = type(exc)
        self.tb = exc.__traceback__
        self.traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))

    def __str__(self) -> str:
        return self.traceback

    def __repr__(self) -> str:
        return f"<ExceptionInfo: {self.exception!r}>"


class Task(_Task[Any, Any]):
    """A task of emqtasks.celery; subclass it for Celery's handlers (see the module)."""

    def __init__(self, app: App, spec: TaskSpec) -> None:
        super().__init__(app, spec)
        self.max_retries = spec.max_attempts - 1

    @classmethod
    def wraps(cls, fn: Callable[..., Any],
              task: Callable[[], _Task[Any, Any]]) -> Callable[..., Any]:
        """fn itself, unless the class overrides ``__call__``: then a function that calls
        the task (whose ``__call__`` calls ``self.run``, fn)."""
        if cls.__call__ is Task.__call__:
            return fn

        def through_call(*args: Any, **kwargs: Any) -> Any:
            return task()(*args, **kwargs)

        wrapped = functools.wraps(fn)(through_call)
        wrapped.__signature__ = inspect.signature(fn)   # type: ignore[attr-defined]
        setattr(wrapped, _RUN, fn)
        return wrapped

    @property
    def run(self) -> Callable[..., Any]:
        """The task's function (with the task first for bind=True), as Celery's Task.run."""
        fn: Callable[..., Any] = getattr(self.spec.fn, _RUN, self.spec.fn)
        return fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(*args, **kwargs)

    # -- sending: Celery's calls answer an AsyncResult (.state, .ready(), .get()) -----------
    # (emqtasks' JobHandle is its ``handle``: verdict, duplicate, status().) The overrides
    # change the return type on purpose: code written for Celery reads ``res.state``.
    def apply_async(self, *args: Any, **kwargs: Any) -> AsyncResult:  # type: ignore[override]
        return AsyncResult.of(super().apply_async(*args, **kwargs))

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult:  # type: ignore[override]
        return self.apply_async(args, kwargs)

    def delay_on_commit(self, *args: Any, **kwargs: Any) -> AsyncResult:  # type: ignore[override]
        return self.apply_async(args, kwargs, on_commit=True)

    @classmethod
    def class_options(cls) -> dict[str, Any]:
        """The task options this class (and its bases up to Task) set as attributes."""
        out: dict[str, Any] = {}
        for klass in cls.__mro__:
            if klass is Task:
                break
            for name in CLASS_OPTIONS:
                if name in vars(klass) and name not in out:
                    out[name] = vars(klass)[name]
        return out

    # -- Celery's handlers (no-ops here) ------------------------------------------------
    def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
        """The job succeeded and its result is stored."""

    def on_retry(self, exc: BaseException, task_id: str, args: Any, kwargs: Any,
                 einfo: ExceptionInfo) -> None:
        """An attempt failed and the job will be tried again."""

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any,
                   einfo: ExceptionInfo) -> None:
        """The job failed for good (it is dead)."""

    def after_return(self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any,
                     einfo: ExceptionInfo | None) -> None:
        """After on_success, on_retry or on_failure: ``status`` SUCCESS, RETRY or FAILURE."""


def _celery_task(name: str) -> Task | None:
    for app in all_apps():
        if name in app.registry:
            found = app.registry.get(name)
            if isinstance(found, Task):
                return found
    return None


def _cause(exc: BaseException | None) -> BaseException:
    """What failed: a Retry's own exception (Task.retry(exc=...)), as Celery passes it."""
    if isinstance(exc, Retry) and exc.exc is not None:
        return exc.exc
    return exc if exc is not None else RuntimeError("the job failed")


def on_succeeded(ctx: JobContext) -> None:
    t = _celery_task(ctx.task)
    if t is not None:
        args, kwargs = list(ctx.args), dict(ctx.kwargs)
        t.on_success(ctx.result, ctx.id, args, kwargs)
        t.after_return(states.SUCCESS, ctx.result, ctx.id, args, kwargs, None)


def on_retried(ctx: JobContext) -> None:
    _failed(ctx, "on_retry", states.RETRY)


def on_dead(ctx: JobContext) -> None:
    _failed(ctx, "on_failure", states.FAILURE)


def _failed(ctx: JobContext, handler: str, state: str) -> None:
    """A failed run's Celery handler (``on_retry`` or ``on_failure``), then after_return."""
    t = _celery_task(ctx.task)
    if t is not None:
        exc, args, kwargs = _cause(ctx.exception), list(ctx.args), dict(ctx.kwargs)
        einfo = ExceptionInfo(exc)
        getattr(t, handler)(exc, ctx.id, args, kwargs, einfo)
        t.after_return(state, exc, ctx.id, args, kwargs, einfo)
