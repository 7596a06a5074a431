"""The options of ``@task`` (declared once), TaskSpec, and the name -> task table of one
App. No I/O: registering a task never connects."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypedDict

from .. import validate
from ..errors import DuplicateTaskName, InvalidGroup, UnknownTask
from ..schedules.cron import Timing
from ..store.keys import check_group
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


@dataclass(frozen=True)
class TaskSpec:
    """What the queue needs to know of a task; all durations in seconds."""

    name: str
    fn: Callable[..., Any]
    group: GroupSpec = None
    max_attempts: int = 3
    retry_delay: float = 1.0
    lease: float = 30.0
    queue: str | None = None
    time_limit: float | None = None
    result_ttl: int = 86_400
    policy: RetryPolicy = DEFAULT_POLICY
    is_async: bool = False          # a coroutine function: a worker runs it on its loop
    max_result_bytes: int | None = None   # None: the App's

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
        for field, value in checked.items():
            object.__setattr__(self, field, value)
        if isinstance(self.group, str):
            check_group(self.group)
        elif self.group is not None and not callable(self.group):
            raise InvalidGroup(f"a task's group is a string or a function of the call's "
                               f"arguments, not {self.group!r}")


#: The options that go to RetryPolicy.of, and the one that declares a schedule; the rest
#: are TaskSpec fields (tests/test_layout.py checks that each option has one receiver).
POLICY_OPTIONS = frozenset(inspect.signature(RetryPolicy.of).parameters)
SCHEDULE_OPTION = "schedule"


def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """(the TaskSpec fields, the RetryPolicy.of arguments, the schedule or None) of the
    options given to a decorator. An option TaskOptions does not declare is the TypeError
    Python raises for an unexpected keyword argument."""
    for key in options:
        if key not in TaskOptions.__optional_keys__:
            raise TypeError(f"App.task() got an unexpected keyword argument {key!r}")
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
