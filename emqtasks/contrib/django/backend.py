"""``TaskBackend``: Django's ``django.tasks`` (and the ``django-tasks`` backport) on emqtasks.

::

    TASKS = {"default": {
        "BACKEND": "emqtasks.contrib.django.TaskBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"GROUP_BY": "account_id"},
    }}

Each Django task is an emqtasks task named by its module path (``shop.tasks.send_receipt``),
registered when Django validates it (at decoration): ``emqtasks worker --django`` knows
every task of the ``tasks`` modules it imports. A Django queue is the emqtasks queue of the
same name (after ``QUEUE_PREFIX``); Django's priority (-100..100, larger first) is the
job's priority negated (emqtasks: lower first), which orders jobs within their group's
lane; ``run_after`` is the job's eta. The group (the fairness lane) of a call is the value
of its keyword argument named by ``GROUP_BY``, else the default group.

OPTIONS: ``REDIS_URL`` (default: the default App's, i.e. ``settings.EMQTASKS`` or
``EMQ_REDIS_URL``), ``QUEUE_PREFIX`` (default ""), ``GROUP_BY`` (default none), and the
options of ``@emqtasks.task`` by upper-case name (``MAX_ATTEMPTS``, ``RETRY_DELAY``,
``LEASE``, ``TIME_LIMIT``, ``RESULT_TTL``, ``RETRY_BACKOFF``...). ``MAX_ATTEMPTS`` is 1
unless set: Django's contract is that a task which raises is FAILED, not retried.

What a result tells comes from the job's row; the worker of each attempt, and the call
(which a finished row no longer keeps), are noted beside it when an attempt starts (one
hash per job, ``<job key>:django``, kept a day past the row's own expiry).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from inspect import iscoroutinefunction
from typing import Any

import redis

from ... import serialization
from ...errors import EmqError
from ...producer import remote_error
from ...producer.app import App, default_app
from ...producer.context import JobContext, current_job
from ...producer.registry import TaskOptions, TaskSpec, split_options
from ...producer.retry_policy import RetryPolicy
from ...producer.task import JobHandle, SendOptions, send
from ...store.keys import check_job_id, check_queue_name
from ...store.queue import Queue
from . import _framework as dt
from .conf import SettingError, check_url

log = logging.getLogger("emqtasks.django")

OWN_OPTIONS = ("REDIS_URL", "QUEUE_PREFIX", "GROUP_BY")
#: The options of @emqtasks.task a backend passes on (not those the backend decides).
TASK_OPTIONS = tuple(sorted(k.upper() for k in TaskOptions.__optional_keys__
                            if k not in ("name", "group", "queue", "schedule")))
#: Django's contract: a task that raises is FAILED (no retry unless MAX_ATTEMPTS says so).
TASK_DEFAULTS: dict[str, Any] = {"max_attempts": 1}
#: How much longer than a job's result the note of its workers is kept (seconds).
NOTE_GRACE = 86_400
#: A call already sent: its size was checked at the enqueue.
NO_LIMIT = 2**62
#: The row's states, as Django's statuses.
STATUS = {"pending": "READY", "delayed": "READY", "waiting": "READY", "active": "RUNNING",
          "done": "SUCCESSFUL", "dead": "FAILED", "cancelled": "FAILED", "skipped": "FAILED",
          "expired": "FAILED", "aborted": "FAILED"}

_apps: dict[str, App] = {}
_apps_lock = threading.Lock()
#: Django task by module path: the first one validated (its decorated object).
_known: dict[str, Any] = {}


class TaskBackend(dt.BaseTaskBackend):  # type: ignore[misc]  # Django has no types
    """Runs Django tasks on emqtasks workers (``emqtasks worker --django``)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        where = f"settings.TASKS[{alias!r}]"
        options = dict(self.options or {})
        unknown = sorted(set(options) - set(OWN_OPTIONS) - set(TASK_OPTIONS))
        if unknown:
            raise dt.InvalidTaskBackend(
                f"{where}['OPTIONS'][{unknown[0]!r}] is not an option: one of "
                f"{', '.join(OWN_OPTIONS + TASK_OPTIONS)}")
        self.prefix = options.pop("QUEUE_PREFIX", "") or ""
        self.group_by: str | None = options.pop("GROUP_BY", None)
        url = options.pop("REDIS_URL", None)
        self.task_options = {**TASK_DEFAULTS, **{k.lower(): v for k, v in options.items()}}
        try:
            self._check(where, url)
        except SettingError as exc:
            raise dt.InvalidTaskBackend(str(exc)) from None
        self.app = _app_for(url)

    def _check(self, where: str, url: str | None) -> None:
        """Every option, before the first task: SettingError naming the one at fault."""
        if not self.queues:
            raise SettingError(f"{where}['QUEUES'] must name the queues (an emqtasks "
                               "worker serves the queues it is given)")
        if self.group_by is not None and not (isinstance(self.group_by, str)
                                              and self.group_by.isidentifier()):
            raise SettingError(f"{where}['OPTIONS']['GROUP_BY'] names a keyword argument, "
                               f"not {self.group_by!r}")
        if url is not None:
            check_url(url, f"{where}['OPTIONS']['REDIS_URL']")
        for name in self.queues:
            try:
                check_queue_name(f"{self.prefix}{name}")
            except EmqError as exc:
                raise SettingError(f"{where}['QUEUES'] (after QUEUE_PREFIX): {exc}") from None
        spec, policy, _ = split_options(self.task_options)
        try:
            RetryPolicy.of(**policy)
            TaskSpec(name="emqtasks.contrib.django.check", fn=_noop, **spec)
        except (EmqError, TypeError) as exc:
            raise SettingError(f"{where}['OPTIONS']: {exc}") from None

    # -- Django's contract ----------------------------------------------------------------
    def validate_task(self, task: Any) -> None:
        """Django's checks (InvalidTask), then the task is registered as an emqtasks task."""
        super().validate_task(task)
        self._spec(task)

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        # Made first: Django's TaskResult refuses a call that is not JSON, before anything
        # is sent (its id is the job's, known once sent).
        result = dt.TaskResult(
            task=task, id="pending", status=dt.TaskResultStatus.READY, enqueued_at=None,
            started_at=None, finished_at=None, last_attempted_at=None, args=list(args),
            kwargs=dict(kwargs), backend=self.alias, errors=[], worker_ids=[])
        handle = send(self.app, self._spec(task), args, kwargs, SendOptions(
            queue=self.queue_of(task.queue_name), group=self.group_of(kwargs),
            eta=task.run_after, priority=-int(task.priority)))
        object.__setattr__(result, "id", handle.id)
        object.__setattr__(result, "enqueued_at", _now())
        dt.task_enqueued.send_robust(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> Any:
        """The result of a job of this backend's queues; TaskResultDoesNotExist when none
        has it (never enqueued, or its row expired: ``RESULT_TTL``, a day by default)."""
        try:
            check_job_id(result_id)
        except EmqError:
            raise dt.TaskResultDoesNotExist(result_id) from None
        names = sorted(self.queues)
        pipe = self.app.client.pipeline(transaction=False)
        for name in names:
            q = self.app.queue(self.queue_of(name))
            pipe.hgetall(q.keys.job(result_id))
            pipe.hgetall(_note_key(q, result_id))
        replies = pipe.execute()
        for i, name in enumerate(names):
            row, note = replies[2 * i], replies[2 * i + 1]
            if row:
                return self._result(result_id, name, row, note)
        raise dt.TaskResultDoesNotExist(result_id)

    # -- emqtasks' side -------------------------------------------------------------------
    def queue_of(self, queue_name: str) -> str:
        """The emqtasks queue of a Django queue name."""
        return f"{self.prefix}{queue_name}"

    def group_of(self, kwargs: dict[str, Any]) -> str | None:
        """The call's group: its ``GROUP_BY`` keyword argument, else the default group."""
        if self.group_by is None or kwargs.get(self.group_by) is None:
            return None
        return str(kwargs[self.group_by])

    def handle(self, result: Any) -> JobHandle[Any]:
        """The emqtasks JobHandle of a result: ``.get(timeout)`` blocks until the job ends
        (no polling), ``.status()`` reads its state."""
        return JobHandle(self.app.queue(self.queue_of(result.task.queue_name)), result.id)

    def _spec(self, task: Any) -> TaskSpec:
        name = task.module_path
        if name not in self.app.registry:
            _known.setdefault(name, task)
            self.app.task(name=name, **self.task_options)(_runner(task.func,
                                                                  task.takes_context))
        spec: TaskSpec = self.app.registry.get(name).spec
        return spec

    def _task_named(self, name: str, queue_name: str) -> Any:
        task = _known.get(name)
        if task is None:
            raise dt.TaskResultDoesNotExist(
                f"the result's task {name} is not defined in this process (import its "
                "module first)")
        return task if task.queue_name == queue_name else task.using(queue_name=queue_name)

    def _result(self, result_id: str, queue_name: str, row: dict[str, str],
                note: dict[str, str]) -> Any:
        task = self._task_named(row.get("task", ""), queue_name)
        try:
            args, kwargs = serialization.loads_args(row.get("payload") or note.get("args")
                                                    or "")
        except EmqError:
            args, kwargs = [], {}
        status = STATUS.get(row.get("state") or "", "FAILED")
        errors = []
        if row.get("error"):
            errors.append(task_error(row["error"]))
        elif row.get("state") == "cancelled":
            errors.append(dt.TaskError(exception_class_path="emqtasks.errors.TaskFailed",
                                       traceback="the job was cancelled"))
        started = _when(row.get("started"))
        result = dt.TaskResult(
            task=task, id=result_id, status=getattr(dt.TaskResultStatus, status),
            enqueued_at=_when(row.get("created")), started_at=started,
            finished_at=_when(row.get("finished")) if status in ("SUCCESSFUL", "FAILED")
            else None,
            last_attempted_at=started, args=args, kwargs=kwargs, backend=self.alias,
            errors=errors, worker_ids=_workers(note))
        if status == "SUCCESSFUL":
            object.__setattr__(result, "_return_value",
                               serialization.loads_result(row.get("result")))
        return result


def _app_for(url: str | None) -> App:
    """The default App, or one App per other URL (backends are made per thread)."""
    if url is None:
        return default_app
    with _apps_lock:
        app = _apps.get(url)
        if app is None:
            app = _apps[url] = App(redis_url=url)
        return app


def _runner(func: Callable[..., Any], takes_context: bool) -> Callable[..., Any]:
    """The emqtasks task body of a Django task: note the attempt's worker, then call it
    (with its TaskContext first when it takes one)."""
    if iscoroutinefunction(func):
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            job = current_job()
            context = _begin(job, args, kwargs, takes_context)
            try:
                value = await func(*((context,) if takes_context else ()), *args, **kwargs)
            except BaseException:
                _end(context, "FAILED")
                raise
            _end(context, "SUCCESSFUL")
            return value

        return run_async

    def run(*args: Any, **kwargs: Any) -> Any:
        job = current_job()
        context = _begin(job, args, kwargs, takes_context)
        try:
            value = func(*((context,) if takes_context else ()), *args, **kwargs)
        except BaseException:
            _end(context, "FAILED")
            raise
        _end(context, "SUCCESSFUL")
        return value

    return run


def _begin(job: JobContext, args: tuple[Any, ...], kwargs: dict[str, Any],
           takes_context: bool) -> Any:
    """Note this attempt's worker beside the job's row; Django's task_started signal; the
    TaskContext (its ``attempt`` is the job's attempt)."""
    task = _known.get(job.task)
    if task is None:
        return None
    backend: TaskBackend = task.get_backend()
    queue = backend.app.queue(job.queue)
    key = _note_key(queue, job.id)
    spec: TaskSpec = backend.app.registry.get(job.task).spec
    pipe = queue.client.pipeline(transaction=False)
    # the call too: a finished job's row keeps no payload, and Django's result shows it
    pipe.hset(key, mapping={str(job.attempts): worker_id(),
                            "args": serialization.dumps_args(args, kwargs, NO_LIMIT)})
    pipe.expire(key, spec.result_ttl + NOTE_GRACE)
    pipe.hgetall(key)
    try:
        workers = _workers(pipe.execute()[2])
    except redis.exceptions.RedisError as exc:   # a note only: the job runs anyway
        log.warning("job %s: could not note its worker: %s", job.id, exc)
        workers = [worker_id()] * job.attempts   # this one's, for each attempt
    queue_name = job.queue.removeprefix(backend.prefix)
    result = dt.TaskResult(
        task=task if task.queue_name == queue_name else task.using(queue_name=queue_name),
        id=job.id, status=dt.TaskResultStatus.RUNNING, enqueued_at=None,
        started_at=_now(), finished_at=None, last_attempted_at=_now(), args=list(args),
        kwargs=dict(kwargs), backend=backend.alias, errors=[],
        worker_ids=workers)
    dt.task_started.send_robust(type(backend), task_result=result)
    return dt.TaskContext(task_result=result) if takes_context else result


def _end(context: Any, status: str) -> None:
    """Django's task_finished signal for the attempt."""
    result = getattr(context, "task_result", context)
    if result is None:
        return
    object.__setattr__(result, "status", getattr(dt.TaskResultStatus, status))
    object.__setattr__(result, "finished_at", _now())
    dt.task_finished.send_robust(type(result.task.get_backend()), task_result=result)


def _note_key(queue: Queue, job_id: str) -> str:
    """Beside the job's row (same hash slot): attempt number -> worker id."""
    return f"{queue.keys.job(job_id)}:django"


def _workers(note: dict[str, str]) -> list[str]:
    """The worker of each attempt, in order (the note's numbered fields)."""
    return [note[k] for k in sorted((k for k in note if k.isdigit()), key=int)]


_worker_id: tuple[int, str] | None = None


def worker_id() -> str:
    """host:pid of the process running the attempt (a worker's child)."""
    global _worker_id
    if _worker_id is None or _worker_id[0] != os.getpid():
        _worker_id = (os.getpid(), f"{socket.gethostname()}:{os.getpid()}")
    return _worker_id[1]


def task_error(text: str) -> Any:
    """A TaskError from a row's error (producer/remote_error.py reads it): the class path
    it names (TaskFailed for a text that names no importable path), its traceback."""
    parts = remote_error.parse(text)
    path = parts.class_path if parts is not None and "." in parts.class_path \
        else "emqtasks.errors.TaskFailed"
    return dt.TaskError(exception_class_path=path,
                        traceback=(parts.traceback if parts is not None else text).strip())


def _when(ms: str | None) -> datetime | None:
    """A row's time (server ms) as Django keeps times (aware UTC, or naive local time
    without USE_TZ)."""
    if not ms or not ms.lstrip("-").isdigit():
        return None
    when = datetime.fromtimestamp(int(ms) / 1000, timezone.utc)
    return when if _use_tz() else when.astimezone().replace(tzinfo=None)


def _now() -> datetime:
    from django.utils import timezone as django_timezone

    now: datetime = django_timezone.now()
    return now


def _use_tz() -> bool:
    from django.conf import settings

    return bool(settings.USE_TZ)


def _noop() -> None:
    """The function of the TaskSpec that checks a backend's options."""
