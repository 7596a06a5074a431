"""``@task(bind=True)``: the Task as the function's first argument, ``self.request`` (the
running job, as Celery's ``Task.request`` names it) and ``self.retry()``.

The request is read from the job's context (a ContextVar), never stored on the Task: a Task
is shared by every job of its process, and an async child runs several at once.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn, cast

from .. import validate
from ..errors import InvalidArgument, MaxRetriesExceededError, Retry
from ..store.keys import new_job_id
from ..workflows.canvas import Chain, Group, WorkflowHandle
from .context import current_or_none

if TYPE_CHECKING:
    from .task import Task


@dataclass(frozen=True)
class Request:
    """The job a bound task runs (Celery's ``self.request``). Outside a worker (the task
    called directly) ``called_directly`` is True and the rest is empty."""

    id: str | None = None
    task: str | None = None
    retries: int = 0                       # attempts before this one
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: {"queue", "routing_key" (both the queue's name), "group"}
    delivery_info: dict[str, Any] = field(default_factory=dict)
    called_directly: bool = True


def current_request() -> Request:
    ctx = current_or_none()
    if ctx is None:
        return Request()
    return Request(id=ctx.id, task=ctx.task, retries=ctx.attempts - 1, args=tuple(ctx.args),
                   kwargs=dict(ctx.kwargs),
                   delivery_info={"queue": ctx.queue, "routing_key": ctx.queue,
                                  "group": ctx.group},
                   called_directly=False)


def bind(fn: Callable[..., Any], task: Callable[[], Task[Any, Any]]) -> Callable[..., Any]:
    """fn with the Task (``task()``, made after it) as its first argument. Its signature
    is fn's without that parameter, so every check of a call's shape (at enqueue, in a
    schedule, in the worker) sees the arguments a caller gives."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if not params or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                            inspect.Parameter.POSITIONAL_OR_KEYWORD):
        raise InvalidArgument(f"bind=True: {fn.__qualname__} must take the task as its "
                              f"first positional parameter (self)")

    bound: Callable[..., Any]
    if inspect.iscoroutinefunction(fn):   # still a coroutine function to those who look
        async def bound_async(*args: Any, **kwargs: Any) -> Any:
            return await fn(task(), *args, **kwargs)

        bound = functools.wraps(fn)(bound_async)
    else:
        def bound_sync(*args: Any, **kwargs: Any) -> Any:
            return fn(task(), *args, **kwargs)

        bound = functools.wraps(fn)(bound_sync)
    cast(Any, bound).__signature__ = sig.replace(parameters=params[1:])
    return bound


def retry(task: Task[Any, Any], exc: BaseException | None = None,
          countdown: float | None = None, eta: datetime | float | None = None,
          max_retries: int | None = None) -> NoReturn:
    """Celery's ``self.retry``: raise Retry (the next attempt after ``countdown`` seconds,
    at ``eta``, else the task's retry_delay), or, once ``max_retries`` retries were made,
    re-raise ``exc`` (or MaxRetriesExceededError) and the job goes to dead at once.

    ``max_retries`` (default: the task's) can lower the job's budget, not raise it: the
    budget is written on the job's row at enqueue (max_attempts)."""
    ctx = current_or_none()
    if ctx is None:
        raise InvalidArgument(f"{task.name}: retry() is for a task run by a worker")
    budget = ctx.max_attempts - 1
    if max_retries is not None:
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) \
                or max_retries < 0:
            raise InvalidArgument(f"max_retries is a whole number >= 0, not {max_retries!r}")
        budget = min(budget, max_retries)
    retries = ctx.attempts - 1
    if retries >= budget:
        ctx.give_up = True
        if exc is not None:
            raise exc
        raise MaxRetriesExceededError(
            f"{task.name}[{ctx.id}]: {retries} retries made, the most it may make "
            f"(max_retries; the job's own budget is max_attempts={ctx.max_attempts})")
    if countdown is not None and eta is not None:
        raise InvalidArgument("retry(): give countdown= or eta=, not both")
    if eta is not None:
        stamp = eta.timestamp() if isinstance(eta, datetime) else eta
        delay = max(0.0, validate.seconds(stamp, "eta", high=float("inf")) - time.time())
    elif countdown is not None:
        delay = validate.seconds(countdown, "countdown")
    else:
        delay = task.spec.retry_delay
    raise Retry(delay, exc=exc)


def one_id(job_id: str | None, task_id: str | None) -> str | None:
    """apply_async's job id: job_id= or Celery's task_id=, not two different ones."""
    if task_id is not None and job_id is not None and task_id != job_id:
        raise InvalidArgument("give job_id= or task_id= (the same), not both")
    return job_id if job_id is not None else task_id


def linked(task: Task[Any, Any], args: Any, kwargs: dict[str, Any] | None, link: Any,
           link_error: Any, *, job_id: str | None, group: str | None,
           countdown: float | None, eta: Any, priority: int, queue: str | None,
           on_commit: bool) -> tuple[str, WorkflowHandle]:
    """apply_async(link=..., link_error=...): the call as the first step of a workflow
    ``task.s(*args, **kwargs) | link`` (a list of links: a group, each member given the
    result) with its link_error; sent atomically. Returns the task's own step's id (for a
    handle whose get() is the task's result, as Celery's AsyncResult of the task) and the
    workflow's handle."""
    for given, what in ((queue, "queue="), (eta, "eta="), (on_commit or None, "on_commit=")):
        if given is not None:
            raise InvalidArgument(f"apply_async(link=/link_error=) sends a workflow, which "
                                  f"takes no {what} (countdown=, group=, priority=, task_id= "
                                  f"it takes)")
    job_id = job_id if job_id is not None else new_job_id()
    options = {k: v for k, v in (("job_id", job_id), ("group", group),
                                 ("countdown", countdown)) if v is not None}
    if priority:
        options["priority"] = priority
    first = task.s(*tuple(args), **(kwargs or {})).set(**options)
    steps: list[Any] = [first]
    if isinstance(link, (list, tuple)):
        links = list(link)
        if links:
            steps.append(links[0] if len(links) == 1 else Group(*links))
    elif link is not None:
        steps.append(link)
    return job_id, Chain(*steps).apply_async(link_error=link_error)
