"""Tasks the fault-injection tests run in real worker processes.

Each records what it did in Redis under ``t:<queue>:*`` (the worker points the default app
at its -Q), keyed by a tag the test chooses, so a test can count starts and completions per
job without trusting the queue's own books.
"""

from __future__ import annotations

import ctypes
import os
import time

from emqtasks import Retry, default_app, task


def _r():  # type: ignore[no-untyped-def]
    return default_app.client


def _k(name: str) -> str:
    return f"t:{default_app.settings.queue}:{name}"


def _started(tag: str) -> None:
    pipe = _r().pipeline()
    pipe.hset(_k("pid"), tag, os.getpid())
    pipe.hincrby(_k("starts"), tag, 1)
    pipe.execute()


@task(name="f.count", group=lambda tag, *a, **k: tag.split(":")[0], lease=1.0,
      retry_delay=0.05, max_attempts=50)
def count(tag: str) -> str:
    """The load task: one completion record per run, by tag."""
    _r().hincrby(_k("runs"), tag, 1)
    return tag


@task(name="f.sleepy", group="sleepy", lease=1.0, retry_delay=0.05, max_attempts=5)
def sleepy(tag: str, seconds: float) -> str:
    _started(tag)
    time.sleep(seconds)
    _r().hincrby(_k("runs"), tag, 1)
    return tag


@task(name="f.spin", group="gil", lease=0.5, retry_delay=0.05, max_attempts=5)
def spin(tag: str, seconds: float) -> int:
    """Holds the GIL: a tight pure-Python loop, no I/O, until `seconds` passed."""
    _started(tag)
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    _r().hincrby(_k("runs"), tag, 1)
    return n


@task(name="f.cblock", group="gil", lease=0.5, retry_delay=0.05, max_attempts=5)
def cblock(tag: str, seconds: float) -> str:
    """Blocks in C with the GIL held: usleep through ctypes.PyDLL (which keeps the GIL)."""
    _started(tag)
    libc = ctypes.PyDLL("libc.so.6")
    libc.usleep(ctypes.c_uint(int(seconds * 1_000_000)))
    _r().hincrby(_k("runs"), tag, 1)
    return tag


@task(name="f.fail_once", group=lambda tag, *a, **k: tag.split(":")[0], retry_delay=0.1,
      max_attempts=5)
def fail_once(tag: str) -> str:
    """Fails its first start (by Retry with a short delay), succeeds on the second."""
    n = _r().hincrby(_k("starts"), tag, 1)
    if n == 1:
        raise Retry(delay=0.15)
    _r().hincrby(_k("runs"), tag, 1)
    return tag


@task(name="f.once", group=lambda tag, *a, **k: tag.split(":")[0], max_attempts=5)
def once(tag: str) -> str:
    """Never fails: counts its starts and its completions."""
    r = _r()
    r.hincrby(_k("starts"), tag, 1)
    r.hincrby(_k("runs"), tag, 1)
    return tag
