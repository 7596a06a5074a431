"""TaskSpec and the name -> task table. No I/O here: registering a task never connects."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import DuplicateTaskName, UnknownTask

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


class Registry:
    """Task name -> object carrying a ``spec``; shared by every App of the process."""

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

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)


def _origin(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


#: The process-wide table every App registers into; a worker looks names up here.
REGISTRY = Registry()
