"""The Runner: runs one job against a registry and settles a failure through the fence.

It looks the task up, decodes and checks the arguments, makes the job's context current,
fires the hooks, runs the function (an ``async def`` task to its end on the child's event
loop, under its time limit), and on a failure applies the task's retry policy. A success is
returned for the caller to acknowledge (the ack may claim the next job in the same call).
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from redis.exceptions import ResponseError

from .. import serialization
from ..config import Settings
from ..errors import (
    Aborted,
    AckRefused,
    MaxRetriesExceededError,
    RateLimited,
    Reject,
    ResultTooLarge,
    Retry,
    SerializationError,
    TimeLimitExceeded,
    UnknownTask,
)
from ..observe import tracing
from ..producer.callshape import misfit
from ..producer.context import JobContext, reset_current, set_current
from ..producer.hooks import Hooks
from ..producer.registry import Registry, TaskSpec
from ..producer.retry_policy import DEFAULT_POLICY
from ..store.queue import Lease, Queue
from . import logs, soft_limit
from .resilience import TRANSIENT, Refused
from .slots import ASYNC, SYNC

log = logging.getLogger("emqtasks.child")
T = TypeVar("T")

#: The most of an error message (or task name) a failure log line quotes.
LOG_TEXT_MAX = 300


@dataclass(frozen=True)
class Outcome:
    """What became of one job, for tests and the summary."""

    job_id: str
    verdict: str          # done, retry, dead, stale, rate_limited, aborted
    error: str | None = None


class Plan(NamedTuple):
    """What a child needs to know of a job before it runs it (and writes its slot)."""

    spec: TaskSpec | None
    time_limit: float
    kind: int                    # SYNC or ASYNC
    retry_delay: float | None    # the delay a retry after this attempt gets (None: fixed)
    max_result: int = Settings.max_result_bytes   # the most bytes of result JSON it may give
    abort_grace: float | None = None   # s it gets to return once aborted (None: the worker's)


class Executed(NamedTuple):
    """A job's run: its result JSON (None on a failure, already settled as outcome)."""

    result: str | None
    outcome: Outcome | None
    ctx: JobContext | None


class Runner:
    """Runs leases against a registry and reports each failure through the fence."""

    def __init__(self, queue: Queue | Sequence[Queue], registry: Registry | None = None,
                 default_time_limit: float = 0.0, hooks: Hooks | None = None) -> None:
        self.queues = [queue] if isinstance(queue, Queue) else list(queue)
        self.queue = self.queues[0]
        #: Default: the tasks (and hooks) of every App in this process.
        self.registry = registry if registry is not None else every_task()
        self.hooks = hooks if hooks is not None else every_hook()
        self.default_time_limit = default_time_limit
        self._plans: dict[str, tuple[TaskSpec | None, float, int, int]] = {}
        #: The contexts of the jobs running now, by their claim's nonce (an abort finds
        #: its attempt here: abort_asked).
        self.running: dict[str, JobContext] = {}
        #: How Redis calls are made; a child routes them through its Outage.
        self.call: Callable[..., Any] = lambda fn, *args: fn(*args)
        #: Told of a failure just before it is written (lease, error, delay, final): a
        #: child notes it in the job's slot, for its master to write should the child die.
        self.noting: Callable[[Lease, str, float | None, bool], None] = lambda *_: None
        #: The sync job of the last execute(), and whether its task function is running now
        #: (a time-limit SIGTERM raises into the task only then).
        self.current: Lease | None = None
        self.in_task = False
        #: An async task run here to its end (off the loop): an abort cancels it.
        self.here: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: set[asyncio.Task[Any]] = set()

    # -- looking a job up ---------------------------------------------------------------
    def plan(self, lease: Lease) -> Plan:
        known = self._plans.get(lease.task)
        if known is None:
            task = self.registry.get(lease.task) if lease.task in self.registry else None
            spec = task.spec if task is not None else None
            limit = float(spec.time_limit) if spec is not None and spec.time_limit else \
                self.default_time_limit
            kind = ASYNC if spec is not None and spec.is_async else SYNC
            known = self._plans[lease.task] = (spec, limit, kind, _result_limit(task))
        spec, limit, kind, max_result = known
        policy = spec.policy if spec is not None else DEFAULT_POLICY
        return Plan(spec, limit, kind, policy.delay(lease.attempts) if policy.backoff else None,
                    max_result, spec.abort_grace if spec is not None else None)

    def prepare(self, lease: Lease) -> tuple[Callable[..., Any], list[Any], dict[str, Any]]:
        """Look the task up and decode its arguments; raises for a job that can never run."""
        if not lease.task:
            raise UnknownTask("unknown task '': not registered in this worker (the job's row "
                              "has no task name)")
        task = self.registry.get(lease.task)
        args, kwargs = serialization.loads_args(lease.payload)
        why = misfit(task.spec.fn, args, kwargs)
        if why is not None:
            raise TypeError(f"arguments do not fit {lease.task}{why}")
        return task.spec.fn, args, kwargs

    def time_limit(self, lease: Lease) -> float:
        return self.plan(lease).time_limit

    # -- running ------------------------------------------------------------------------
    def execute(self, lease: Lease, qi: int = 0, plan: Plan | None = None) -> Executed:
        """Run one job here (an async task to its end on the loop). On a success returns
        its result JSON for the caller to ack; a failure went through the fence."""
        return _to_end(self.run(lease, qi, plan or self.plan(lease), on_loop=False))

    async def run(self, lease: Lease, qi: int, plan: Plan, *, on_loop: bool) -> Executed:
        """The one body of running a job, for the sync drain (``execute``) and the async
        one (async_child.py): look it up, make its context current, fire task_started,
        run it, then encode its result or settle its failure.

        ``on_loop``: the async drain awaits an async task on its running loop. Else the
        task is called right here (an async one run to its end on the runner's loop) and
        nothing in this body is awaited, so ``execute`` finishes it without a loop; a
        time-limit SIGTERM may then raise into the task (``current``, ``in_task``).
        """
        ctx = JobContext(lease, self.queues[qi])
        with tracing.processing(ctx, lease.payload):   # a no-op unless the app traces
            return await self._run(ctx, lease, qi, plan, on_loop)

    async def _run(self, ctx: JobContext, lease: Lease, qi: int, plan: Plan,
                   on_loop: bool) -> Executed:
        try:
            fn, args, kwargs = self.prepare(lease)
        except (UnknownTask, SerializationError, TypeError) as exc:
            return Executed(None, self.cannot_run(ctx, qi, exc), ctx)
        ctx.args, ctx.kwargs = tuple(args), dict(kwargs)
        token = set_current(ctx)
        self.running[lease.nonce] = ctx
        if not on_loop:
            self.current = lease
        try:
            self.fire("task_started", ctx)
            if on_loop:
                value = await limited(fn(*args, **kwargs), plan.time_limit, _soft(plan))
            else:
                value = self._call_here(fn, args, kwargs, plan, ctx)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            if ctx.aborted:
                return Executed(None, self.aborted(ctx, qi, exc), ctx)
            return Executed(None, self.failed(ctx, qi, exc, plan), ctx)
        finally:
            self.running.pop(lease.nonce, None)
            reset_current(token)
        ctx.result = value
        if ctx.aborted:   # it returned after the abort (a loop that checked ctx.aborted)
            return Executed(None, self.aborted(ctx, qi, None), ctx)
        return self.encode(ctx, qi, value, plan)

    def abort_asked(self, nonce: str) -> JobContext | None:
        """The master asked to abort the attempt ``nonce``: its context, marked aborted,
        if it runs here now (else None: it ended, or it is not this child's)."""
        ctx = self.running.get(nonce)
        if ctx is not None:
            ctx.aborted = True
        return ctx

    def aborted(self, ctx: JobContext, qi: int, exc: BaseException | None) -> Outcome:
        """An aborted attempt ends ``aborted`` (fenced: STALE if the lease was lost), never
        retried; the failure hook task_dead fires with ``ctx.exception`` an Aborted."""
        lease = ctx._lease
        reason = Aborted(f"job {lease.id} was aborted while running (attempt "
                         f"{lease.attempts})")
        if exc is not None and not isinstance(exc, Aborted):
            reason.__cause__ = exc
        ctx.exception = exc if isinstance(exc, Aborted) else reason
        if isinstance(exc, Aborted):   # where the task was stopped, in its traceback
            error = _describe(exc)
        elif exc is None:
            error = _describe(reason)
        else:
            error = f"Aborted: {reason} (it then raised {type(exc).__name__}: {exc})\n"
        verdict = self.call(self.queues[qi].abort_end, lease, error)
        name = "aborted" if verdict else "stale"
        log.warning("job %s (%s, queue %s) %s", lease.id, _brief(lease.task, 120), ctx.queue,
                    name, extra=logs.context_extra(ctx, name))
        if verdict:
            self.fire("task_dead", ctx)
        return Outcome(lease.id, name, error)

    def _call_here(self, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any],
                   plan: Plan, ctx: JobContext) -> Any:
        self.in_task = True
        try:
            if ctx.aborted:   # the abort came before the task began: it does not begin
                raise Aborted(f"job {ctx.id} was aborted before its task began")
            if plan.kind == ASYNC:
                loop = self.loop()
                self.here = loop.create_task(
                    limited(fn(*args, **kwargs), plan.time_limit, _soft(plan)))
                return loop.run_until_complete(self.here)
            with soft_limit.alarm(_soft(plan)):
                return fn(*args, **kwargs)
        finally:
            self.in_task = False
            self.here = None

    def encode(self, ctx: JobContext, qi: int, value: Any, plan: Plan) -> Executed:
        """The result's JSON, to acknowledge. One JSON cannot encode makes the job dead at
        once (it would fail again); one over the size limit fails the attempt, retried or
        dead by the retry policy (a later run may return less)."""
        try:
            return Executed(serialization.dumps_result(value, plan.max_result), None, ctx)
        except ResultTooLarge as exc:
            return Executed(None, self.failed(ctx, qi, exc, plan), ctx)
        except SerializationError as exc:
            return Executed(None, self.cannot_run(ctx, qi, exc), ctx)

    def acked(self, lease: Lease, qi: int, acked: bool, ctx: JobContext | None) -> None:
        """After a success's ack: its hook, or, for a stale ack, one log line (the lease had
        expired and the job was handed on; nothing of this run was stored). The server
        counts stale acks for stats()."""
        if not acked:
            log.warning("job %s (%s, queue %s) finished, but its ack was stale: its lease "
                        "had expired and the job was handed on; this run's result was not "
                        "stored", lease.id, _brief(lease.task, 120), self.queues[qi].name,
                        extra=logs.job_extra(lease.id, lease.task, self.queues[qi].name,
                                             lease.group, lease.attempts, outcome="stale"))
        elif ctx is not None:
            if log.isEnabledFor(logs.done_level):
                log.log(logs.done_level, "job %s (%s, queue %s) done", lease.id,
                        _brief(lease.task, 120), ctx.queue,
                        extra=logs.context_extra(ctx, "done"))
            self.fire("task_succeeded", ctx)

    def ack(self, ack: Callable[[], T], ctx: JobContext | None, qi: int,
            plan: Plan) -> T | None:
        """Acknowledge a success by ``ack`` (through ``call``). An ack the server refuses for
        good — an error reply, or a call it keeps cutting off while it answers others (a
        result over its proto-max-bulk-len) — is not sent again and again: the attempt
        fails with AckRefused, by the retry policy, and None is returned."""
        try:
            return self.call(ack)   # type: ignore[no-any-return]
        except TRANSIENT:
            raise          # only when the child gives up (its master is gone)
        except (Refused, ResponseError) as exc:
            if ctx is None:
                raise
            self.failed(ctx, qi, AckRefused(f"the server refused the job's result: {exc}"),
                        plan)
            return None

    def cannot_run(self, ctx: JobContext, qi: int, exc: BaseException) -> Outcome:
        """A job that can never run (unknown task, bad payload or result): dead at once."""
        ctx.exception = exc
        return self._settle(ctx, qi, f"{type(exc).__name__}: {exc}", None, True)

    def failed(self, ctx: JobContext, qi: int, exc: BaseException, plan: Plan) -> Outcome:
        """The task raised: a retry after the policy's delay (a Retry's own wins), or dead
        at once for an exception the policy does not retry."""
        ctx.exception = exc
        policy = plan.spec.policy if plan.spec is not None else DEFAULT_POLICY
        if isinstance(exc, RateLimited):
            return self._back_off(ctx, qi, exc)
        if ctx.give_up or isinstance(exc, MaxRetriesExceededError):
            # Task.retry() past max_retries: dead now, whatever the policy says of exc
            return self._settle(ctx, qi, _describe(exc, "max_retries reached"), None, True)
        if isinstance(exc, Reject):   # Celery's: dead at once, or again now (an attempt)
            return self._settle(ctx, qi, _describe(exc), 0.0 if exc.requeue else None,
                                not exc.requeue)
        if isinstance(exc, Retry):
            delay = exc.delay if exc.delay is not None else plan.retry_delay
            return self._settle(ctx, qi, _describe(exc), delay, False)
        if policy.retries(exc):
            return self._settle(ctx, qi, _describe(exc), plan.retry_delay, False)
        return self._settle(ctx, qi, _describe(exc, policy.why_not(exc)), None, True)

    def _settle(self, ctx: JobContext, qi: int, error: str, delay: float | None,
                final: bool) -> Outcome:
        lease = ctx._lease
        self.noting(lease, error, delay, final)
        # the failing run's span (None untraced): the row keeps it for the next run's link
        verdict = self.call(self.queues[qi].retry, lease, error, delay, final,
                            tracing.traceparent())
        name = verdict.outcome
        log.warning("job %s (%s, queue %s) failed, %s: %s", lease.id,
                    _brief(lease.task, 120), ctx.queue, name,
                    _brief(error.strip().splitlines()[-1] if error.strip() else error),
                    extra=logs.context_extra(ctx, name))
        if name in ("retry", "dead"):
            self.fire("task_retried" if name == "retry" else "task_dead", ctx)
        return Outcome(lease.id, name, error)

    def _back_off(self, ctx: JobContext, qi: int, exc: RateLimited) -> Outcome:
        """The task hit an outside limit: the job goes back to the head of its lane without
        spending an attempt and its group sits out the delay (fenced: STALE if the lease
        was lost meanwhile). Not a retry: no hook fires."""
        lease = ctx._lease
        reason = f"{RateLimited.__name__}: {exc}"
        verdict = self.call(self.queues[qi].release, lease, reason, exc.delay)
        name = "rate_limited" if verdict else "stale"
        log.info("job %s (%s, queue %s) %s: group %s sits out %gs", lease.id,
                 _brief(lease.task, 120), ctx.queue, name, _brief(lease.group, 120), exc.delay,
                 extra=logs.context_extra(ctx, name))
        return Outcome(lease.id, name, reason)

    # -- hooks and the loop -----------------------------------------------------------------
    def fire(self, event: str, *args: Any) -> None:
        if self.hooks.has(event):
            self.hooks.fire(event, *args, run=self._run_hook)

    def _run_hook(self, coro: Awaitable[Any]) -> None:
        loop = self.loop()
        if loop.is_running():   # an async child: the hook runs beside the jobs
            task = loop.create_task(_as_coroutine(coro))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        else:
            loop.run_until_complete(coro)

    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop this runner keeps for its life (made on first use)."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
        return self._loop

    def close(self) -> None:
        """Close the event loop this runner made, if it made one. A child's runner lives as
        long as its process; one run in a caller's process (emqtasks.testing's run_pending)
        gives the thread's loop back unset rather than leak it."""
        if self._loop is None or self._loop.is_running():
            return
        asyncio.set_event_loop(None)   # loop() made it the thread's loop
        self._loop.close()
        self._loop = None

    def run_once(self) -> Outcome | None:
        """Claim one job, run it, settle it. For tests and scripts: None when nothing waits."""
        leases = self.queue.claim(1)
        if not leases:
            return None
        result, outcome, ctx = self.execute(leases[0])
        if outcome is not None:
            return outcome
        acked, _ = self.queue.ack(leases[0], result or "null", span=tracing.span_of(ctx))
        self.acked(leases[0], 0, bool(acked), ctx)
        return Outcome(leases[0].id, "done" if acked else "stale")


async def limited(coro: Awaitable[Any], limit: float, soft: float | None = None) -> Any:
    """Await coro; past ``limit`` seconds (0: none) cancel it and raise TimeLimitExceeded.
    A coroutine that ignores the cancellation keeps this waiting: the master then kills the
    child (the job is retried through the fence). Past ``soft`` seconds SoftTimeLimitExceeded
    is thrown into it (soft_limit.py)."""
    if soft:
        coro = soft_limit.soft_limited(coro, soft)
    if limit <= 0:
        return await coro
    task = asyncio.ensure_future(coro)
    try:
        done, _ = await asyncio.wait({task}, timeout=limit)
    except asyncio.CancelledError:
        task.cancel()   # this run was cancelled (an abort): the task's coroutine with it
        raise
    if task in done:
        return task.result()
    task.cancel()
    try:
        await task
    except BaseException:   # its CancelledError, or whatever it raised while cancelled
        pass
    raise TimeLimitExceeded(f"ran past its time limit of {limit:g}s")


def _to_end(coro: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that awaits nothing (``Runner.run`` off the loop), run
    here: its first step runs it to its return (a step by next(), not .send(): the package
    calls no send() but the pipes' send_bytes, tests/test_security.py)."""
    try:
        next(coro.__await__())
    except StopIteration as done:
        result: T = done.value
        return result
    coro.close()
    raise RuntimeError("Runner.run awaited off the event loop")


async def _as_coroutine(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def every_task() -> Registry:
    """One table of the tasks of every App in this process (DuplicateTaskName if two Apps
    give one name to different functions)."""
    from ..producer.app import all_apps

    return Registry.merged(app.registry for app in all_apps())


def every_hook() -> Hooks:
    """The hooks of every App in this process, in one table."""
    from ..producer.app import all_apps

    return Hooks.merged(app.hooks for app in all_apps())


def _result_limit(task: Any) -> int:
    """The result limit of a registered task: its own, else its App's."""
    own = task.spec.max_result_bytes if task is not None else None
    if own is not None:
        return int(own)
    app = getattr(task, "app", None)
    return int(app.settings.max_result_bytes) if app is not None else Settings.max_result_bytes


def _soft(plan: Plan) -> float | None:
    return plan.spec.soft_time_limit if plan.spec is not None else None


def _brief(text: str, limit: int = LOG_TEXT_MAX) -> str:
    """Text cut for a log line: an error message may quote a whole payload (the row keeps
    the full text; logs get the start of it and its length). A lone surrogate (an exception
    message may hold one) is escaped: a handler writing UTF-8 would fail on the line."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def _describe(exc: BaseException, note: str = "") -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"{type(exc).__name__}: {exc}{f' ({note})' if note else ''}\n{text}"
