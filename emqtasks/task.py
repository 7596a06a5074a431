"""Task (a registered function: delay / apply_async / map) and JobHandle (follow one job).

``Task`` is generic over the function's parameters and result, so a type checker checks
``delay(...)`` against the function and ``JobHandle[R].get()`` gives ``R``.
"""

from __future__ import annotations

import functools
import inspect
import math
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from . import serialization, validate
from .callshape import fits, signature_of
from .errors import InvalidArgument, InvalidGroup, ResultTimeout, TaskFailed
from .registry import TaskSpec
from .store.connection import MAX_BLOCK
from .store.keys import DEFAULT_GROUP, check_group, check_job_id, new_job_id
from .store.queue import NewJob, Queue
from .validate import integer

if TYPE_CHECKING:
    from .app import App
    from .canvas import Signature

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class JobHandle(Generic[R_co]):
    """A job's id, what its enqueue answered, and a way to follow it.

    ``verdict`` is "enqueued", "duplicate" (the id existed: nothing was written) or "full"
    (``map()`` into a lane at its cap: nothing was written); ``duplicate`` is
    ``verdict == "duplicate"``.
    """

    __slots__ = ("id", "verdict", "_queue")

    def __init__(self, queue: Queue, job_id: str, verdict: str = "enqueued") -> None:
        self._queue = queue
        self.id = job_id
        self.verdict = verdict

    @property
    def duplicate(self) -> bool:
        return self.verdict == "duplicate"

    def status(self) -> str | None:
        """pending, delayed, active, done, dead, cancelled, skipped (a schedule's slot skipped
        by overlap control); None once the row expired."""
        return self._queue.status(self.id)

    def info(self) -> dict[str, Any] | None:
        return self._queue.job(self.id)

    def get(self, timeout: float | None = None, poll: float | None = None) -> R_co:
        """The task's return value; TaskFailed if it died, was cancelled, or was a schedule's
        slot skipped by overlap control; ResultTimeout
        (a TimeoutError) when it has not finished within ``timeout`` seconds.

        Blocks on the job's own notification key (one BLPOP per ``poll`` seconds, default
        5), so a waiting client costs the server next to nothing.
        """
        timeout = validate.optional_seconds(timeout, "timeout", high=math.inf)
        poll = validate.optional_seconds(poll, "poll", high=math.inf, above_low=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        state, result, error, ended = self._queue.wait_outcome(
            self.id, deadline, min(poll or 5.0, MAX_BLOCK))
        if not ended:
            raise ResultTimeout(f"job {self.id} still {state} after {timeout}s")
        if state == "done":
            value: R_co = serialization.loads_result(result)
            return value
        if state is None:
            raise TaskFailed(self.id, "the job row is gone (expired, purged, never "
                                      "existed, or result_ttl=0)")
        raise TaskFailed(self.id, "cancelled" if state == "cancelled" else error)

    def __repr__(self) -> str:
        return f"<JobHandle {self.id}{'' if self.verdict == 'enqueued' else ' ' + self.verdict}>"


class Task(Generic[P, R]):
    """A registered function. Calling it runs it here; ``delay`` runs it on a worker."""

    def __init__(self, app: App, spec: TaskSpec) -> None:
        self.app = app
        self.spec = spec
        self.name = spec.name
        functools.update_wrapper(self, spec.fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = self.spec.fn(*args, **kwargs)
        return result

    def delay(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle[R]:
        return self.apply_async(args, kwargs)

    def apply_async(self, args: Iterable[Any] = (), kwargs: dict[str, Any] | None = None,
                    job_id: str | None = None, group: str | None = None,
                    countdown: float | None = None,
                    eta: datetime | float | None = None, priority: int = 0) -> JobHandle[R]:
        """Enqueue one call. ``eta`` is a datetime or a UNIX timestamp; both go via delayed.
        ``priority`` (-100..100, lower first) orders jobs within the group's lane only.
        Raises LaneFull (nothing written) when the lane holds its cap of waiting jobs."""
        return self.app.send_task(self, args, kwargs, job_id=job_id, group=group,
                                  countdown=countdown, eta=eta, priority=priority)

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature of this call for a workflow: chain, group, chord (emqtasks.canvas).
        In a chain it gets the result of the step before as its first argument."""
        from .canvas import Signature
        return Signature(self, args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        """An immutable signature: in a chain it ignores the result of the step before."""
        from .canvas import Signature
        return Signature(self, args, kwargs, immutable=True)

    def map(self, calls: Iterable[Any], priority: int = 0) -> list[JobHandle[R]]:
        """Enqueue many calls in one round trip; each item a tuple of args or a dict of kwargs.
        A call into a full lane is not written and its handle says ``verdict == "full"``."""
        limit = self.app.settings.max_payload_bytes
        jobs = [build_job(self.spec, *_split_call(c), limit=limit, priority=priority)
                for c in calls]
        if not jobs:
            return []
        queue = self.app.queue(self.spec.queue)
        verdicts = queue.enqueue_many(jobs)
        return [JobHandle(queue, j.id, v.word) for j, v in zip(jobs, verdicts)]

    def __repr__(self) -> str:
        return f"<Task {self.name}>"


def _by_name(fn: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A call's arguments bound to the task's parameters, passed by name where they can be."""
    sig = signature_of(fn)
    try:
        bound = sig.bind(*args, **kwargs) if sig is not None else None
    except TypeError:
        bound = None
    if bound is None:
        return args, kwargs
    params = bound.signature.parameters
    star = any(params[n].kind is inspect.Parameter.VAR_POSITIONAL and v
               for n, v in bound.arguments.items())
    pos: list[Any] = []
    named: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = params[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            pos.extend(value)
        elif kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        elif kind is inspect.Parameter.POSITIONAL_ONLY or (
                star and kind is inspect.Parameter.POSITIONAL_OR_KEYWORD):
            pos.append(value)
        else:
            named[name] = value
    return tuple(pos), named


def build_job(spec: TaskSpec, args: tuple[Any, ...], kwargs: dict[str, Any], *, limit: int,
              job_id: str | None = None, group: str | None = None,
              countdown: float | None = None, eta: datetime | float | None = None,
              priority: int = 0) -> NewJob:
    """The row of one call of a task, gated: raises before anything is written."""
    payload = serialization.dumps_args(args, kwargs, limit)
    return NewJob(
        id=check_job_id(job_id) if job_id is not None else new_job_id(),
        task=spec.name,
        payload=payload,
        group=check_group(group if group is not None else _group_of(spec, args, kwargs)),
        max_attempts=spec.max_attempts,
        lease_ms=int(spec.lease * 1000),
        delay_ms=int(spec.retry_delay * 1000),
        ttl=spec.result_ttl,
        countdown_ms=validate.countdown_ms(countdown, eta),
        priority=integer(priority, "a priority", -100, 100),
    )


def _group_of(spec: TaskSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    g = spec.group
    if g is None:
        return DEFAULT_GROUP
    if isinstance(g, str):
        return g
    # The call as made, if it fits the group function; else the task's arguments by name,
    # so ``lambda tenant, **_: tenant`` serves ``build_report.delay("acme", 42)``.
    call = (args, kwargs) if fits(g, args, kwargs) else _by_name(spec.fn, args, kwargs)
    try:
        group: str = g(*call[0], **call[1])
    except Exception as exc:
        raise InvalidGroup(f"the group function of {spec.name} failed: {exc!r}") from exc
    return group


def _split_call(call: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(call, dict):
        return (), call
    if isinstance(call, (tuple, list)):
        return tuple(call), {}
    raise InvalidArgument(f"map() takes tuples of args or dicts of kwargs, not {call!r}")

