"""A task's soft time limit: SoftTimeLimitExceeded raised inside the task, which may catch
it and return (the hard time_limit, later, is the master's SIGTERM / SIGKILL).

A sync task runs in its child's main thread: a one-shot SIGALRM timer (setitimer) raises
it there, disarmed when the task returns. An async task is suspended at an await when the
limit passes: its asyncio task is cancelled, and the interposer between it and the
runner turns that one cancellation into SoftTimeLimitExceeded thrown in at the await.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Awaitable, Generator, Iterator
from typing import Any

from ..errors import SoftTimeLimitExceeded


def _exceeded(limit: float) -> SoftTimeLimitExceeded:
    return SoftTimeLimitExceeded(f"ran past its soft time limit of {limit:g}s")


@contextlib.contextmanager
def alarm(limit: float | None) -> Iterator[None]:
    """Within the block (a sync task's run), SoftTimeLimitExceeded is raised after
    ``limit`` seconds. Only in the main thread (where signals arrive): elsewhere (a job run
    by emqtasks.testing in a caller's thread) there is no soft limit."""
    if not limit or threading.current_thread() is not threading.main_thread():
        yield
        return
    armed = True

    def on_alarm(_signum: int, _frame: Any) -> None:
        nonlocal armed
        if armed:                 # once, and never after the block
            armed = False
            raise _exceeded(limit)

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


async def soft_limited(coro: Awaitable[Any], limit: float) -> Any:
    """Await coro, with SoftTimeLimitExceeded thrown into it at ``limit`` seconds."""
    task = asyncio.current_task()
    interposer = _Interposer(coro, limit)
    if task is None:
        return await coro

    def fire() -> None:
        interposer.fired = True
        task.cancel()

    timer = asyncio.get_running_loop().call_later(limit, fire)
    try:
        return await interposer
    finally:
        timer.cancel()


class _Interposer:
    """Drives a coroutine step by step for the asyncio task awaiting this: the one
    cancellation ``soft_limited`` asked for is thrown into the coroutine as
    SoftTimeLimitExceeded instead (and taken back from the task's count); everything else
    passes through as it is."""

    def __init__(self, coro: Awaitable[Any], limit: float) -> None:
        self.coro = coro
        self.limit = limit
        self.fired = False
        self.delivered = False

    def __await__(self) -> Generator[Any, None, Any]:
        inner = self.coro.__await__()
        pending: BaseException | None = None
        while True:
            try:
                step = next(inner) if pending is None else inner.throw(pending)
            except StopIteration as stop:
                return stop.value
            pending = None
            try:
                yield step
            except asyncio.CancelledError as exc:
                if self.fired and not self.delivered:
                    self.delivered = True
                    task = asyncio.current_task()
                    uncancel = getattr(task, "uncancel", None)   # Python 3.11+
                    if uncancel is not None:
                        uncancel()
                    pending = _exceeded(self.limit)
                else:
                    pending = exc
            except BaseException as exc:
                pending = exc


