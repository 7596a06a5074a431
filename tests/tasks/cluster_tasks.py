"""Tasks for the cluster fault test: they touch no Redis key of their own, so the only
Redis traffic a job makes is the queue's (claim, ack), all in the queue's slot, and a
failover elsewhere in the cluster cannot fail a task body."""

from __future__ import annotations

import time

from emqtasks import task


@task(name="c.work", retry_delay=0.05, max_attempts=5, lease=5.0)
def work(tag: str, seconds: float = 0.005) -> str:
    time.sleep(seconds)
    return tag
