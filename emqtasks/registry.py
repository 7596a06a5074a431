"""TaskSpec and the name -> task table of one App. No I/O: registering a task never connects."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from . import validate
from .errors import DuplicateTaskName, InvalidGroup, UnknownTask
from .retry_policy import DEFAULT_POLICY, RetryPolicy
from .store.keys import check_group

GroupSpec = str | Callable[..., str] | None


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
