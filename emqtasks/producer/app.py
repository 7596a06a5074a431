"""App: settings, the Redis connection, its own task registry, ``@app.task``, admin verbs."""

from __future__ import annotations

import contextlib
import inspect
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from .. import validate
from ..config import Settings
from ..errors import InvalidArgument, InvalidSchedule, UnknownSchedule, UnknownTask
from ..observe import history, lanes
from ..schedules import schedule as _sched
from ..schedules.schedule import Schedule, ScheduleInfo, ScheduleStore
from ..store.connection import connect
from ..store.durable import Durable, durable_of
from ..store.keys import check_job_id as validate_job_id
from ..store.keys import check_queue_name
from ..store.queue import Queue
from ..store.settings import SETTINGS
from ..verdicts import AbortVerdict, CancelVerdict
from ..workflows.canvas import Signature, WorkflowHandle
from . import bound
from .abort import abort as abort_job
from .hooks import EVENTS, F, HookEvent, Hooks
from .registry import (
    GroupSpec,
    Registry,
    ScheduleSpec,
    TaskOptions,
    TaskSpec,
    set_default_app,
    split_options,
)
from .retry_policy import RetryPolicy
from .task import JobHandle, SendOptions, Task, asend, send

if TYPE_CHECKING:
    # Python 3.10 has no typing.Unpack; the annotations are never evaluated at run time.
    from typing_extensions import Unpack

    from ..store.aqueue import AsyncQueue
    from .aio import LoopClients

__all__ = ["App", "GroupSpec", "ScheduleSpec", "TaskOptions", "all_apps", "default_app",
           "on", "pointed_at", "task"]

P = ParamSpec("P")
R = TypeVar("R")
_apps: list[App] = []


class App:
    """Settings, one Redis client, and the tasks registered through it.

    Nothing connects until the first enqueue or admin call, so importing a tasks module is
    free of I/O and a worker can point the app elsewhere first (``configure``). Each App has
    its own registry: two Apps may register the same function independently.
    """

    def __init__(self, redis_url: str | None = None, queue: str | None = None,
                 max_payload_bytes: int | None = None,
                 max_result_bytes: int | None = None,
                 durable: bool | Durable | None = None,
                 autopipeline: bool | None = None) -> None:
        if max_payload_bytes is not None:   # checked now; the rest of Settings on first use
            validate.integer(max_payload_bytes, "max_payload_bytes")
        if max_result_bytes is not None:
            validate.result_bytes(max_result_bytes)
        # durable: None reads EMQ_DURABLE; True / Durable(...) / False (off) decide
        if durable is not None:
            durable_of(durable)   # checked now
        self._explicit: dict[str, Any] = {"redis_url": redis_url, "queue": queue,
                                          "max_payload_bytes": max_payload_bytes,
                                          "max_result_bytes": max_result_bytes,
                                          "durable": durable,
                                          # None reads EMQ_AUTOPIPELINE (off by default)
                                          "autopipeline": autopipeline}
        self._settings: Settings | None = None
        self._client: Any = None
        self._queues: dict[str, Queue] = {}
        self._aio: LoopClients | None = None    # the async clients, one per event loop
        self._lock = threading.Lock()
        self.registry = Registry()
        #: Schedules declared in code (decorator, or App.schedule while a worker imports its
        #: modules): the worker stores them at start.
        self.declared_schedules: dict[str, Schedule] = {}
        #: The queue of a declared schedule whose jobs go elsewhere than its task's queue
        #: (emqtasks.celery's beat_schedule ``options={"queue": ...}``).
        self.declared_queues: dict[str, str] = {}
        self.hooks = Hooks()
        _apps.append(self)

    # -- configuration ------------------------------------------------------------------
    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = Settings.from_env(None, **self._explicit)
        return self._settings

    @property
    def explicit(self) -> dict[str, Any]:
        """The settings given to the constructor (None where the environment decides)."""
        return dict(self._explicit)

    @property
    def tasks(self) -> dict[str, Task[Any, Any]]:
        """Task name -> Task, of this App."""
        return self.registry.tasks()

    def configure(self, **changes: Any) -> App:
        """Replace settings (None leaves one as is); drops the connection."""
        self._settings = self.settings.with_(**changes)
        self.close()
        return self

    @property
    def client(self) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = connect(self.settings.redis_url)
        return self._client

    def queue(self, name: str | None = None) -> Queue:
        """The verbs of a queue on this app's server (default: the app's queue)."""
        name = self.settings.queue if name is None else name   # "" is refused, not defaulted
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = Queue(self.client, name,
                                           autopipeline=self.settings.autopipeline)
        return q

    def close(self) -> None:
        """Close the blocking client; the async ones are dropped (``await aclose()`` in a
        loop closes that loop's)."""
        if self._client is not None:
            self._client.close()
        self._client = None
        self._queues = {}
        if self._aio is not None:
            self._aio.forget()

    # -- the async side: a redis.asyncio client per event loop (producer/aio.py) ------------
    def aqueue(self, name: str | None = None) -> AsyncQueue:
        """The producer's verbs of a queue on the running event loop's async client (made
        on first use, without I/O); the object is that loop's (WrongEventLoop elsewhere)."""
        name = self.settings.queue if name is None else name
        if self._aio is None:
            # redis.asyncio's part of emqtasks, imported on the first async call
            from .aio import LoopClients

            with self._lock:
                if self._aio is None:
                    self._aio = LoopClients()
        return self._aio.queue(self.settings.redis_url, name, self.settings.autopipeline)

    async def aopen(self) -> None:
        """Open the running loop's pool now (one round trip, so a wrong URL or a server
        down fails here, at an ASGI app's start, not at its first request)."""
        await self.aqueue().ping()

    async def aclose(self) -> None:
        """Close the running loop's pool; a later async call in this loop opens another."""
        if self._aio is not None:
            await self._aio.aclose()

    async def asend_task(self, task: str | Task[Any, Any], args: Iterable[Any] = (),
                         kwargs: dict[str, Any] | None = None, *, job_id: str | None = None,
                         group: str | None = None, countdown: float | None = None,
                         eta: datetime | float | None = None, queue: str | None = None,
                         priority: int = 0,
                         expires: datetime | float | None = None,
                         durable: bool | Durable | None = None,
                         tenant: str | None = None, unique_key: str | None = None,
                         unique_for: float | None = None, debounce: float | None = None,
                         debounce_max: float | None = None) -> JobHandle[Any]:
        """send_task(), awaited."""
        spec = task.spec if isinstance(task, Task) else self._spec_for(validate.task_name(task))
        return await asend(self, spec, args, kwargs, SendOptions(
            queue=queue, job_id=job_id, group=group, countdown=countdown, eta=eta,
            priority=priority, expires=expires, durable=durable, tenant=tenant,
            unique_key=unique_key, unique_for=unique_for, debounce=debounce,
            debounce_max=debounce_max))

    async def astats(self) -> dict[str, Any]:
        """stats(), awaited."""
        q = self.aqueue()
        return await q.run(lanes.stats_plan(q.keys))

    async def acancel(self, job_id: str) -> CancelVerdict:
        """cancel(), awaited."""
        return await self.aqueue().cancel(job_id)

    async def ajob(self, job_id: str) -> dict[str, Any] | None:
        """job(), awaited."""
        return await self.aqueue().job(job_id)

    # -- hooks --------------------------------------------------------------------------
    def on(self, event: HookEvent) -> Callable[[F], F]:
        """Register a hook: ``@app.on("task_dead")`` (see emqtasks.hooks for the events).
        An unknown event is InvalidArgument at decoration."""
        if event not in EVENTS:
            raise InvalidArgument(f"unknown hook event {event!r}: one of {', '.join(EVENTS)}")

        def register(fn: F) -> F:
            self.hooks.add(event, fn)
            return fn

        return register

    # -- tasks --------------------------------------------------------------------------
    @overload
    def task(self, fn: None = None, /, **options: Unpack[TaskOptions],
             ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    @overload
    def task(self, fn: Callable[P, R], /, **options: Unpack[TaskOptions]) -> Task[P, R]: ...

    def task(self, fn: Callable[..., Any] | None = None, /,
             **options: Unpack[TaskOptions]) -> Any:
        """Register a function (or an ``async def`` coroutine function) as a task; usable
        as ``@app.task`` or ``@app.task(...)``. The options: registry.TaskOptions (their
        defaults: TaskSpec's and RetryPolicy.of's).

        ``max_result_bytes`` caps the JSON of its result (None: the App's, 1 MB by default);
        a larger result fails the attempt with ResultTooLarge.

        Celery's options are taken too (producer/celery_options.py): ``bind=True`` (the
        Task first: ``self.request``, ``self.retry``), ``autoretry_for``, ``max_retries``,
        ``default_retry_delay``, ``soft_time_limit``, ``rate_limit`` (a rate of the task's
        group), ``ignore_result``, ``acks_late=True``; one with no meaning here is
        InvalidArgument naming what to use.

        ``schedule`` (a task that takes no arguments) runs it periodically under a schedule
        named after the task, stored when a worker starts: ``emqtasks.cron(...)``,
        ``emqtasks.every(...)``, a cron string, or seconds.
        """
        return self._task(fn, options, Task)

    def _task(self, fn: Callable[..., Any] | None, options: Mapping[str, Any],
              task_class: type[Task[Any, Any]]) -> Any:
        """``task()`` making each Task of ``task_class`` (emqtasks.celery's ``base=``): its
        ``wraps`` gives the function the queue runs."""
        # At decoration: an unknown option is a TypeError, a bad retry policy or schedule
        # InvalidArgument / a ScheduleError; the rest are checked by TaskSpec at registration.
        spec_options, policy_options, schedule = split_options(options)
        policy = RetryPolicy.of(**policy_options)
        timing = None if schedule is None else _sched.declared_timing(schedule)
        name = spec_options.pop("name", None)

        def register(f: Callable[..., Any]) -> Task[Any, Any]:
            if spec_options.get("queue") is not None:
                check_queue_name(spec_options["queue"])   # at registration, not at delay()
            # TaskSpec checks the options (validate.py): a bad one fails here, at import.
            made: list[Task[Any, Any]] = []
            # bind=True: the function the queue runs passes the Task first (bound.py)
            fn_run = bound.bind(f, lambda: made[0]) if spec_options.get("bind") else f
            fn_run = task_class.wraps(fn_run, lambda: made[0])
            spec = TaskSpec(name=f"{_module_name(f)}.{f.__qualname__}" if name is None
                            else name, fn=fn_run, policy=policy,
                            is_async=inspect.iscoroutinefunction(f), **spec_options)
            declared = None
            if timing is not None:   # checked before the task is registered
                declared = _sched.make_schedule(spec.name, spec.name, timing=timing, fn=spec.fn)
            t: Task[Any, Any] = task_class(self, spec)
            made.append(t)
            self.registry.add(t)
            if declared is not None:
                self.declared_schedules[declared.name] = declared
            return t

        return register(fn) if fn is not None else register

    def send_task(self, task: str | Task[Any, Any], args: Iterable[Any] = (),
                  kwargs: dict[str, Any] | None = None, *, job_id: str | None = None,
                  group: str | None = None, countdown: float | None = None,
                  eta: datetime | float | None = None, queue: str | None = None,
                  priority: int = 0,
                  expires: datetime | float | None = None,
                  durable: bool | Durable | None = None,
                  tenant: str | None = None, unique_key: str | None = None,
                  unique_for: float | None = None, debounce: float | None = None,
                  debounce_max: float | None = None) -> JobHandle[Any]:
        """Enqueue a call by task name (or Task) on this app's server.

        A name registered on this App (else on another App of this process) keeps its
        options (group function, attempts, lease...); an unknown name is sent with the
        defaults of ``@task``, for a worker elsewhere that knows it. Raises LaneFull
        (nothing written) when the job's lane holds its cap of waiting jobs, CorruptKey
        (nothing written) when a key it would write holds the wrong type. ``expires``: as
        ``Task.apply_async``'s, and so are ``durable``, ``unique_key``, ``unique_for``,
        ``debounce`` and ``debounce_max``;
        ``tenant`` (the group's tenant, else the task's).
        """
        spec = task.spec if isinstance(task, Task) else self._spec_for(validate.task_name(task))
        return send(self, spec, args, kwargs, SendOptions(
            queue=queue, job_id=job_id, group=group, countdown=countdown, eta=eta,
            priority=priority, expires=expires, durable=durable, tenant=tenant,
            unique_key=unique_key, unique_for=unique_for, debounce=debounce,
            debounce_max=debounce_max))

    def _spec_for(self, name: str) -> TaskSpec:
        return self._local_spec(name) or TaskSpec(name=name, fn=_not_here)

    def _local_spec(self, name: str) -> TaskSpec | None:
        """The spec of a task registered in this process (this App first), or None."""
        for app in (self, *_apps):
            if name in app.registry:
                spec: TaskSpec = app.registry.get(name).spec
                return spec
        return None

    # -- periodic schedules -----------------------------------------------------------------
    def schedule(self, name: str, task: str | Task[Any, Any], *, cron: str | None = None,
                 every: float | timedelta | None = None, args: Iterable[Any] = (),
                 kwargs: Mapping[str, Any] | None = None, group: str | None = None,
                 tz: str = "UTC", catchup: str = "latest", jitter: float = 0.0,
                 overlap: bool = True) -> Schedule:
        """Call ``task`` periodically: ``cron`` (5 fields, read in ``tz``) or ``every``
        seconds; each slot is enqueued once, whatever the number of workers.

        Called while a worker imports its modules, this declares the schedule and the
        worker stores it at start; anywhere else it is stored now (replacing one of that
        name) and running workers pick it up within one tick. Bad values raise a named
        ``ScheduleError`` (or ``UnknownTask``) quoting them, and nothing is stored.
        """
        task_name = task.name if isinstance(task, Task) else task
        spec = task.spec if isinstance(task, Task) else (
            self._local_spec(task) if isinstance(task, str) else None)
        s = _sched.make_schedule(name, task_name, cron=cron, every=every, tz=tz,
                                 args=tuple(args), kwargs=kwargs, group=group,
                                 catchup=catchup, jitter=jitter, overlap=overlap,
                                 fn=spec.fn if spec else None,
                                 limit=self.settings.max_payload_bytes)
        if _sched.deferring():
            self.declared_schedules[s.name] = s
            return s
        store = self._store(spec.queue if spec else None)
        if spec is None and store.task_known(task_name) is None:
            raise UnknownTask(f"unknown task {task_name!r}: not registered in this process, "
                              f"and no worker of queue {store.queue.name!r} serves it")
        store.put(s, origin="runtime")
        return s

    def unschedule(self, name: str, queue: str | None = None) -> bool:
        """Remove a stored schedule (running workers stop it within one tick); False if
        there was none. Jobs it enqueued already stay."""
        return self._store(queue).drop(name)

    def schedules(self, queue: str | None = None) -> list[ScheduleInfo]:
        """The schedules stored on the queue: name, task, spec, tz, next run, last slot's
        job id and its state (also with no worker running)."""
        return self._store(queue).infos()

    def run_schedule(self, name: str, queue: str | None = None) -> JobHandle[Any]:
        """Enqueue one extra run of a schedule now, with an id of its own."""
        store = self._store(queue)
        s = store.get(name)
        if s is None:
            raise UnknownSchedule(f"no schedule {name!r} on queue {store.queue.name!r}")
        spec = self._local_spec(s.task)
        if spec is None:
            options = store.task_known(s.task)
            if options is None:
                raise UnknownTask(f"schedule {name!r} names task {s.task!r}, which no worker "
                                  f"of queue {store.queue.name!r} serves")
            spec, group_fn = _sched.spec_from_options(s.task, options)
            if group_fn and s.group is None:
                raise InvalidSchedule(
                    f"task {s.task} picks its group with a function that only its module "
                    f"can run: run this where the module is imported (-A), or give "
                    f"schedule {name!r} a group")
        job_id, duplicate = _sched.run_now(store, s, spec, self.settings.max_payload_bytes,
                                           self.settings.durable)
        return JobHandle(store.queue, job_id, "duplicate" if duplicate else "enqueued", self)

    def _store(self, queue: str | None = None) -> ScheduleStore:
        return ScheduleStore(self.queue(queue))

    # -- admin verbs on the app's queue ------------------------------------------------------
    def pause(self) -> None:
        self.queue().pause()

    def resume(self) -> None:
        self.queue().resume()

    def pause_group(self, group: str) -> bool:
        return self.queue().pause_group(group)

    def resume_group(self, group: str) -> bool:
        return self.queue().resume_group(group)

    def set_group_limit(self, group: str, limit: int | None) -> None:
        self.queue().set_group_limit(group, limit)

    def set_group_weight(self, group: str, weight: int | None) -> None:
        self.queue().set_group_weight(group, weight)

    def set_tenant_weight(self, tenant: str, weight: int | None) -> None:
        """The tenant's consecutive claims per turn of the ring of tenants (None: 1)."""
        self.queue().set_tenant_weight(tenant, weight)

    def set_tenant_limit(self, tenant: str, limit: int | None) -> None:
        """At most ``limit`` of the tenant's jobs in flight over all its groups (None:
        none); at its limit the tenant sits out until one of its jobs leaves flight."""
        self.queue().set_tenant_limit(tenant, limit)

    def set_tenant_rate(self, tenant: str, max_jobs: int | None, per: float = 1.0) -> None:
        """At most ``max_jobs`` starts over all the tenant's groups in any window of ``per``
        seconds (None clears it); a tenant past it sits out of the ring of tenants until its
        next start is due."""
        self.queue().set_tenant_rate(tenant, max_jobs, per)

    def set_tenant_max_size(self, tenant: str, max_size: int | None) -> None:
        """Cap the jobs waiting over all the tenant's groups: an enqueue past it is refused
        (LaneFull, nothing written); None clears it."""
        self.queue().set_tenant_max_size(tenant, max_size)

    def tenant_shares(self, minutes: int = 5) -> dict[str, Any]:
        """Per tenant over the last ``minutes`` (from the history): its claims, its share of
        them and the share its weight entitles it to; Jain's index per minute
        (observe/tenants.py)."""
        from ..observe import tenants

        return tenants.shares(self.queue(), minutes)

    def set_tenant_defaults(self, limit: int | None = None, weight: int | None = None,
                            rate: tuple[int, float] | str | None = None,
                            max_size: int | None = None) -> None:
        """A limit, weight, rate ((max_jobs, per) or "10/s") and/or max_size for every
        tenant without its own, including tenants that do not exist yet; a None argument
        leaves that default as it is (``clear_tenant_defaults`` clears)."""
        q = self.queue()
        given: tuple[tuple[str, Any], ...] = (("limit", limit), ("weight", weight),
                                              ("rate", rate), ("max_size", max_size))
        for name, value in given:
            if value is not None:
                q.set_tenant_default(name, value)

    def clear_tenant_defaults(self, *names: str) -> None:
        """Clear the named tenant defaults ("limit", "weight", "rate", "max_size"), or all."""
        for name in names or ("limit", "weight", "rate", "max_size"):
            self.queue().set_tenant_default(name, None)

    def tenant_defaults(self) -> dict[str, Any]:
        return self.queue().tenant_defaults()

    def pause_tenant(self, tenant: str) -> bool:
        """Park every group of the tenant (their backlog and in-flight work stay)."""
        return self.queue().pause_tenant(tenant)

    def resume_tenant(self, tenant: str) -> bool:
        return self.queue().resume_tenant(tenant)

    def tenant(self, tenant: str) -> dict[str, Any]:
        """A tenant's groups, backlog, jobs in flight, controls, and why it waits; ``wait``:
        its wait p50 / p95 / p99 (ms) and starts over the last 1, 5 and 60 minutes (keys
        "1m", "5m", "60m"), ``oldest_age``: its oldest waiting job's age (s)."""
        from ..observe import tenants

        return tenants.tenant_view(self.queue(), tenant)

    def set_fairness(self, mode: str) -> int:
        """"turns" (the default: one claim per backlogged group per turn of the ring) or
        "time" (each backlogged group gets a share of the worker time proportional to its
        weight, whatever the length of its jobs). Raises InvalidArgument for another mode."""
        return self.queue().set_fairness(mode)

    def fairness(self) -> str:
        """The queue's fairness mode, "turns" or "time"."""
        return self.queue().fairness()

    def set_group_rate(self, group: str, max_jobs: int | None, per: float = 1.0) -> None:
        """At most ``max_jobs`` of the group's jobs start in any window of ``per`` seconds
        (a burst of max_jobs allowed); ``None`` clears the group's own rate."""
        self.queue().set_group_rate(group, max_jobs, per)

    def set_group_max_size(self, group: str, max_size: int | None) -> None:
        """Cap the group's waiting jobs; ``None`` clears the group's own cap."""
        self.queue().set_group_max_size(group, max_size)

    def set_group_defaults(self, limit: int | None = None,
                           rate: tuple[int, float] | None = None,
                           max_size: int | None = None, weight: int | None = None) -> None:
        """Settings for every group without one of its own, including groups that do not
        exist yet; explicit settings win. A None argument leaves that default as it is
        (``clear_group_defaults`` clears)."""
        given = {"limit": limit, "rate": rate, "max_size": max_size, "weight": weight}
        values = {k: v for k, v in given.items() if v is not None}
        if values:
            self.queue().set_group_defaults(**values)

    def clear_group_defaults(self, *names: str) -> None:
        """Clear the named defaults (limit, rate, max_size, weight), or all of them."""
        self.queue().set_group_defaults(**{n: None for n in names or SETTINGS})

    def group_defaults(self) -> dict[str, Any]:
        return self.queue().group_defaults()

    def lane(self, group: str) -> dict[str, Any]:
        """Why is this lane waiting: one group's stats() row, without scanning the queue."""
        return lanes.lane(self.queue(), group)

    def stats(self) -> dict[str, Any]:
        """Queue totals, groups, tenants (each with its ``wait`` percentiles: App.tenant)."""
        from ..observe import tenants

        q = self.queue()
        return tenants.with_waits(q, lanes.stats(q))

    def dead_jobs(self, limit: int = 100) -> list[dict[str, Any]]:
        return self.queue().dead_jobs(limit)

    def requeue_dead(self, job_id: str | None = None) -> int:
        return self.queue().requeue_dead(job_id)

    def cancel(self, job_id: str) -> CancelVerdict:
        return self.queue().cancel(job_id)

    def abort(self, job_id: str, queue: str | None = None) -> AbortVerdict:
        """Stop a job: a running one within about a second (its task gets ``Aborted``, the
        job ends ``aborted``), one not started is cancelled. ABORTING, CANCELLED or
        FINISHED; UnknownJob for an id the queue has no row of."""
        return abort_job(self.queue(queue), validate_job_id(job_id))

    def purge(self) -> int:
        return self.queue().purge()

    def workflow(self, workflow_id: str, queue: str | None = None) -> WorkflowHandle:
        """Follow a workflow by id: ``get``, ``status``, ``steps`` (state, job id, attempts of
        each), ``cancel``."""
        return WorkflowHandle(self.queue(queue), validate_job_id(workflow_id), app=self)

    def signature(self, name: str, *args: Any, **kwargs: Any) -> Signature:
        """A signature by task name (checked against the registry when enqueued)."""
        return Signature(validate.task_name(name), args, kwargs, app=self)

    def job(self, job_id: str) -> dict[str, Any] | None:
        return self.queue().job(job_id)

    def set_history(self, hours: int = 24, max_groups: int = 1000,
                    queue: str | None = None) -> None:
        """Keep ``hours`` (default 24; 0: off) of per-minute history in the server: per
        task and per group, jobs enqueued, started, succeeded, retried, dead, and wait and
        run times. At most ``max_groups`` groups are tracked per minute; the rest of a
        tenant flood is counted together as the other groups."""
        self.queue(queue).set_history(hours, max_groups)

    def history(self, minutes: int = 60, queue: str | None = None) -> dict[str, Any]:
        """The last ``minutes`` minutes of history: ``minutes`` (per minute totals, oldest
        first), ``total``, ``tasks`` and ``groups`` (each summed over the span), and
        ``other_groups`` (those past the cap)."""
        return history.report(self.queue(queue), minutes)

    def workers(self, queue: str | None = None) -> list[dict[str, Any]]:
        """The live workers (masters) of the queue, from their heartbeats: each a dict of
        id, host, pid, queues, concurrency, busy, version and started (unix seconds)."""
        return self.queue(queue).workers()


def _module_name(fn: Callable[..., Any]) -> str:
    """The importable name of fn's module, also when it runs as a script (``__main__``), so
    the producer script and a worker that imports the same file agree on task names."""
    module: str = fn.__module__
    if module != "__main__":
        return module
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return str(spec.name)
    path = getattr(main, "__file__", None)
    return Path(path).stem if path else module


def _not_here(*_args: Any, **_kwargs: Any) -> None:
    raise UnknownTask("this task is registered in another process: it runs on a worker")


default_app = App()
set_default_app(default_app)


@overload
def task(fn: None = None, /, **options: Unpack[TaskOptions],
         ) -> Callable[[Callable[P, R]], Task[P, R]]: ...


@overload
def task(fn: Callable[P, R], /, **options: Unpack[TaskOptions]) -> Task[P, R]: ...


def task(fn: Callable[..., Any] | None = None, /, **options: Unpack[TaskOptions]) -> Any:
    """Register a task on the default App (settings from EMQ_REDIS_URL / EMQ_QUEUE)."""
    return default_app.task(fn, **options)


def on(event: HookEvent) -> Callable[[F], F]:
    """Register a hook on the default App (the one module-level ``@task`` uses)."""
    return default_app.on(event)


def all_apps() -> list[App]:
    return list(_apps)


@contextlib.contextmanager
def pointed_at(redis_url: str, queue: str) -> Iterator[None]:
    """Within the block, every App of this process enqueues on ``redis_url`` and ``queue``
    (a task's own ``queue=`` still names its queue), as a worker points them at its own;
    after it, each App has its own settings back, still unread if they were (so a later
    change of EMQ_REDIS_URL reaches it as before). The pytest plugin's ``emq_app``."""
    saved = [(app, app._settings) for app in _apps]
    for app, settings in saved:
        app.close()
        # Made from what the App has, never by reading its own settings anew: one whose own
        # are refused (a bad queue name, left by another test) must not stop this one.
        app._settings = settings.with_(redis_url=redis_url, queue=queue) if settings else \
            Settings.from_env({}, **{**app._explicit, "redis_url": redis_url, "queue": queue})
    try:
        yield
    finally:
        for app, settings in saved:
            app.close()
            app._settings = settings
