"""Tasks of tests/test_task_api.py: Celery's task API on emqtasks' own @task, run by real
worker processes. Each records what it did in Redis, under the t2: keys of the worker's
first queue (day2.py's helpers read and clean them)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from emqtasks import SoftTimeLimitExceeded, default_app, task


def _r():  # type: ignore[no-untyped-def]
    return default_app.client


def _k(name: str) -> str:
    return f"t2:{default_app.settings.queue}:{name}"


def _stamp(tag: str) -> None:
    secs, micros = _r().time()
    _r().rpush(_k(f"at:{tag}"), int(secs) * 1000 + int(micros) // 1000)


@task(name="api.whoami", bind=True, group="g1")
def whoami(self, x: int, y: int = 0) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    r = self.request
    if r.retries == 0:
        raise self.retry(countdown=0.05)
    return {"id": r.id, "retries": r.retries, "args": list(r.args), "kwargs": r.kwargs,
            "delivery_info": r.delivery_info, "name": self.name,
            "app": self.app is default_app, "called_directly": r.called_directly}


@task(name="api.async_whoami", bind=True)
async def async_whoami(self, x: int) -> list[Any]:  # type: ignore[no-untyped-def]
    await asyncio.sleep(0)
    return [self.request.id, list(self.request.args), self.name]


# automatic retry off (retry_for=()): self.retry still retries
@task(name="api.countdown_retry", bind=True, autoretry_for=(), max_retries=5)
def countdown_retry(self, tag: str, until: int) -> int:  # type: ignore[no-untyped-def]
    _stamp(tag)
    if self.request.retries < until:
        raise self.retry(countdown=0.4)
    return int(self.request.retries)


@task(name="api.exhaust", bind=True, max_retries=2, default_retry_delay=0.05)
def exhaust(self, tag: str, with_exc: bool) -> None:  # type: ignore[no-untyped-def]
    _r().hincrby(_k("tries"), tag, 1)
    try:
        raise ValueError(f"boom {tag}")
    except ValueError as exc:
        raise self.retry(exc=exc if with_exc else None) from None


@task(name="api.lowered", bind=True, max_retries=5, retry_delay=0.05)
def lowered(self, tag: str) -> None:  # type: ignore[no-untyped-def]
    _r().hincrby(_k("tries"), tag, 1)
    raise self.retry(max_retries=1)


@task(name="api.autoretry", autoretry_for=(KeyError,), max_retries=3,
      default_retry_delay=0.05)
def autoretry(tag: str, error: str) -> None:
    _r().hincrby(_k("tries"), tag, 1)
    raise KeyError(tag) if error == "key" else ValueError(tag)


@task(name="api.backoff", autoretry_for=(ValueError,), max_retries=3, retry_backoff=0.3,
      retry_jitter=False, retry_backoff_max=0.6)
def backoff(tag: str) -> None:
    _stamp(tag)
    raise ValueError(tag)


@task(name="api.soft", soft_time_limit=0.5, time_limit=10, max_retries=0)
def soft(tag: str) -> str:
    _stamp(tag)
    try:
        time.sleep(8)
        return "slept"
    except SoftTimeLimitExceeded:
        return "caught"


@task(name="api.soft_async", soft_time_limit=0.5, time_limit=10, max_retries=0)
async def soft_async(tag: str) -> str:
    _stamp(tag)
    try:
        await asyncio.sleep(8)
        return "slept"
    except SoftTimeLimitExceeded:
        await asyncio.sleep(0.01)    # the task goes on awaiting after it
        return "caught"


@task(name="api.soft_uncaught", soft_time_limit=0.3, max_retries=0)
def soft_uncaught() -> str:
    time.sleep(8)
    return "slept"


@task(name="api.quick_soft", soft_time_limit=0.3, max_retries=0)
def quick_soft() -> str:
    return "quick"


@task(name="api.rated", rate_limit="2/s")
def rated(i: int) -> int:
    _stamp("rated")
    return i


@task(name="api.ignored", ignore_result=True)
def ignored(x: int) -> int:
    _r().rpush(_k("ignored"), x)
    return x


@task(name="api.add")
def add(a: int, b: int) -> int:
    return a + b


@task(name="api.fail", max_retries=0)
def fail(x: int) -> int:
    raise ValueError(f"fail {x}")


@task(name="api.record")
def record(value: Any) -> Any:
    _r().rpush(_k("record"), json.dumps(value))
    return value


@task(name="api.soft_async_alone", soft_time_limit=0.4, max_retries=0)
async def soft_async_alone() -> str:
    """A soft limit without a hard one: the cancellation lands on the task running it."""
    try:
        await asyncio.sleep(8)
        return "slept"
    except SoftTimeLimitExceeded:
        await asyncio.sleep(0.01)
        return "caught alone"
