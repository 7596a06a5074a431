"""Retry: below max attempts a job waits its fixed delay in `delayed` (on the server clock);
at max attempts, or when final, it is dead with its error."""

from __future__ import annotations

import time

import pytest
from helpers import assert_invariants, make_task, server_ms

from emqtasks.errors import TaskFailed
from emqtasks.verdicts import RetryVerdict

RETRIED, DEAD = RetryVerdict.RETRIED, RetryVerdict.DEAD


def test_a_failure_below_max_attempts_waits_its_fixed_delay(app, queue):
    # Given a task with a 2 s retry delay, claimed once
    make_task(app, group="A", max_attempts=3, retry_delay=2.0).delay(1)
    (lease,) = queue.claim()
    # When it fails
    before = server_ms(queue)
    assert queue.retry(lease, "boom") == RETRIED
    after = server_ms(queue)
    # Then it waits in `delayed` until the server's now + 2,000 ms, with its error
    score = queue.client.zscore(queue.keys.delayed, lease.id)
    assert before + 2_000 <= score <= after + 2_000
    row = queue.client.hgetall(queue.keys.job(lease.id))
    assert row["state"] == "delayed" and row["error"] == "boom" and row["attempts"] == "1"
    assert queue.client.zscore(queue.keys.active, lease.id) is None
    assert queue.client.hget(queue.keys.gactive, "A") in (None, "0")
    # And promote leaves it there until it is due
    moved, next_in = queue.promote()
    assert moved == 0 and 1.0 < next_in <= 2.0
    assert_invariants(queue)


def test_a_short_retry_delay_passes_on_the_server_clock(app, queue):
    make_task(app, retry_delay=0.05).delay(1)
    (lease,) = queue.claim()
    assert queue.retry(lease, "boom") == RETRIED
    time.sleep(0.15)  # let the server clock pass the 50 ms due time
    assert queue.promote()[0] == 1
    assert queue.claim()[0].attempts == 2


def test_at_max_attempts_the_job_lands_in_dead_with_its_error(app, queue):
    # Given a job with two attempts
    h = make_task(app, group="A", max_attempts=2).delay(1)
    (first,) = queue.claim()
    assert queue.retry(first, "boom 1", delay=0) == RETRIED
    queue.promote()
    (second,) = queue.claim()
    # When its last attempt fails
    assert queue.retry(second, "Traceback...\nValueError: boom 2") == DEAD
    # Then it is dead with the error text, listed by dead_jobs, and get() raises it
    assert h.status() == "dead"
    assert queue.client.zscore(queue.keys.delayed, h.id) is None
    (dead,) = app.dead_jobs()
    assert dead["id"] == h.id and dead["error"].endswith("ValueError: boom 2")
    assert dead["attempts"] == 2 and dead["max_attempts"] == 2
    with pytest.raises(TaskFailed, match="ValueError: boom 2"):
        h.get(timeout=1)
    assert app.stats()["dead"] == 1
    assert_invariants(queue)


def test_a_final_failure_goes_to_dead_whatever_the_attempts_left(app, queue):
    make_task(app, max_attempts=5).delay(1)
    (lease,) = queue.claim()
    assert queue.retry(lease, "unknown task", final=True) == DEAD
    assert app.dead_jobs()[0]["error"] == "unknown task"
