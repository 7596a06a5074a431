"""The options of ``@task`` (declared once), TaskSpec, and the name -> task table of one
App. No I/O: registering a task never connects."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypedDict

from .. import validate
from ..errors import DuplicateTaskName, InvalidArgument, InvalidGroup, UnknownTask
from ..schedules.cron import Timing
from ..store.durable import Durable, durable_of
from ..store.keys import check_group, check_tenant
from . import celery_options
from .retry_policy import DEFAULT_POLICY, ExceptionTypes, RetryPolicy

GroupSpec = str | Callable[..., str] | None
#: What ``@task(schedule=...)`` takes: ``emqtasks.cron(...)``, ``emqtasks.every(...)``, a cron
#: string, or seconds.
ScheduleSpec = Timing | str | float | timedelta | None


class TaskOptions(TypedDict, total=False):
    """The options of ``@task`` and ``@app.task``, declared once.

    The decorators take ``**options: Unpack[TaskOptions]`` (a type checker checks each
    keyword; at run time an unknown one is a TypeError, see ``split_options``). An option
    named like a TaskSpec field goes to the TaskSpec, one named like a parameter of
    ``RetryPolicy.of`` to the policy; ``schedule`` declares a schedule. Its default is the
    one of the field or parameter that receives it: adding an option is a line here and
    the field that carries it.
    """

    name: str | None                  # default: the function's module and qualified name
    group: GroupSpec
    tenant: GroupSpec                 # the group's tenant, as group: a name or a function
    max_attempts: int
    retry_delay: float
    lease: float
    queue: str | None
    time_limit: float | None
    result_ttl: int
    retry_backoff: bool | float
    retry_backoff_max: float
    retry_jitter: bool
    retry_for: ExceptionTypes
    dont_retry_for: ExceptionTypes
    schedule: ScheduleSpec            # default: none
    max_result_bytes: int | None
    bind: bool                        # the function receives the Task first (Celery's)
    soft_time_limit: float | None
    rate_limit: str | float | None    # "10/m", "5/s", "100/h" or jobs per second
    abort_grace: float | None         # s an aborted job gets to return; None: the worker's
    unique: GroupSpec                 # each call's unique key: a string or a function, as group
    unique_for: float | None          # s a unique key is held at most (None: an hour)
    durable: bool | Durable | None    # None: as the App says (store/durable.py)
    # Celery's spellings, read onto the options above (celery_options.py)
    autoretry_for: ExceptionTypes     # retry_for
    default_retry_delay: float        # retry_delay
    max_retries: int | None           # max_attempts - 1; None: validate.MAX_ATTEMPTS
    ignore_result: bool               # True: result_ttl=0
    acks_late: bool                   # True only: a job is always acked after its run


@dataclass(frozen=True)
class TaskSpec:
    """What the queue needs to know of a task; all durations in seconds."""

    name: str
    fn: Callable[..., Any]
    group: GroupSpec = None
    tenant: GroupSpec = None        # None: each group is its own tenant
    max_attempts: int = 3
    retry_delay: float = 1.0
    lease: float = 30.0
    queue: str | None = None
    time_limit: float | None = None
    result_ttl: int = 86_400
    policy: RetryPolicy = DEFAULT_POLICY
    is_async: bool = False          # a coroutine function: a worker runs it on its loop
    max_result_bytes: int | None = None   # None: the App's
    bind: bool = False
    soft_time_limit: float | None = None  # SoftTimeLimitExceeded raised in the task
    rate_limit: str | float | None = None # a rate of the task's group (celery_options.py)
    abort_grace: float | None = None      # None: the worker's --abort-grace (5 s)
    unique: GroupSpec = None              # a call's unique key (str or function); None: none
    unique_for: float | None = None       # s a unique key is held at most; None: an hour
    durable: bool | Durable | None = None  # None: as the App says

    def __post_init__(self) -> None:
        # Every option is checked here, when the task is defined, so a bad one never
        # reaches an enqueue (validate.py has the ranges).
        checked = {
            "name": validate.task_name(self.name),
            "max_attempts": validate.integer(self.max_attempts, "max_attempts", 1,
                                             validate.MAX_ATTEMPTS),
            "retry_delay": validate.seconds(self.retry_delay, "retry_delay"),
            "lease": validate.lease(self.lease),
            "time_limit": validate.time_limit(self.time_limit),
            "result_ttl": validate.integer(self.result_ttl, "result_ttl", 0, validate.MAX_TTL),
        }
        if self.max_result_bytes is not None:
            checked["max_result_bytes"] = validate.result_bytes(self.max_result_bytes)
        if self.soft_time_limit is not None:
            soft = validate.seconds(self.soft_time_limit, "soft_time_limit", above_low=True)
            checked["soft_time_limit"] = soft
            if self.time_limit and soft >= float(self.time_limit):
                raise InvalidArgument(f"soft_time_limit ({self.soft_time_limit}) must be "
                                      f"below time_limit ({self.time_limit})")
        if self.abort_grace is not None:
            checked["abort_grace"] = validate.seconds(self.abort_grace, "abort_grace")
        if self.durable is not None:
            durable_of(self.durable, "a task's durable")
        if self.unique_for is not None:
            checked["unique_for"] = validate.unique_for(self.unique_for)
            if self.unique is None:
                raise InvalidArgument(f"unique_for of {self.name} without unique=: a key is "
                                      f"what is held")
        if self.unique is not None and not (isinstance(self.unique, str)
                                            or callable(self.unique)):
            raise InvalidArgument(f"a task's unique is a string or a function of the call's "
                                  f"arguments, not {self.unique!r}")
        if not isinstance(self.bind, bool):
            raise InvalidArgument(f"bind is True or False, not {self.bind!r}")
        for field, value in checked.items():
            object.__setattr__(self, field, value)
        if self.rate is not None:
            # A rate is a group's: a task without a group gets a group of its own (its
            # name), so its rate holds back no other task.
            if self.group is None:
                object.__setattr__(self, "group", self.name)
            elif not isinstance(self.group, str):
                raise InvalidArgument(
                    f"rate_limit of {self.name}: its group is picked by a function, so each "
                    f"call's group has its own rate: set it with app.set_group_rate(group, "
                    f"n, per) or app.set_group_defaults(rate=(n, per)), not rate_limit=")
        if isinstance(self.tenant, str):
            check_tenant(self.tenant)
        elif self.tenant is not None and not callable(self.tenant):
            raise InvalidGroup(f"a task's tenant is a string or a function of the call's "
                               f"arguments, not {self.tenant!r}")
        if isinstance(self.group, str):
            check_group(self.group)
        elif self.group is not None and not callable(self.group):
            raise InvalidGroup(f"a task's group is a string or a function of the call's "
                               f"arguments, not {self.group!r}")

    @property
    def rate(self) -> tuple[int, float] | None:
        """(max_jobs, per seconds) of rate_limit, or None."""
        return celery_options.parse_rate(self.rate_limit)


#: The options that go to RetryPolicy.of, and the one that declares a schedule; the rest
#: are TaskSpec fields (tests/test_layout.py checks that each option has one receiver).
POLICY_OPTIONS = frozenset(inspect.signature(RetryPolicy.of).parameters)
SCHEDULE_OPTION = "schedule"


def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """(the TaskSpec fields, the RetryPolicy.of arguments, the schedule or None) of the
    options given to a decorator. An option TaskOptions does not declare is the TypeError
    Python raises for an unexpected keyword argument; one of Celery's that has no meaning
    here is InvalidArgument saying what to use; Celery's spellings are read onto ours."""
    celery_options.refuse_meaningless(options)
    for key in options:
        if key not in TaskOptions.__optional_keys__:
            raise TypeError(f"App.task() got an unexpected keyword argument {key!r}")
    options = celery_options.translate(options)
    spec = {k: v for k, v in options.items() if k not in POLICY_OPTIONS
            and k != SCHEDULE_OPTION}
    policy = {k: v for k, v in options.items() if k in POLICY_OPTIONS}
    return spec, policy, options.get(SCHEDULE_OPTION)


class Registry:
    """Task name -> an object carrying a ``spec`` (a Task).

    One name maps to one function: registering another function under a taken name is an
    error (the same function again, as when a module is imported twice, replaces the entry).
    """

    def __init__(self) -> None:
        self._tasks: dict[str, Any] = {}

    def add(self, task: Any) -> None:
        name = task.spec.name
        old = self._tasks.get(name)
        if old is not None and _origin(old.spec.fn) != _origin(task.spec.fn):
            raise DuplicateTaskName(f"task name {name!r} is already taken by "
                                    f"{_origin(old.spec.fn)}")
        self._tasks[name] = task

    def remove(self, name: str) -> None:
        """Forget a task (emqtasks.celery moves a shared task to the app made after it)."""
        self._tasks.pop(name, None)

    def get(self, name: str) -> Any:
        try:
            return self._tasks[name]
        except KeyError:
            raise UnknownTask(f"unknown task {name!r}: not registered in this worker") from None

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def tasks(self) -> dict[str, Any]:
        return dict(self._tasks)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    @classmethod
    def merged(cls, registries: Iterable[Registry]) -> Registry:
        """One table for a worker serving several Apps: the first App's entry of a name
        wins; two Apps with different functions under one name are DuplicateTaskName."""
        out = cls()
        for registry in registries:
            for name, task in registry._tasks.items():
                if name not in out:
                    out.add(task)
                elif _origin(out._tasks[name].spec.fn) != _origin(task.spec.fn):
                    raise DuplicateTaskName(
                        f"task name {name!r} names {_origin(out._tasks[name].spec.fn)} "
                        f"in one App and {_origin(task.spec.fn)} in another")
        return out


def _origin(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


# -- the default App -------------------------------------------------------------------------
# app.py makes the App that module-level ``@task`` registers on (emqtasks.default_app) and
# sets it here, so canvas.py finds it for a signature by name without importing app.py
# (which imports canvas.py).
_default_app: Any = None


def set_default_app(app: Any) -> None:
    global _default_app
    _default_app = app


def default_app() -> Any:
    """emqtasks.default_app (app.py is imported with the package, so it is set)."""
    return _default_app
