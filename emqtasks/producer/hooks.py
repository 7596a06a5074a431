"""Hooks: functions an App calls at points of a worker's life (``@app.on(event)``).

Events: ``child_started`` (once per child, after the fork: open connections there; no
argument), ``task_started``, ``task_succeeded``, ``task_retried``, ``task_dead`` (each with
the job's JobContext; ``job.exception`` tells what failed, ``job.result`` what a
succeeded task returned) and ``worker_stopping`` (once, in
the master, when a stop begins; no argument). ``task_retried`` / ``task_dead`` of a job whose
child died or was killed at its time limit fire in the master (worker/settled.py). A hook
may be a coroutine function: a worker child awaits it on its event loop. A hook that raises
is logged; the job and the child carry on.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar, get_args

from ..errors import InvalidArgument

HookEvent = Literal["child_started", "task_started", "task_succeeded", "task_retried",
                    "task_dead", "worker_stopping"]
EVENTS: tuple[str, ...] = get_args(HookEvent)
F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("emqtasks.hooks")


class Hooks:
    """Event name -> the functions registered for it, in registration order."""

    def __init__(self) -> None:
        self._by_event: dict[str, list[Callable[..., Any]]] = {}

    def add(self, event: str, fn: Callable[..., Any]) -> None:
        if event not in EVENTS:
            raise InvalidArgument(f"unknown hook event {event!r}: one of {', '.join(EVENTS)}")
        if not callable(fn):
            raise InvalidArgument(f"a hook is a function, not {fn!r}")
        fns = self._by_event.setdefault(event, [])
        if fn not in fns:
            fns.append(fn)

    def __bool__(self) -> bool:
        return any(self._by_event.values())

    def has(self, event: str) -> bool:
        return bool(self._by_event.get(event))

    def fire(self, event: str, *args: Any,
             run: Callable[[Any], Any] | None = None) -> None:
        """Call every hook of event. A coroutine a hook returns is handed to ``run`` (a
        worker child runs it on its event loop), else run to its end on a fresh loop."""
        for fn in self._by_event.get(event, ()):
            try:
                result = fn(*args)
                if inspect.isawaitable(result):
                    (run or asyncio.run)(_guarded(result, fn, event))
            except Exception:
                log.exception("hook %s for %s raised; carrying on", _name(fn), event)

    @classmethod
    def merged(cls, many: Iterable[Hooks]) -> Hooks:
        out = cls()
        for hooks in many:
            for event, fns in hooks._by_event.items():
                for fn in fns:
                    out.add(event, fn)
        return out


async def _guarded(awaitable: Any, fn: Callable[..., Any], event: str) -> None:
    try:
        await awaitable
    except Exception:
        log.exception("hook %s for %s raised; carrying on", _name(fn), event)


def _name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
