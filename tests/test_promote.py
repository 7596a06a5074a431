"""Promote: retries, countdowns and etas move from `delayed` to their lane once due, and
promote says how long until the next one is."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
from helpers import due_now, make_task, ring

from emqtasks.verdicts import RetryVerdict

RETRIED = RetryVerdict.RETRIED


def test_promote_brings_a_retry_back_when_due(app, queue):
    make_task(app, group="A", retry_delay=60.0).delay(1)
    (lease,) = queue.claim()
    assert queue.retry(lease, "boom", delay=0) == RETRIED
    assert queue.promote() == (1, None)
    assert queue.status(lease.id) == "pending" and ring(queue) == ["A"]
    (again,) = queue.claim()
    assert (again.id, again.attempts) == (lease.id, 2)


def test_countdown_goes_through_delayed_and_is_promoted_on_time(app, queue):
    # Given a job with a 300 ms countdown
    h = make_task(app, group="A").apply_async(args=(1,), countdown=0.3)
    assert h.status() == "delayed"
    # When promote runs right away, nothing moves, and it says when to come back
    moved, next_in = queue.promote()
    assert moved == 0 and 0.0 < next_in <= 0.3
    assert queue.claim() == []
    # Then once due it moves
    time.sleep(next_in + 0.05)  # waiting for the server clock, not polling
    assert queue.promote() == (1, None)
    assert h.status() == "pending" and queue.claim()[0].id == h.id


@pytest.mark.parametrize("kind", ["datetime", "naive-datetime", "timestamp"])
def test_eta_goes_through_delayed_and_is_promoted_on_time(app, queue, kind):
    at = datetime.now(timezone.utc) + timedelta(seconds=0.3)
    eta = {"datetime": at, "naive-datetime": at.astimezone().replace(tzinfo=None),
           "timestamp": at.timestamp()}[kind]
    h = make_task(app).apply_async(args=(1,), eta=eta)
    assert h.status() == "delayed"
    moved, next_in = queue.promote()
    assert moved == 0 and 0.0 < next_in <= 0.3
    time.sleep(next_in + 0.05)
    assert queue.promote()[0] == 1


def test_an_eta_in_the_past_is_enqueued_at_once(app, queue):
    h = make_task(app).apply_async(eta=datetime.now(timezone.utc) - timedelta(hours=1))
    assert h.status() == "pending"


def test_promote_says_how_long_until_the_next_due_job(app, queue):
    assert queue.promote() == (0, None)
    t = make_task(app)
    t.apply_async(countdown=10)
    soon = t.apply_async(countdown=4)
    moved, next_in = queue.promote()
    assert moved == 0 and 3.5 < next_in <= 4.0
    due_now(queue, soon.id)
    moved, next_in = queue.promote()
    assert moved == 1 and 9.0 < next_in <= 10.0


def test_promote_respects_its_limit_and_says_more_are_due(app, queue):
    t = make_task(app)
    ids = [t.apply_async(args=(i,), countdown=60).id for i in range(3)]
    for job_id in ids:
        due_now(queue, job_id)
    assert queue.promote(limit=2) == (2, 0.0)
    assert queue.promote() == (1, None)
