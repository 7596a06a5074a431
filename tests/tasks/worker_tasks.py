"""Tasks the worker tests run in real worker processes. Each records what it did in Redis."""

from __future__ import annotations

import os
import time

from emqtasks import Retry, default_app, task


def _r():  # type: ignore[no-untyped-def]
    return default_app.client


def _k(name: str) -> str:
    """Keys are per queue (the worker points the default app at its -Q), so tests never mix."""
    return f"t:{default_app.settings.queue}:{name}"


@task(name="t.record", group=lambda tag, *a, **k: tag.split(":")[0], retry_delay=0.05)
def record(tag: str) -> str:
    """Counts itself and notes its start order (a sequence number) and its child's pid."""
    r = _r()
    seq = r.incr(_k("seq"))
    pipe = r.pipeline()
    pipe.hincrby(_k("runs"), tag, 1)
    pipe.rpush(_k("order"), tag)
    pipe.hset(_k("seqof"), tag, seq)
    pipe.execute()
    return tag


@task(name="t.sleepy", group="sleepy", retry_delay=0.05, lease=1.0)
def sleepy(tag: str, seconds: float) -> str:
    r = _r()
    r.hset(_k("pid"), tag, os.getpid())
    r.hincrby(_k("starts"), tag, 1)
    time.sleep(seconds)
    r.hincrby(_k("runs"), tag, 1)
    return tag


@task(name="t.flaky", retry_delay=0.05, max_attempts=3)
def flaky(tag: str) -> int:
    """Fails twice (once by Retry with its own delay), then succeeds."""
    n = _r().hincrby(_k("tries"), tag, 1)
    if n == 1:
        raise ValueError(f"first try of {tag}")
    if n == 2:
        raise Retry(delay=0.01)
    _r().hincrby(_k("runs"), tag, 1)
    return n


@task(name="t.always_fails", retry_delay=0.01, max_attempts=2)
def always_fails() -> None:
    raise RuntimeError("no luck")


@task(name="t.slow_limited", time_limit=0.5, max_attempts=2, retry_delay=0.01)
def slow_limited(tag: str) -> None:
    _r().hincrby(_k("starts"), tag, 1)
    time.sleep(30)


@task(name="t.needs_two")
def needs_two(a: int, b: int) -> int:
    return a + b


@task(name="t.short_lived", group=lambda tag: tag, result_ttl=1)
def short_lived(tag: str) -> str:
    return tag
