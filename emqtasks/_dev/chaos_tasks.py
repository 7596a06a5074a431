"""The tasks of the chaos soak (:mod:`emqtasks._dev.chaos`). Each job's only argument is its
own id; a run that got to its end counts itself in a hash outside the queue, so the soak
can tell a lost job (no run) from a duplicate (more than one)."""

from __future__ import annotations

import random
import time
from typing import Any

from ..producer.app import App, default_app
from .taskclient import task_redis

#: Generous: a chaos event fails the attempt of every job in flight, and none of the jobs
#: that should succeed may run out of attempts.
ATTEMPTS = 30
LEASE = 2.0          # short, so the jobs of a SIGKILLed master come back quickly
#: Retries after 0.2 s, doubling to 1 s: a full server fails every attempt of the jobs that
#: run meanwhile (their count of runs is a write it refuses) for seconds at a time.
RETRY_BACKOFF, RETRY_BACKOFF_MAX = 0.2, 1.0

def runs_key(queue: str) -> str:
    return f"emqchaos:{queue}:runs"


def tries_key(queue: str) -> str:
    return f"emqchaos:{queue}:tries"


def group_of(job_id: str, **_: Any) -> str:
    return job_id.split("-", 1)[0]


def _ran(job_id: str) -> None:
    time.sleep(random.random() * 0.004)   # a few ms in flight, for the kills to land in
    task_redis().hincrby(runs_key(default_app.settings.queue), job_id, 1)


def work(job_id: str) -> None:
    """Succeeds."""
    _ran(job_id)


def flaky(job_id: str) -> None:
    """Fails its first try, then succeeds: a retry through `delayed`."""
    if task_redis().hincrby(tries_key(default_app.settings.queue), job_id, 1) == 1:
        raise RuntimeError(f"first try of {job_id} fails on purpose")
    _ran(job_id)


def doomed(job_id: str) -> None:
    """Always fails: must end in dead, and only these may."""
    raise RuntimeError(f"{job_id} always fails")


def bind(app: App) -> dict[str, Any]:
    """The chaos tasks registered on ``app``, by short name."""
    return {fn.__name__: app.task(fn, name=f"chaos.{fn.__name__}", group=group_of,
                                  lease=LEASE, retry_backoff=RETRY_BACKOFF,
                                  retry_backoff_max=RETRY_BACKOFF_MAX, retry_jitter=False,
                                  max_attempts=2 if fn is doomed else ATTEMPTS)
            for fn in (work, flaky, doomed)}


TASKS = bind(default_app)
