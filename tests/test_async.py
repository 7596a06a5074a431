"""async def tasks in real workers: results, retries, time limits, concurrency per child,
and recovery of every in-flight job when a child is killed."""

from __future__ import annotations

import os
import signal
import time

import day2_tasks as d2
import pytest
from day2 import cleanup, enqueue, key, start, total, wait_until

from emqtasks import App, TaskFailed

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _clean(app: App):  # type: ignore[no-untyped-def]
    yield
    cleanup(app)


@pytest.mark.parametrize("k", ["1", "8"])
def test_an_async_tasks_result_comes_back_through_get(app: App, k: str) -> None:
    with start(app, "--async-concurrency", k) as w:
        handles = [app.send_task(d2.async_add, (i, 1)) for i in range(10)]
        assert [h.get(timeout=20) for h in handles] == [i + 1 for i in range(10)]
        assert w.stop() == 0


@pytest.mark.parametrize("k", ["1", "8"])
def test_an_async_task_that_raises_is_retried(app: App, k: str) -> None:
    with start(app, "--async-concurrency", k):
        h = app.send_task(d2.async_flaky, ("f",))
        assert h.get(timeout=20) == 3   # failed twice, then succeeded
        assert int(app.client.hget(key(app, "tries"), "f")) == 3


@pytest.mark.parametrize("k", ["1", "8"])
def test_a_time_limit_stops_a_stuck_coroutine(app: App, k: str) -> None:
    with start(app, "--async-concurrency", k) as w:
        began = time.monotonic()
        h = app.send_task(d2.async_stuck, ("s",))
        with pytest.raises(TaskFailed, match="TimeLimitExceeded"):
            h.get(timeout=30)
        # two attempts of 0.5 s each, cancelled by the child (no kill: the child stays)
        assert time.monotonic() - began < 15
        assert int(app.client.hget(key(app, "starts"), "s")) == 2
        assert w.stop() == 0
        assert ", 0 died" in w.output(), w.output()[-2000:]


def test_one_child_runs_many_async_jobs_at_once(app: App) -> None:
    # Given -c 2 --async-concurrency 100, When 1,000 jobs each sleep 0.2 s
    with start(app, "--async-concurrency", "100") as w:
        began = time.monotonic()
        enqueue(app, d2.async_nap, [(f"g{i % 10}:{i}", 0.2) for i in range(1000)])
        wait_until(lambda: total(app, "runs") >= 1000, 60, "1,000 naps", w.output)
        elapsed = time.monotonic() - began
        # Then at least 50 ran at the same time, and the whole took far less than one
        # child at a time would (1,000 x 0.2 s / 2 children = 100 s)
        assert int(app.client.get(key(app, "peak"))) >= 50
        assert elapsed < 30, elapsed
        assert total(app, "runs") == 1000 == total(app, "starts")


def test_concurrency_ramps_up_when_jobs_trickle_in(app: App) -> None:
    # Given one child with room for 20, When jobs arrive one by one while others run
    with start(app, "--async-concurrency", "20", concurrency=1) as w:
        for i in range(10):
            enqueue(app, d2.async_nap, [(f"t:{i}", 2.0)])
            time.sleep(0.05)
        wait_until(lambda: total(app, "runs") >= 10, 30, "the trickle", w.output)
        # Then they overlapped: the child took each one while the others awaited
        assert int(app.client.get(key(app, "peak"))) >= 8


def test_sigkill_of_a_child_running_20_async_jobs_loses_none(app: App) -> None:
    # Given one child running 20 long async jobs
    with start(app, "--async-concurrency", "20", concurrency=1) as w:
        enqueue(app, d2.async_nap, [(f"k:{i}", 3.0) for i in range(20)])
        wait_until(lambda: total(app, "starts") >= 20, 20, "20 starts", w.output)
        pid = int(app.client.hget(key(app, "pid"), "k:0"))
        # When the child is killed
        os.kill(pid, signal.SIGKILL)
        # Then all 20 complete afterwards, exactly once each
        wait_until(lambda: total(app, "runs") >= 20, 60, "20 completions", w.output)
        time.sleep(0.5)
        runs = app.client.hgetall(key(app, "runs"))
        assert sorted(runs) == sorted(f"k:{i}" for i in range(20))
        assert set(runs.values()) == {"1"}, runs
        assert app.stats()["active"] == 0


def test_sigterm_lets_every_in_flight_async_job_finish(app: App) -> None:
    with start(app, "--async-concurrency", "30", concurrency=1) as w:
        enqueue(app, d2.async_nap, [(f"t:{i}", 1.5) for i in range(30)])
        wait_until(lambda: total(app, "starts") >= 30, 20, "30 starts", w.output)
        assert w.stop() == 0
        assert total(app, "runs") == 30
        assert app.stats()["active"] == 0
