"""Workflows: a chain hands each result on, a chord collects 100 results, a dead step stops
its workflow and runs the error callback once.

    python examples/workflows.py
"""

from __future__ import annotations

import os
from pathlib import Path

from emqtasks import App, chain, chord
from emqtasks.errors import TaskFailed
from emqtasks.testing import worker_process

app = App(redis_url=os.environ.get("EMQ_REDIS_URL", "embedded"), queue="example-workflows")


@app.task
def fetch(n: int) -> int:
    return n * n


@app.task
def add(x: int, y: int) -> int:
    return x + y


@app.task
def total(xs: list[int]) -> int:
    return sum(xs)


@app.task(max_attempts=1)
def flaky(n: int) -> int:
    if n == 3:
        raise ValueError(f"member {n} cannot")
    return n


@app.task
def alert(failed_step: str) -> str:
    app.client.rpush("example-workflows:alerts", failed_step)
    return failed_step


def main() -> None:
    app.purge()
    app.client.delete("example-workflows:alerts")
    with worker_process(["workflows"], concurrency=2, path=str(Path(__file__).parent)):
        h = chain(fetch.s(3), add.s(1), add.s(10)).delay()          # add(add(9, 1), 10)
        print(f"chain -> {h.get(timeout=30)}")
        c = chord([fetch.s(i) for i in range(100)], total.s()).delay()
        print(f"chord of 100 -> {c.get(timeout=60)}")
        bad = chord([flaky.s(i).set(job_id=f"flaky-{i}") for i in range(5)], total.s()) \
            .apply_async(link_error=alert.s())
        try:
            bad.get(timeout=30)
        except TaskFailed as exc:
            print(f"chord failed at step {exc.job_id}; status {bad.status()}")
        step = app.client.blpop(["example-workflows:alerts"], timeout=30)
        print(f"link_error ran for {step[1] if step else None}")
        print("steps:", ", ".join(f"{s['task'].split('.')[-1]} {s['state']}"
                                  for s in app.workflow(bad.id).steps()[-2:]))
    app.client.delete("example-workflows:alerts")
    app.purge()


if __name__ == "__main__":
    main()
