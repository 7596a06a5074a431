"""Retries: a raised exception retries after the task's delay; Retry(delay=...) picks its own.

    python examples/retries.py
"""

from __future__ import annotations

import os
from pathlib import Path

from emqtasks import App, Retry
from emqtasks.errors import TaskFailed
from emqtasks.testing import worker_process

app = App(redis_url=os.environ.get("EMQ_REDIS_URL", "embedded"), queue="example-retries")


@app.task(max_attempts=5, retry_delay=0.1)
def call_flaky_api(order_id: int) -> str:
    calls = app.client.incr(f"example-retries:calls:{order_id}")
    if calls < 3:
        raise Retry(delay=0.2, reason=f"API busy (call {calls})")   # wait 0.2 s, try again
    return f"order {order_id} confirmed after {calls} calls"


@app.task(max_attempts=2, retry_delay=0.1)
def always_broken(order_id: int) -> None:
    raise ValueError(f"order {order_id} is malformed")


def main() -> None:
    app.purge()
    app.client.delete("example-retries:calls:1")
    with worker_process(["retries"], concurrency=2, path=str(Path(__file__).parent)):
        print(call_flaky_api.delay(1).get(timeout=30))
        try:
            always_broken.delay(2).get(timeout=30)
        except TaskFailed as exc:
            print(f"dead after its attempts: {exc}")
        for job in app.dead_jobs():
            print(f"in dead: {job['task']} attempts={job['attempts']}")
        print(f"requeued {app.requeue_dead()} dead job(s) with fresh attempts")
    app.purge()
    app.client.delete("example-retries:calls:1")


if __name__ == "__main__":
    main()
