"""Tasks the bad-input and security tests run in real worker processes. They touch no
Redis keys of their own, so they also run under the least-privilege worker ACL."""

from __future__ import annotations

import time

from emqtasks import task


@task(name="sec.add")
def add(a: int, b: int) -> int:
    return a + b


@task(name="sec.fails_loudly", retry_delay=0.01, max_attempts=2)
def fails_loudly(blob: str) -> None:
    """Fails with its whole (large) argument in the exception message."""
    raise ValueError(f"cannot use {blob}")


@task(name="sec.sleep", group="sleepy", lease=0.6, retry_delay=0.01)
def sleep(seconds: float) -> float:
    """Outlives its 0.6 s lease when seconds > 0.6: the master must renew it."""
    time.sleep(seconds)
    return seconds


@task(name="sec.echo")
def echo(value: object) -> object:
    return value


@task(name="sec.nested")
def nested(depth: int) -> list[object]:
    out: list[object] = []
    for _ in range(depth):
        out = [out]
    return out
