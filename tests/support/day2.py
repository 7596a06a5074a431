"""Helpers of the day-two tests: start a worker on day2_tasks, enqueue by the test's App,
read what the tasks recorded."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from workerproc import WorkerProc

from emqtasks import App, Task
from emqtasks.producer.task import build_job


def start(app: App, *extra: str, concurrency: int = 2, queues: str | None = None,
          env: dict[str, str] | None = None) -> WorkerProc:
    """A worker on day2_tasks serving the test's queue (or ``queues``), started and ready;
    ``env`` adds variables to its environment."""
    old = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        w = WorkerProc(app.settings.redis_url, queues or app.settings.queue, *extra,
                       concurrency=concurrency, modules=("day2_tasks",))
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    w.wait_ready()
    return w


def enqueue(app: App, task: Task[Any, Any], calls: Iterable[tuple[Any, ...]],
            queue: str | None = None) -> list[str]:
    """Enqueue calls of a task on the test's App (one round trip); returns the ids."""
    jobs = [build_job(task.spec, tuple(c), {}, limit=1_000_000) for c in calls]
    app.queue(queue).enqueue_many(jobs)
    return [j.id for j in jobs]


def key(app: App, name: str, queue: str | None = None) -> str:
    return f"t2:{queue or app.settings.queue}:{name}"


def total(app: App, name: str, queue: str | None = None) -> int:
    return sum(int(v) for v in app.client.hvals(key(app, name, queue)))


def wait_until(predicate: Callable[[], object], timeout: float, what: str,
               log: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{log()[-4000:]}")
        time.sleep(0.02)


def json_list(app: App, name: str, queue: str | None = None) -> list[dict[str, Any]]:
    return [json.loads(x) for x in app.client.lrange(key(app, name, queue), 0, -1)]


def cleanup(app: App, *queues: str) -> None:
    for q in (app.settings.queue, *queues):
        for k in app.client.scan_iter(match=f"t2:{q}:*"):
            app.client.delete(k)
