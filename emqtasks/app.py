"""App: settings, the Redis connection, its own task registry, ``@app.task``, admin verbs."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, ParamSpec, TypeVar, overload

from . import validate
from .config import Settings
from .connection import connect
from .errors import UnknownTask
from .keys import check_queue_name
from .queue import Queue
from .registry import GroupSpec, Registry, TaskSpec
from .task import JobHandle, Task, build_job
from .verdicts import CancelVerdict, EnqueueVerdict

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
                 max_payload_bytes: int | None = None) -> None:
        if max_payload_bytes is not None:   # checked now; the rest of Settings on first use
            validate.integer(max_payload_bytes, "max_payload_bytes")
        self._explicit: dict[str, Any] = {"redis_url": redis_url, "queue": queue,
                                          "max_payload_bytes": max_payload_bytes}
        self._settings: Settings | None = None
        self._client: Any = None
        self._queues: dict[str, Queue] = {}
        self._lock = threading.Lock()
        self.registry = Registry()
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
            q = self._queues[name] = Queue(self.client, name)
        return q

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client = None
        self._queues = {}

    # -- tasks --------------------------------------------------------------------------
    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(self, fn: None = None, /, *, name: str | None = None, group: GroupSpec = None,
             max_attempts: int = 3, retry_delay: float = 1.0, lease: float = 30.0,
             queue: str | None = None, time_limit: float | None = None,
             result_ttl: int = 86_400) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    @overload
    def task(self, fn: Callable[P, R], /, *, name: str | None = None,
             group: GroupSpec = None, max_attempts: int = 3, retry_delay: float = 1.0,
             lease: float = 30.0, queue: str | None = None, time_limit: float | None = None,
             result_ttl: int = 86_400) -> Task[P, R]: ...

    def task(self, fn: Callable[..., Any] | None = None, /, *, name: str | None = None,
             group: GroupSpec = None, max_attempts: int = 3, retry_delay: float = 1.0,
             lease: float = 30.0, queue: str | None = None, time_limit: float | None = None,
             result_ttl: int = 86_400) -> Any:
        """Register a function as a task; usable as ``@app.task`` or ``@app.task(...)``."""

        def register(f: Callable[..., Any]) -> Task[Any, Any]:
            if queue is not None:
                check_queue_name(queue)   # at registration, not at the first delay()
            # TaskSpec checks the options (validate.py): a bad one fails here, at import.
            spec = TaskSpec(name=f"{_module_name(f)}.{f.__qualname__}" if name is None
                            else name, fn=f, group=group, max_attempts=max_attempts,
                            retry_delay=retry_delay, lease=lease, queue=queue,
                            time_limit=time_limit, result_ttl=result_ttl)
            t: Task[Any, Any] = Task(self, spec)
            self.registry.add(t)
            return t

        return register(fn) if fn is not None else register

    def send_task(self, task: str | Task[Any, Any], args: Iterable[Any] = (),
                  kwargs: dict[str, Any] | None = None, *, job_id: str | None = None,
                  group: str | None = None, countdown: float | None = None,
                  eta: datetime | float | None = None,
                  queue: str | None = None) -> JobHandle[Any]:
        """Enqueue a call by task name (or Task) on this app's server.

        A name registered on this App (else on another App of this process) keeps its
        options (group function, attempts, lease...); an unknown name is sent with the
        defaults of ``@task``, for a worker elsewhere that knows it.
        """
        spec = task.spec if isinstance(task, Task) else self._spec_for(validate.task_name(task))
        job = build_job(spec, tuple(args), kwargs or {}, limit=self.settings.max_payload_bytes,
                        job_id=job_id, group=group, countdown=countdown, eta=eta)
        q = self.queue(queue if queue is not None else spec.queue)
        verdict = q.enqueue_many([job])[0]
        return JobHandle(q, job.id, verdict == EnqueueVerdict.DUPLICATE)

    def _spec_for(self, name: str) -> TaskSpec:
        for app in (self, *_apps):
            if name in app.registry:
                spec: TaskSpec = app.registry.get(name).spec
                return spec
        return TaskSpec(name=name, fn=_not_here)

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

    def set_group_weight(self, group: str, weight: int) -> None:
        self.queue().set_group_weight(group, weight)

    def stats(self) -> dict[str, Any]:
        return self.queue().stats()

    def dead_jobs(self, limit: int = 100) -> list[dict[str, Any]]:
        return self.queue().dead_jobs(limit)

    def requeue_dead(self, job_id: str | None = None) -> int:
        return self.queue().requeue_dead(job_id)

    def cancel(self, job_id: str) -> CancelVerdict:
        return self.queue().cancel(job_id)

    def purge(self) -> int:
        return self.queue().purge()

    def job(self, job_id: str) -> dict[str, Any] | None:
        return self.queue().job(job_id)


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


@overload
def task(fn: Callable[P, R], /) -> Task[P, R]: ...


@overload
def task(fn: None = None, /, *, name: str | None = None, group: GroupSpec = None,
         max_attempts: int = 3, retry_delay: float = 1.0, lease: float = 30.0,
         queue: str | None = None, time_limit: float | None = None,
         result_ttl: int = 86_400) -> Callable[[Callable[P, R]], Task[P, R]]: ...


def task(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Register a task on the default App (settings from EMQ_REDIS_URL / EMQ_QUEUE)."""
    return default_app.task(fn, **options)


def all_apps() -> list[App]:
    return list(_apps)
