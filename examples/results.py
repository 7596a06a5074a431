"""Waiting on results: get() blocks on the job's own notification, no polling loop.

    python examples/results.py
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from emqtasks import App
from emqtasks.errors import TaskFailed
from emqtasks.testing import worker_process

app = App(redis_url=os.environ.get("EMQ_REDIS_URL", "embedded"), queue="example-results")


@app.task
def add(a: int, b: int) -> int:
    return a + b


@app.task(max_attempts=1)
def divide(a: int, b: int) -> float:
    return a / b


@app.task
def slow(seconds: float) -> str:
    time.sleep(seconds)
    return "finally"


def main() -> None:
    app.purge()
    with worker_process(["results"], concurrency=2, path=str(Path(__file__).parent)):
        h = add.delay(2, 3)
        print(f"add -> {h.get(timeout=30)} (status {h.status()})")
        try:
            divide.delay(1, 0).get(timeout=30)
        except TaskFailed as exc:
            print(f"divide failed remotely: {exc.error.splitlines()[0]}")
        s = slow.delay(1.0)
        try:
            s.get(timeout=0.1)
        except TimeoutError:
            print(f"slow is still {s.status()} after 0.1 s")
        print(f"slow -> {s.get(timeout=30)}")
        info = app.job(h.id)
        print(f"job view: state={info['state']} attempts={info['attempts']} task={info['task']}")
    app.purge()


if __name__ == "__main__":
    main()
