"""Tasks of tests/test_json_logs.py: one logs a line of its own, one fails its first attempt."""

from __future__ import annotations

import logging

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
