"""Tasks of the limit tests (tests/test_limits.py, tests/test_server_full.py), run in real
workers: results of a given size, a failure its child dies writing, jobs that wait for the
test to fill the server. They note what they did under ``t:<queue>:*``."""

from __future__ import annotations

import os
import signal

from emqtasks import default_app, task
from emqtasks.store.queue import Queue


def _r():  # type: ignore[no-untyped-def]
    return default_app.client


def _k(name: str) -> str:
    return f"t:{default_app.settings.queue}:{name}"


@task(name="lim.sized", group="sized", max_attempts=2, retry_delay=0.05)
def sized(n: int) -> str:
    """A result of n + 2 bytes of JSON (a string of n characters)."""
    return "x" * n


@task(name="lim.sized_big", group="sized", max_attempts=2, retry_delay=0.05,
      max_result_bytes=64_000_000)
def sized_big(n: int) -> str:
    """The same with a limit of its own, far over the default."""
    return "x" * n


@task(name="lim.dies_settling", group="settle", max_attempts=2, retry_delay=0.05)
def dies_settling(tag: str) -> None:
    """Fails, and its child dies while it writes that failure (as if SIGKILLed right then):
    the job is left for the master to settle."""
    def killed(*_args: object, **_kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    Queue.retry = killed   # type: ignore[method-assign]   # in this child only: it dies now
    raise ValueError(f"the real reason of {tag}")


@task(name="lim.held", group=lambda tag: tag, max_attempts=3, retry_delay=0.05, lease=2.0)
def held(tag: str) -> str:
    """Notes its start, then waits for the test's go (pushed as the server turns full) and
    returns: its ack is the one write it makes on a full server."""
    r = _r()
    r.hincrby(_k("starts"), tag, 1)
    r.blpop([_k("go")], timeout=15)
    return tag
