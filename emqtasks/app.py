"""App: settings, the Redis connection, @app.task; Task: delay / apply_async / map; JobHandle."""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import redis

from . import embedded, serialization
from .cluster import connect_cluster, is_cluster_url
from .config import Settings
from .errors import InvalidArgument, InvalidGroup, TaskFailed
from .keys import DEFAULT_GROUP, check_group, check_job_id, check_queue_name, new_job_id
from .queue import DUPLICATE, NewJob, Queue
from .registry import REGISTRY, GroupSpec, TaskSpec

F = TypeVar("F", bound=Callable[..., Any])
_apps: list[App] = []


#: Longer than any blocking call emqtasks makes (parks and result waits are capped at
#: MAX_BLOCK), so a BLPOP never trips the socket timeout, yet a dead peer is noticed.
SOCKET_TIMEOUT = 30.0
MAX_BLOCK = 20.0
ENCODING_ERRORS = "surrogateescape"
#: What a ``rediss://`` client checks unless its URL says otherwise (redis-py's own defaults
#: today, stated here so a change of library default cannot turn them off).
TLS_DEFAULTS = {"ssl_cert_reqs": "required", "ssl_check_hostname": True}


def connect(url: str, single_thread: bool = False) -> Any:
    """A redis-py client for a URL, with replies decoded as text.

    ``embedded`` / ``embedded:PATH`` start (or reuse) the embedded development server;
    ``redis+cluster://host:port[,host:port...]`` gives a Redis Cluster client (cluster.py).
    ``single_thread`` keeps one connection instead of a pool checkout per command (about a
    sixth of a worker child's time per job); only for a client one thread uses.

    Replies decode with ``surrogateescape``: a row holding bytes that are not UTF-8 (written
    by something other than emqtasks) reads back with them as lone surrogates instead of
    failing the whole reply, so a worker can dead-letter that job (serialization.loads_args
    refuses such a payload) rather than crash on every claim of it.
    ``rediss://`` verifies the server's certificate and host name unless the URL's
    ``ssl_cert_reqs`` / ``ssl_check_hostname`` say otherwise.
    """
    tls = TLS_DEFAULTS if url.lower().startswith(("rediss://", "rediss+cluster://")) else {}
    if is_cluster_url(url):
        return connect_cluster(url, decode_responses=True, socket_timeout=SOCKET_TIMEOUT,
                               socket_connect_timeout=5.0, encoding_errors=ENCODING_ERRORS,
                               **tls)
    return redis.Redis.from_url(embedded.resolve(url), decode_responses=True,
                                encoding_errors=ENCODING_ERRORS,
                                socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=5.0,
                                single_connection_client=single_thread, **tls)


class JobHandle:
    """A job's id, whether the enqueue was a duplicate, and a way to follow it."""

    __slots__ = ("id", "duplicate", "_queue")

    def __init__(self, queue: Queue, job_id: str, duplicate: bool) -> None:
        self._queue = queue
        self.id = job_id
        self.duplicate = duplicate

    def status(self) -> str | None:
        """pending, delayed, active, done, dead, cancelled; None once the row expired."""
        return self._queue.status(self.id)

    def info(self) -> dict[str, Any] | None:
        return self._queue.job(self.id)

    def get(self, timeout: float | None = None, poll: float | None = None) -> Any:
        """The task's return value; TaskFailed if it died or was cancelled; TimeoutError.

        Blocks on the job's own notification key (one BLPOP per ``poll`` seconds, default
        5), so a waiting client costs the server next to nothing.
        """
        q = self._queue
        deadline = None if timeout is None else time.monotonic() + timeout
        chunk = min(poll or 5.0, MAX_BLOCK)
        registered = False
        while True:
            state, result, error = q.outcome(self.id, register=not registered)
            registered = True
            if state == "done":
                return serialization.loads_result(result)
            if state in ("dead", "cancelled"):
                raise TaskFailed(self.id, error if state == "dead" else "cancelled")
            if state is None:
                raise TaskFailed(self.id, "the job row is gone (expired, purged, never "
                                          "existed, or result_ttl=0)")
            left = chunk if deadline is None else min(chunk, deadline - time.monotonic())
            if left <= 0:
                raise TimeoutError(f"job {self.id} still {state} after {timeout}s")
            q.wait_done(self.id, left)

    def __repr__(self) -> str:
        return f"<JobHandle {self.id}{' duplicate' if self.duplicate else ''}>"


class Task:
    """A registered function. Calling it runs it here; ``delay`` runs it on a worker."""

    def __init__(self, app: App, spec: TaskSpec) -> None:
        self.app = app
        self.spec = spec
        self.name = spec.name
        functools.update_wrapper(self, spec.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.spec.fn(*args, **kwargs)

    def delay(self, *args: Any, **kwargs: Any) -> JobHandle:
        return self.apply_async(args, kwargs)

    def apply_async(self, args: Iterable[Any] = (), kwargs: dict[str, Any] | None = None,
                    job_id: str | None = None, group: str | None = None,
                    countdown: float | None = None,
                    eta: datetime | float | None = None) -> JobHandle:
        """Enqueue one call. ``eta`` is a datetime or a UNIX timestamp; both go via delayed."""
        return self.app.send_task(self, args, kwargs, job_id=job_id, group=group,
                                  countdown=countdown, eta=eta)

    def map(self, calls: Iterable[Any]) -> list[JobHandle]:
        """Enqueue many calls in one round trip; each item a tuple of args or a dict of kwargs."""
        limit = self.app.settings.max_payload_bytes
        jobs = [build_job(self.spec, *_split_call(c), limit=limit) for c in calls]
        if not jobs:
            return []
        queue = self.app.queue(self.spec.queue)
        verdicts = queue.enqueue_many(jobs)
        return [JobHandle(queue, j.id, v == DUPLICATE) for j, v in zip(jobs, verdicts)]

    def __repr__(self) -> str:
        return f"<Task {self.name}>"


@functools.lru_cache(maxsize=1024)
def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    """Cached: enqueue is a hot path and inspect.signature is not cheap."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _fits(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    sig = _signature(fn)
    if sig is None:   # no signature to inspect: call it as made
        return True
    try:
        sig.bind(*args, **kwargs)
    except TypeError:
        return False
    return True


def _by_name(fn: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A call's arguments bound to the task's parameters, passed by name where they can be."""
    sig = _signature(fn)
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
              countdown: float | None = None, eta: datetime | float | None = None) -> NewJob:
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
        countdown_ms=_countdown_ms(countdown, eta),
    )


def _group_of(spec: TaskSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    g = spec.group
    if g is None:
        return DEFAULT_GROUP
    if isinstance(g, str):
        return g
    # The call as made, if it fits the group function; else the task's arguments by name,
    # so ``lambda tenant, **_: tenant`` serves ``build_report.delay("acme", 42)``.
    call = (args, kwargs) if _fits(g, args, kwargs) else _by_name(spec.fn, args, kwargs)
    try:
        return g(*call[0], **call[1])  # type: ignore[no-any-return]
    except Exception as exc:
        raise InvalidGroup(f"the group function of {spec.name} failed: {exc!r}") from exc


def _split_call(call: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(call, dict):
        return (), call
    if isinstance(call, (tuple, list)):
        return tuple(call), {}
    raise InvalidArgument(f"map() takes tuples of args or dicts of kwargs, not {call!r}")


def _countdown_ms(countdown: float | None, eta: datetime | float | None) -> int:
    if eta is not None:
        stamp = eta.timestamp() if isinstance(eta, datetime) else float(eta)
        countdown = max(countdown or 0.0, stamp - datetime.now(timezone.utc).timestamp())
    if countdown is None or countdown <= 0:
        return 0
    return max(1, int(countdown * 1000))


class App:
    """Settings, one Redis client, and the tasks registered through it.

    Nothing connects until the first enqueue or admin call, so importing a tasks module is
    free of I/O and a worker can point the app elsewhere first (``configure``).
    """

    def __init__(self, redis_url: str | None = None, queue: str | None = None,
                 max_payload_bytes: int | None = None) -> None:
        self._explicit = {"redis_url": redis_url, "queue": queue,
                          "max_payload_bytes": max_payload_bytes}
        self._settings: Settings | None = None
        self._client: Any = None
        self._queues: dict[str, Queue] = {}
        self._lock = threading.Lock()
        self.tasks: dict[str, Task] = {}
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
    def task(self, fn: F | None = None, *, name: str | None = None, group: GroupSpec = None,
             max_attempts: int = 3, retry_delay: float = 1.0, lease: float = 30.0,
             queue: str | None = None, time_limit: float | None = None,
             result_ttl: int = 86_400) -> Any:
        """Register a function as a task; usable as ``@app.task`` or ``@app.task(...)``."""

        def register(f: Callable[..., Any]) -> Task:
            if max_attempts < 1 or lease <= 0 or retry_delay < 0 or result_ttl < 0:
                raise InvalidArgument("max_attempts >= 1, lease > 0, retry_delay >= 0 and "
                                      "result_ttl >= 0 are required")
            if queue is not None:
                check_queue_name(queue)   # at registration, not at the first delay()
            spec = TaskSpec(name=name or f"{_module_name(f)}.{f.__qualname__}", fn=f,
                            group=group, max_attempts=max_attempts, retry_delay=retry_delay,
                            lease=lease, queue=queue, time_limit=time_limit,
                            result_ttl=int(result_ttl))
            t = Task(self, spec)
            REGISTRY.add(t)
            self.tasks[spec.name] = t
            return t

        return register(fn) if fn is not None else register

    def send_task(self, task: str | Task, args: Iterable[Any] = (),
                  kwargs: dict[str, Any] | None = None, *, job_id: str | None = None,
                  group: str | None = None, countdown: float | None = None,
                  eta: datetime | float | None = None, queue: str | None = None) -> JobHandle:
        """Enqueue a call by task name (or Task) on this app's server.

        A name registered in this process keeps its options (group function, attempts,
        lease...); an unknown name is sent with the defaults of ``@task``, for a worker
        elsewhere that knows it.
        """
        if isinstance(task, Task):
            spec = task.spec
        elif task in REGISTRY:
            spec = REGISTRY.get(task).spec
        else:
            spec = TaskSpec(name=task, fn=_not_here)
        job = build_job(spec, tuple(args), kwargs or {}, limit=self.settings.max_payload_bytes,
                        job_id=job_id, group=group, countdown=countdown, eta=eta)
        q = self.queue(queue if queue is not None else spec.queue)
        verdict = q.enqueue_many([job])[0]
        return JobHandle(q, job.id, verdict == DUPLICATE)

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

    def cancel(self, job_id: str) -> str:
        return self.queue().cancel(job_id)

    def purge(self) -> int:
        return self.queue().purge()

    def job(self, job_id: str) -> dict[str, Any] | None:
        return self.queue().job(job_id)


def _module_name(fn: Callable[..., Any]) -> str:
    """The importable name of fn's module, also when it runs as a script (``__main__``), so
    the producer script and a worker that imports the same file agree on task names."""
    module = fn.__module__
    if module != "__main__":
        return module
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return str(spec.name)
    path = getattr(main, "__file__", None)
    return Path(path).stem if path else module


def _not_here(*_args: Any, **_kwargs: Any) -> None:
    raise RuntimeError("this task is registered in another process")


default_app = App()


def task(fn: F | None = None, **options: Any) -> Any:
    """Register a task on the default App (settings from EMQ_REDIS_URL / EMQ_QUEUE)."""
    return default_app.task(fn, **options)


def all_apps() -> list[App]:
    return list(_apps)
