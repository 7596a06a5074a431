"""The tasks ``emqtasks bench`` runs: each does one small Redis write so the bench can count it.

A worker imports this module (``-A emqtasks._dev.bench.tasks``), which registers the tasks on the
default App; the bench process binds the same functions, under the same names, to an App of
its own queue with :func:`bind`. Each task talks to Redis over a connection of its own
process (opened after the fork), on the URL the worker configured the default App with.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from ...producer.app import App, default_app
from ..taskclient import task_redis


def _group_arg(*args: Any, group: str = "default", **_: Any) -> str:
    """The lane of a bench job: its second positional argument, or ``group=``."""
    return str(args[1]) if len(args) > 1 else group


def noop(counter: str, group: str = "default") -> None:
    """Count itself: one INCR of the counter key."""
    task_redis().incr(counter)


def relay(value: Any, counter: str, group: str = "default") -> Any:
    """A workflow step: count itself (one INCR) and hand its first argument on."""
    task_redis().incr(counter)
    return value


def stamp(key: str) -> None:
    """Record when it started (UNIX time, this host's clock) by pushing it onto ``key``."""
    task_redis().rpush(key, repr(time.time()))


# INCR the sequence; if the mark key (a job row) exists, INCR the after-mark counter too.
# Reply: {this start's number, the after-mark count}. One script, so both are exact.
_SEQ = """
local n = redis.call('INCR', KEYS[1])
if KEYS[2] ~= KEYS[3] and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('INCR', KEYS[3])
end
return {n, tonumber(redis.call('GET', KEYS[3]) or '0')}
"""
_seq_script: tuple[int, Any] | None = None


def seq(seq_key: str, group: str = "default", mark: str = "") -> list[int]:
    """Take the next start number of ``seq_key``; returns [number, after-mark count].

    A flood job given ``mark`` (the key of another job's row) also counts itself in
    ``<seq_key>:after`` when that row exists, i.e. when it started after that job was
    enqueued; the marked job reads the count when it starts.
    """
    global _seq_script
    if _seq_script is None or _seq_script[0] != os.getpid():
        _seq_script = (os.getpid(), task_redis().register_script(_SEQ))
    after = f"{seq_key}:after"
    n, seen = _seq_script[1](keys=[seq_key, mark or after, after])
    return [int(n), int(seen)]


# INCR the running count, keep the highest seen in KEYS[2].
_PEAK = """
local n = redis.call('INCR', KEYS[1])
if tonumber(redis.call('GET', KEYS[2]) or '0') < n then redis.call('SET', KEYS[2], n) end
return n
"""
_peak_script: tuple[int, Any] | None = None


async def nap(counter: str, group: str = "default", seconds: float = 0.2) -> None:
    """An async job that awaits I/O: counts how many naps run at once (the peak in
    ``<counter>:peak``), sleeps, then counts itself in ``counter``."""
    global _peak_script
    if _peak_script is None or _peak_script[0] != os.getpid():
        _peak_script = (os.getpid(), task_redis().register_script(_PEAK))
    _peak_script[1](keys=[f"{counter}:running", f"{counter}:peak"])
    try:
        await asyncio.sleep(seconds)
    finally:
        task_redis().decr(f"{counter}:running")
    task_redis().incr(counter)


def work(counter: str, group: str = "default", ms: float = 1.0) -> None:
    """Hold the child ``ms`` milliseconds, then add the time it took (as the task measures
    it) to ``<counter>:task`` and count itself in ``<counter>:jobs``, both per group."""
    began = time.perf_counter()
    time.sleep(ms / 1000)
    took = time.perf_counter() - began
    pipe = task_redis().pipeline(transaction=False)
    pipe.hincrbyfloat(f"{counter}:task", group, took)
    pipe.hincrby(f"{counter}:jobs", group, 1)
    pipe.execute()


FUNCTIONS = (noop, stamp, seq, nap, work, relay)


def bind(app: App) -> dict[str, Any]:
    """Register the bench tasks on ``app``; returns them by short name."""
    return {fn.__name__: app.task(fn, name=f"{__name__}.{fn.__name__}", group=_group_arg,
                                  max_attempts=3, retry_delay=1.0)
            for fn in FUNCTIONS}


TASKS = bind(default_app)
