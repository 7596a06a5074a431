"""Tasks the workflow tests run in real workers; each counts its runs in Redis."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from emqtasks import current_job, default_app, task


def _r() -> Any:
    return default_app.client


def _k(name: str) -> str:
    return f"wt:{default_app.settings.queue}:{name}"


def _ran(tag: str) -> None:
    """One run of a job (per job id, so a step run twice under at-least-once shows)."""
    _r().hincrby(_k("runs"), current_job().id, 1)
    _r().hincrby(_k("tasks"), tag, 1)


@task(name="wf.add", retry_delay=0.05, lease=2.0)
def add(x: int, y: int = 0) -> int:
    _ran("add")
    return x + y


@task(name="wf.tsum", retry_delay=0.05, lease=2.0)
def tsum(xs: list[int]) -> int:
    """A chord's callback: notes every run and the list it got."""
    _ran("tsum")
    _r().rpush(_k("cbargs"), json.dumps(xs))
    return sum(xs)


@task(name="wf.flaky_once", retry_delay=0.05, max_attempts=3, lease=2.0)
def flaky_once(i: int, fail: bool = False) -> int:
    """Fails its first run when asked to, then succeeds."""
    if fail and _r().hincrby(_k("tries"), str(i), 1) == 1:
        raise ValueError(f"first try of member {i}")
    _ran("flaky_once")
    return i


@task(name="wf.boom", retry_delay=0.01, max_attempts=2)
def boom(i: int) -> None:
    _ran("boom")
    raise RuntimeError(f"boom {i}")


@task(name="wf.on_error", retry_delay=0.05)
def on_error(failed_step: str) -> None:
    _ran("on_error")
    _r().rpush(_k("errors"), failed_step)


@task(name="wf.slow_first", lease=2.0, retry_delay=0.05, max_attempts=3)
def slow_first(x: int, tag: str, hold: float = 30.0) -> int:
    """Tells the test it started (its pid on a list), and on its first run sleeps ``hold``
    seconds: long enough to be killed mid-run."""
    first = _r().hincrby(_k("starts"), tag, 1) == 1
    _r().rpush(_k("started:" + tag), os.getpid())
    if first:
        time.sleep(hold)
    _ran("slow_first")
    return x + 1


@task(name="wf.gate", retry_delay=0.05)
def gate(x: int, tag: str) -> int:
    """Waits until the test opens the gate (a list it pushes to), so a chain can be held
    at a step."""
    _r().rpush(_k("at:" + tag), "1")
    _r().blpop([_k("open:" + tag)], timeout=30)
    _ran("gate")
    return x


@task(name="wf.sub", retry_delay=0.05, lease=2.0)
def sub(x: int, y: int = 0) -> int:
    """Not commutative: shows which argument a parent's result took."""
    _ran("sub")
    return x - y


@task(name="wf.ident", retry_delay=0.05, lease=2.0)
def ident(x: Any) -> Any:
    """Returns what it got (a collected value, nested lists and all)."""
    _ran("ident")
    return x
