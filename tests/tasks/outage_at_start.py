"""Imported by a worker with -A: every other connection the worker's Queue factory makes, and
its first reap, fail with a ConnectionError, as when the server restarts just as a master
starts (after its start-up probe answered)."""

from __future__ import annotations

import sys
from typing import Any

import redis

from emqtasks import task
from emqtasks.store.queue import Queue

# The module, not the command: emqtasks.cli's attribute `worker` is the click command.
worker_cli = sys.modules["emqtasks.cli.worker"]

_calls = {"connect": 0, "reap": 0}
_real_connect = worker_cli.connect
_real_reap = Queue.reap


def _connect(url: str, single_thread: bool = False) -> Any:
    _calls["connect"] += 1
    if single_thread and _calls["connect"] % 2 == 1:
        raise redis.exceptions.ConnectionError("injected: the server is restarting")
    return _real_connect(url, single_thread)


def _reap(self: Queue, limit: int = 1000, *args: Any, **kwargs: Any) -> tuple[int, int]:
    _calls["reap"] += 1
    if _calls["reap"] == 1:
        raise redis.exceptions.ConnectionError("injected: the server is restarting")
    return _real_reap(self, limit, *args, **kwargs)


worker_cli.connect = _connect   # type: ignore[assignment]
Queue.reap = _reap              # type: ignore[method-assign]


@task(name="outage.add")
def add(a: int, b: int) -> int:
    return a + b
