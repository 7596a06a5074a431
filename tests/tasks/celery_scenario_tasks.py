"""Tasks of tests/test_celery_scenarios.py: Celery's user-facing scenarios as a Celery user
writes their tasks, on emqtasks' own @task. Each notes what it did under the cs: keys of the
worker's queue (the server's clock for times, so the test and the worker agree)."""

from __future__ import annotations

import json
import time
from typing import Any

from emqtasks import SoftTimeLimitExceeded, current_job, default_app, task


def _r() -> Any:
    return default_app.client


def key(name: str, queue: str | None = None) -> str:
    return f"cs:{queue or default_app.settings.queue}:{name}"


def _stamp(tag: str) -> None:
    """One run of ``tag``, at the server's time in ms."""
    secs, micros = _r().time()
    _r().rpush(key(f"at:{tag}"), int(secs) * 1000 + int(micros) // 1000)


@task(name="cs.add", retry_delay=0.05)
def add(x: int, y: int = 0) -> int:
    return x + y


@task(name="cs.sub", retry_delay=0.05)
def sub(x: int, y: int) -> int:
    return x - y


@task(name="cs.tsum")
def tsum(xs: list[int]) -> int:
    return sum(xs)


@task(name="cs.ident")
def ident(x: Any) -> Any:
    return x


@task(name="cs.boom", max_retries=0)
def boom(x: int) -> int:
    raise RuntimeError(f"boom {x}")


@task(name="cs.ran")
def ran(tag: str) -> str:
    """Marks that it ran: a task revoked or expired must never."""
    _r().rpush(key(f"ran:{tag}"), current_job().id)
    return tag


@task(name="cs.record")
def record(value: Any) -> Any:
    """A link= / link_error= callback: keeps what it was given."""
    _r().rpush(key("record"), json.dumps(value))
    return value


@task(name="cs.retry_n", bind=True, max_retries=5)
def retry_n(self, tag: str, times: int, countdown: float) -> int:  # type: ignore[no-untyped-def]
    _stamp(tag)
    if self.request.retries < times:
        raise self.retry(countdown=countdown)
    return int(self.request.retries)


@task(name="cs.always_retry", bind=True, max_retries=2, default_retry_delay=0.05)
def always_retry(self, tag: str, with_exc: bool) -> None:  # type: ignore[no-untyped-def]
    _stamp(tag)
    try:
        raise LookupError(f"not there yet: {tag}")
    except LookupError as exc:
        raise self.retry(exc=exc if with_exc else None) from None


@task(name="cs.flaky_io", autoretry_for=(ConnectionError,), retry_backoff=0.2,
      retry_jitter=False, max_retries=3)
def flaky_io(tag: str, failures: int) -> str:
    """Fails ``failures`` times with a ConnectionError, then answers."""
    _stamp(tag)
    if _r().llen(key(f"at:{tag}")) <= failures:
        raise ConnectionError(f"{tag} unreachable")
    return f"{tag} ok"


@task(name="cs.wrong_kind", autoretry_for=(ConnectionError,), max_retries=3)
def wrong_kind(tag: str) -> None:
    _stamp(tag)
    raise ValueError(f"{tag}: not retried")


@task(name="cs.slow", soft_time_limit=0.3, time_limit=10, max_retries=0)
def slow(tag: str) -> str:
    _stamp(tag)
    try:
        time.sleep(8)
        return "finished"
    except SoftTimeLimitExceeded:
        return f"{tag}: cleaned up"


@task(name="cs.fire_and_forget", ignore_result=True)
def fire_and_forget(x: int) -> int:
    _r().rpush(key("forgotten"), x)
    return x * 2


@task(name="cs.whoami", bind=True)
def whoami(self, x: int) -> list[Any]:  # type: ignore[no-untyped-def]
    return [self.request.id, self.request.retries, self.name, x]
