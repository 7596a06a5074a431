"""Tasks of tests/test_json_logs.py: one logs a line of its own, one fails its first attempt."""

from __future__ import annotations

import logging
import os

from emqtasks import current_job, task

log = logging.getLogger("app.tasks")


@task(name="t.log.says")
def says(word: str) -> str:
    log.info("saying %s", word)
    return word


@task(name="t.log.second_time", retry_delay=0.01, max_attempts=3)
def second_time() -> int:
    if current_job().attempts == 1:
        raise ValueError("not the first time")
    return current_job().attempts


@task(name="t.log.dies_first", retry_delay=0.01, max_attempts=3)
def dies_first() -> int:
    """Its child dies on the first attempt: the master settles it (WorkerLost)."""
    if current_job().attempts == 1:
        os._exit(1)
    return current_job().attempts
