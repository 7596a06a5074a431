"""Task (a registered function: delay / apply_async / map) and JobHandle (follow one job).

``Task`` is generic over the function's parameters and result, so a type checker checks
``delay(...)`` against the function and ``JobHandle[R].get()`` gives ``R``.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, NoReturn, ParamSpec, TypeVar

from .. import serialization, validate
from ..errors import InvalidArgument, InvalidGroup, LaneFull, ResultTimeout, TaskFailed
from ..observe import tracing
from ..store.connection import MAX_BLOCK
from ..store.durable import Durable
from ..store.keys import Unique
from ..store.queue import NewJob, Queue
from ..store.replies import Outcome
from ..verdicts import AbortVerdict, EnqueueVerdict
from ..workflows.canvas import Signature, WorkflowHandle
from . import bound
from .abort import abort as abort_job
from .bound import Request, current_request
from .handle import Handle
from .jobs import build_job, tenant_of, unique_of
from .oncommit import run_on_commit
from .registry import TaskSpec

if TYPE_CHECKING:
    # The types only: a Task reaches its App through the object it was made with (app.py
    # imports this module, never the reverse); the async queue is imported on first use.
    from .app import App

__all__ = ["JobHandle", "LinkedJobHandle", "SendOptions", "Task", "asend", "build_job", "send"]

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class JobHandle(Handle, Generic[R_co]):
    """A job's id, what its enqueue answered, and a way to follow it.

    ``verdict`` is "enqueued", "duplicate" (the id existed: nothing was written) or "full"
    (``map()`` into a lane at its cap: nothing was written); ``duplicate`` is
    ``verdict == "duplicate"``. A job sent with ``on_commit=True`` inside a Django
    transaction says "on_commit" until the commit sends it (then its enqueue's verdict).

    Each call has an awaitable twin (``aget``, ``astatus``, ``ainfo``) on the App's async
    client of the running event loop; a handle made by hand awaits only with its ``app``.
    """

    __slots__ = ()

    def status(self) -> str | None:
        """pending, delayed, active, done, dead, cancelled, skipped (a schedule's slot skipped
        by overlap control), expired (not started by its ``expires``), aborted (stopped
        while running: ``abort()``); None once the row expired."""
        return self._sync().status(self.id)

    async def astatus(self) -> str | None:
        """status(), awaited."""
        return await self._aio().status(self.id)

    def info(self) -> dict[str, Any] | None:
        return self._sync().job(self.id)

    def abort(self) -> AbortVerdict:
        """Stop the job (``App.abort``): a running one within about a second, ending
        ``aborted``; one not started is cancelled. ABORTING, CANCELLED or FINISHED;
        UnknownJob once its row is gone."""
        return abort_job(self._sync(), self.id)

    async def ainfo(self) -> dict[str, Any] | None:
        """info(), awaited."""
        return await self._aio().job(self.id)

    def get(self, timeout: float | None = None, poll: float | None = None) -> R_co:
        """The task's return value; TaskFailed if it died, was cancelled, expired (never
        started by its ``expires``), or was a schedule's slot skipped by overlap control;
        ResultTimeout
        (a TimeoutError) when it has not finished within ``timeout`` seconds.

        Blocks on the job's own notification key (one BLPOP per ``poll`` seconds, default
        5), so a waiting client costs the server next to nothing.
        """
        deadline, chunk = _waiting(timeout, poll)
        return self._value(self._sync().wait_outcome(self.id, deadline, chunk), timeout)

    async def aget(self, timeout: float | None = None, poll: float | None = None) -> R_co:
        """get(), awaited: the event loop runs on while the job's notification key is
        awaited (one connection of the loop's pool held per waiting call)."""
        deadline, chunk = _waiting(timeout, poll)
        return self._value(await self._aio().wait_outcome(self.id, deadline, chunk), timeout)

    def _value(self, outcome: Outcome, timeout: float | None) -> R_co:
        """What get() makes of the job's end: its value, or the error."""
        state, result, error, ended = outcome
        if not ended:
            raise ResultTimeout(f"job {self.id} still {state} after {timeout}s")
        if state == "done":
            value: R_co = serialization.loads_result(result)
            return value
        if state is None:
            raise TaskFailed(self.id, "the job row is gone (expired, purged, never "
                                      "existed, or result_ttl=0)")
        if state == "aborted":
            raise TaskFailed(self.id, f"aborted: {error}" if error else "aborted")
        raise TaskFailed(self.id, "cancelled" if state == "cancelled" else error)

    def __repr__(self) -> str:
        return f"<JobHandle {self.id}{'' if self.verdict == 'enqueued' else ' ' + self.verdict}>"


class LinkedJobHandle(JobHandle[Any]):
    """The handle of ``apply_async(link=...)``: the task's own job, and ``workflow`` (the
    WorkflowHandle of the call and its links)."""

    __slots__ = ("workflow",)

    def __init__(self, *args: Any, workflow: WorkflowHandle, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.workflow = workflow


class Task(Generic[P, R]):
    """A registered function. Calling it runs it here; ``delay`` runs it on a worker."""

    def __init__(self, app: App, spec: TaskSpec) -> None:
        self.app = app
        self.spec = spec
        self.name = spec.name
        functools.update_wrapper(self, spec.fn)

    @staticmethod
    def wraps(fn: Callable[..., Any], task: Callable[[], Task[Any, Any]]) -> Callable[..., Any]:
        """The function the queue runs for ``fn`` (``task()``: the Task, made after it):
        fn itself; a subclass may put its own call around it (emqtasks.celery's Task)."""
        return fn

    @property
    def request(self) -> Request:
        """The job this task runs now (Celery's ``self.request`` of a bound task): id,
        retries, args, kwargs, delivery_info."""
        return current_request()

    def retry(self, exc: BaseException | None = None, countdown: float | None = None,
              eta: datetime | float | None = None,
              max_retries: int | None = None) -> NoReturn:
        """Celery's ``self.retry``: raises Retry (see producer/bound.py), or, past
        max_retries, ``exc`` or MaxRetriesExceededError, and the job goes dead."""
        bound.retry(self, exc, countdown, eta, max_retries)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = self.spec.fn(*args, **kwargs)
        return result

    def delay(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle[R]:
        return self.apply_async(args, kwargs)

    def delay_on_commit(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle[R]:
        """``delay()`` once the current Django transaction commits (``apply_async(...,
        on_commit=True)``)."""
        return self.apply_async(args, kwargs, on_commit=True)

    def apply_async(self, args: Iterable[Any] = (), kwargs: dict[str, Any] | None = None,
                    job_id: str | None = None, group: str | None = None,
                    countdown: float | None = None,
                    eta: datetime | float | None = None, priority: int = 0,
                    on_commit: bool = False,
                    expires: datetime | float | None = None, *, task_id: str | None = None,
                    queue: str | None = None, link: Any = None,
                    link_error: Signature | None = None,
                    durable: bool | Durable | None = None,
                    tenant: str | None = None, unique_key: str | None = None,
                    unique_for: float | None = None, debounce: float | None = None,
                    debounce_max: float | None = None) -> JobHandle[R]:
        """Enqueue one call. ``eta`` is a datetime or a UNIX timestamp; both go via delayed.
        ``priority`` (-100..100, lower first) orders jobs within the group's lane only.
        ``expires`` (seconds from now, a UNIX timestamp or a datetime): a job not started
        by then ends ``expired``, never run, and ``get()`` raises TaskFailed.
        ``tenant``: the group's tenant (else the task's ``tenant=``); InvalidGroup, nothing
        written, when the group is another tenant's and not empty.
        Raises LaneFull (nothing written) when the lane holds its cap of waiting jobs.
        ``unique_key`` (else the task's ``unique=``), held ``unique_for`` s at most (else
        the task's, else an hour): while a job of that key is pending, delayed or running,
        nothing is written and the handle is that job's, verdict "duplicate".
        ``debounce`` (s, with a key): the job is due that long after the last call of a
        burst, with the last call's arguments, and never later than ``debounce_max`` s
        (default 10 x debounce) after the first; every call of the burst gets its handle.

        ``on_commit=True`` (Django): the call is checked now and sent when the current
        transaction of the default database commits, never if it rolls back, at once
        outside a transaction; the handle has the job's id from the start.

        Celery's spellings: ``task_id=`` is job_id, ``queue=`` another queue than the
        task's; ``link=`` (a signature, or a list: each gets the result) and ``link_error=``
        send the call as a workflow (bound.linked); the handle is the task's own job.

        ``durable`` (True, False or emqtasks.Durable; None: the task's, else the App's):
        the enqueue returns once that many replicas have it, else raises NotDurable (the
        job is written on the primary; sending the same job_id again is safe)."""
        job_id = bound.one_id(job_id, task_id)
        if link is not None or link_error is not None:
            if (expires is not None or tenant is not None or unique_key is not None
                    or unique_for is not None or debounce is not None):
                raise InvalidArgument("expires=, tenant= or unique_key= with link=: a linked "
                                      "call is a workflow, whose steps take none of them")
            if durable is not None:
                raise InvalidArgument("durable= with link=: a linked call is a workflow, "
                                      "which follows the App's durable setting")
            own, flow = bound.linked(self, args, kwargs, link, link_error, job_id=job_id,
                                     group=group, countdown=countdown, eta=eta,
                                     priority=priority, queue=queue, on_commit=on_commit)
            return LinkedJobHandle(self.app.queue(self.spec.queue), own, flow.verdict,
                                   self.app, workflow=flow)
        return send(self.app, self.spec, args, kwargs,
                    SendOptions(queue=queue, job_id=job_id, group=group, countdown=countdown,
                                eta=eta, priority=priority, expires=expires, durable=durable,
                                tenant=tenant, unique_key=unique_key, unique_for=unique_for,
                                debounce=debounce, debounce_max=debounce_max),
                    later=run_on_commit if on_commit else None)

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature of this call for a workflow: chain, group, chord (emqtasks.canvas).
        In a chain it gets the result of the step before as its first argument."""
        return Signature(self, args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        """An immutable signature: in a chain it ignores the result of the step before."""
        return Signature(self, args, kwargs, immutable=True)

    def map(self, calls: Iterable[Any], priority: int = 0,
            expires: datetime | float | None = None, *,
            durable: bool | Durable | None = None) -> list[JobHandle[R]]:
        """Enqueue many calls in one round trip; each item a tuple of args or a dict of kwargs.
        A call into a full lane is not written and its handle says ``verdict == "full"``.
        ``expires``: as apply_async's, the same deadline for every call; ``durable`` too,
        with one wait for the whole batch."""
        calls = list(calls)
        if not calls:
            return []
        queue = self.app.queue(self.spec.queue)
        ex = validate.expires_ms(expires)
        wait = self.app.settings.durable_for(durable, self.spec.durable)
        with tracing.sending(self.name, queue.name, len(calls)) as span:
            jobs = self._jobs(calls, priority, span.carrier)
            holders: list[str | None] = []
            verdicts = queue.enqueue_many(jobs, None if ex is None else [ex] * len(jobs),
                                          self._tenants(calls), wait, self._uniques(calls),
                                          holders)
        return [JobHandle(queue, h or j.id, v.word, self.app)
                for j, v, h in zip(jobs, verdicts, holders or [None] * len(jobs))]

    def _jobs(self, calls: Iterable[Any], priority: int,
              trace: dict[str, str] | None) -> list[NewJob]:
        limit = self.app.settings.max_payload_bytes
        return [build_job(self.spec, *_split_call(c), limit=limit, priority=priority,
                          trace=trace) for c in calls]

    def _tenants(self, calls: list[Any]) -> list[str | None] | None:
        """Each call's tenant by the task's ``tenant=``; None when the task names none."""
        if self.spec.tenant is None:
            return None
        return [tenant_of(self.spec, *_split_call(c)) for c in calls]

    def _uniques(self, calls: list[Any]) -> list[Unique | None] | None:
        """Each call's unique key by the task's ``unique=``; None when the task names none."""
        if self.spec.unique is None:
            return None
        return [unique_of(self.spec, *_split_call(c)) for c in calls]

    # -- the awaitable twins (on the App's async client of the running event loop) ----------
    async def adelay(self, *args: P.args, **kwargs: P.kwargs) -> JobHandle[R]:
        """delay(), awaited: the same job, checks and errors, sent on redis.asyncio."""
        return await self.aapply_async(args, kwargs)

    async def aapply_async(self, args: Iterable[Any] = (),
                           kwargs: dict[str, Any] | None = None, job_id: str | None = None,
                           group: str | None = None, countdown: float | None = None,
                           eta: datetime | float | None = None,
                           priority: int = 0,
                           expires: datetime | float | None = None, *,
                           task_id: str | None = None, queue: str | None = None,
                           durable: bool | Durable | None = None,
                           tenant: str | None = None, unique_key: str | None = None,
                           unique_for: float | None = None, debounce: float | None = None,
                           debounce_max: float | None = None) -> JobHandle[R]:
        """apply_async(), awaited (its ``link=`` and ``on_commit=`` aside: a workflow's
        send and Django's commit hooks are synchronous)."""
        return await asend(self.app, self.spec, args, kwargs, SendOptions(
            queue=queue, job_id=bound.one_id(job_id, task_id), group=group,
            countdown=countdown, eta=eta, priority=priority, expires=expires, durable=durable,
            tenant=tenant, unique_key=unique_key, unique_for=unique_for, debounce=debounce,
            debounce_max=debounce_max))

    async def amap(self, calls: Iterable[Any], priority: int = 0,
                   expires: datetime | float | None = None, *,
                   durable: bool | Durable | None = None) -> list[JobHandle[R]]:
        """map(), awaited."""
        calls = list(calls)
        if not calls:
            return []
        queue = self.app.aqueue(self.spec.queue)
        ex = validate.expires_ms(expires)
        wait = self.app.settings.durable_for(durable, self.spec.durable)
        with tracing.sending(self.name, queue.name, len(calls)) as span:
            jobs = self._jobs(calls, priority, span.carrier)
            holders: list[str | None] = []
            verdicts = await queue.enqueue_many(jobs, None if ex is None else [ex] * len(jobs),
                                                self._tenants(calls), wait,
                                                self._uniques(calls), holders)
        return [JobHandle(queue, h or j.id, v.word, self.app)
                for j, v, h in zip(jobs, verdicts, holders or [None] * len(jobs))]

    def __repr__(self) -> str:
        return f"<Task {self.name}>"


@dataclass(frozen=True)
class SendOptions:
    """One call's options, as ``apply_async`` / ``send_task`` (and their awaitable twins)
    take them: made once by the public method, read by the one preparation both the sync
    and the async send share."""

    queue: str | None = None
    job_id: str | None = None
    group: str | None = None
    countdown: float | None = None
    eta: datetime | float | None = None
    priority: int = 0
    expires: datetime | float | None = None
    durable: bool | Durable | None = None
    tenant: str | None = None
    unique_key: str | None = None
    unique_for: float | None = None
    debounce: float | None = None
    debounce_max: float | None = None


class _Prepared(NamedTuple):
    """A call checked and built, ready for the enqueue verb."""

    job: NewJob
    expires_ms: int | None
    durable: Durable | None
    tenant: str | None
    unique: Unique | None

    # enqueue_many's per-job lists for this one job (None: no job of the call has one)
    @property
    def expires(self) -> list[int | None] | None:
        return None if self.expires_ms is None else [self.expires_ms]

    @property
    def tenants(self) -> list[str | None] | None:
        return None if self.tenant is None else [self.tenant]

    @property
    def uniques(self) -> list[Unique | None] | None:
        return None if self.unique is None else [self.unique]


def _prepare(app: App, spec: TaskSpec, args: Iterable[Any], kwargs: dict[str, Any] | None,
             o: SendOptions, span: Any) -> _Prepared:
    """Check and build one call (InvalidArgument and the like, nothing written)."""
    args, kwargs = tuple(args), kwargs or {}
    ex = validate.expires_ms(o.expires)
    wait = app.settings.durable_for(o.durable, spec.durable)
    uq = unique_of(spec, args, kwargs, o.unique_key, o.unique_for, o.debounce, o.debounce_max)
    countdown = _debounced(uq, o.countdown, o.eta)
    job = build_job(spec, args, kwargs, limit=app.settings.max_payload_bytes,
                    job_id=o.job_id, group=o.group, countdown=countdown, eta=o.eta,
                    priority=o.priority, trace=span.carrier)
    tn = tenant_of(spec, args, kwargs, o.tenant)
    span.job(job.id, job.group)
    return _Prepared(job, ex, wait, tn, uq)


def send(app: App, spec: TaskSpec, args: Iterable[Any] = (),
         kwargs: dict[str, Any] | None = None, options: SendOptions = SendOptions(), *,
         later: Callable[[Callable[[], None]], None] | None = None) -> JobHandle[Any]:
    """Enqueue one call of ``spec`` on ``app``'s server (``Task.apply_async`` and
    ``App.send_task``): LaneFull or CorruptKey, nothing written, as the verdict says.

    ``later`` (oncommit.run_on_commit): the call is checked now, and ``later`` is given the
    enqueue to run when it will; the handle says "on_commit" until then."""
    q = app.queue(options.queue if options.queue is not None else spec.queue)
    with tracing.sending(spec.name, q.name) as span:
        call = _prepare(app, spec, args, kwargs, options, span)
        if later is not None:
            handle: JobHandle[Any] = JobHandle(q, call.job.id, "on_commit", app)

            def enqueue() -> None:
                sent = _enqueue(app, q, call)
                handle.id, handle.verdict = sent.id, sent.verdict

            later(enqueue)
            return handle
        return _enqueue(app, q, call)


def _enqueue(app: App, q: Queue, call: _Prepared) -> JobHandle[Any]:
    holders: list[str | None] = []
    verdict = q.enqueue_many([call.job], call.expires, call.tenants, call.durable,
                             call.uniques, holders)[0]
    if verdict == EnqueueVerdict.UNREADABLE:
        raise q.corrupt([call.job.group], f"job {call.job.id} was not enqueued")
    return _sent(app, q, call, verdict, holders)


async def asend(app: App, spec: TaskSpec, args: Iterable[Any] = (),
                kwargs: dict[str, Any] | None = None,
                options: SendOptions = SendOptions()) -> JobHandle[Any]:
    """send(), awaited on the App's async client of the running event loop."""
    q = app.aqueue(options.queue if options.queue is not None else spec.queue)
    with tracing.sending(spec.name, q.name) as span:
        call = _prepare(app, spec, args, kwargs, options, span)
        holders: list[str | None] = []
        verdict = (await q.enqueue_many([call.job], call.expires, call.tenants, call.durable,
                                        call.uniques, holders))[0]
        if verdict == EnqueueVerdict.UNREADABLE:
            raise await q.corrupt([call.job.group], f"job {call.job.id} was not enqueued")
        return _sent(app, q, call, verdict, holders)


def _sent(app: App, q: Any, call: _Prepared, verdict: EnqueueVerdict,
          holders: list[str | None]) -> JobHandle[Any]:
    """The handle of a job sent alone; a job whose unique key another holds gets the
    holder's (holders stays empty for a call without unique keys: it may go through the
    batcher)."""
    return JobHandle(q, (holders[0] if holders else None) or call.job.id,
                     _accepted(call.job, verdict, call.tenant), app)


def _debounced(unique: Unique | None, countdown: float | None,
               eta: datetime | float | None) -> float | None:
    """A debounced call's countdown: its debounce (a countdown or eta of its own is
    InvalidArgument: the burst decides when it runs)."""
    if unique is None or not unique.debounce_ms:
        return countdown
    if countdown is not None or eta is not None:
        raise InvalidArgument("countdown= or eta= with debounce=: the burst's last call "
                              "decides when the job runs")
    return unique.debounce_ms / 1000


def _accepted(job: NewJob, verdict: EnqueueVerdict, tenant: str | None = None) -> str:
    """The handle's verdict of a job sent alone: LaneFull when its lane was full."""
    if verdict == EnqueueVerdict.FULL:
        raise LaneFull(job.group, job.id)
    if verdict == EnqueueVerdict.TENANT:
        raise InvalidGroup(f"group {job.group!r} belongs to another tenant than "
                           f"{tenant!r} and is not empty: job {job.id} was not enqueued")
    return verdict.word


def _waiting(timeout: float | None, poll: float | None) -> tuple[float | None, float]:
    """get()'s deadline (time.monotonic()) and BLPOP chunk from its arguments, checked."""
    timeout = validate.optional_seconds(timeout, "timeout", high=math.inf)
    poll = validate.optional_seconds(poll, "poll", high=math.inf, above_low=True)
    deadline = None if timeout is None else time.monotonic() + timeout
    return deadline, min(poll or 5.0, MAX_BLOCK)


def _split_call(call: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(call, dict):
        return (), call
    if isinstance(call, (tuple, list)):
        return tuple(call), {}
    raise InvalidArgument(f"map() takes tuples of args or dicts of kwargs, not {call!r}")

