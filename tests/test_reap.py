"""Reap: expired leases go back to their lane (or to dead, out of attempts), live ones are
left alone; deadlines on the server clock, a limit per call."""

from __future__ import annotations

import time

from helpers import assert_invariants, drain_wake, expire_now, make_task, ring, wake_tokens


def test_reap_returns_an_expired_lease_to_its_lane(app, queue):
    # Given a claimed job whose lease has run out
    make_task(app, group="A", max_attempts=3).delay(1)
    (lease,) = queue.claim()
    assert ring(queue) == []
    expire_now(queue, lease.id)
    drain_wake(queue)
    # When the reaper runs
    assert queue.reap() == (1, 0)
    # Then the job is pending in its lane again, attempts kept, books and ring mended
    row = queue.client.hgetall(queue.keys.job(lease.id))
    assert row["state"] == "pending" and row["attempts"] == "1"
    assert row["error"] == "lease expired"
    assert queue.client.zscore(queue.keys.lane("A"), lease.id) is not None
    assert queue.client.zscore(queue.keys.active, lease.id) is None
    assert queue.client.hget(queue.keys.gactive, "A") in (None, "0")
    assert ring(queue) == ["A"] and wake_tokens(queue) == 1
    assert_invariants(queue)
    # And the next claim is its second attempt
    (again,) = queue.claim()
    assert (again.id, again.attempts) == (lease.id, 2)


def test_reap_leaves_live_leases_alone(app, queue):
    make_task(app, lease=30.0).map([(1,), (2,)])
    a, b = queue.claim(2)
    expire_now(queue, a.id)
    assert queue.reap() == (1, 0)
    assert queue.client.zscore(queue.keys.active, b.id) is not None
    assert queue.reap() == (0, 0)


def test_a_short_lease_expires_on_the_server_clock(app, queue):
    make_task(app, lease=0.05).delay(1)
    (lease,) = queue.claim()
    assert queue.reap() == (0, 0)
    time.sleep(0.15)  # let the server clock pass the 50 ms deadline
    assert queue.reap() == (1, 0)
    assert queue.status(lease.id) == "pending"


def test_reap_sends_a_job_out_of_attempts_to_dead(app, queue):
    # Given a job with one attempt, claimed, its lease expired
    make_task(app, group="A", max_attempts=1).delay(1)
    (lease,) = queue.claim()
    expire_now(queue, lease.id)
    # When reaped
    assert queue.reap() == (0, 1)
    # Then it is dead, with the reason, and the books are clean
    assert queue.status(lease.id) == "dead"
    assert queue.client.zscore(queue.keys.dead, lease.id) is not None
    assert app.dead_jobs()[0]["error"] == "lease expired"
    assert queue.client.hget(queue.keys.gactive, "A") in (None, "0")
    assert ring(queue) == []
    assert_invariants(queue)


def test_reap_respects_its_limit(app, queue):
    make_task(app).map([(i,) for i in range(5)])
    for lease in queue.claim(5):
        expire_now(queue, lease.id)
    assert queue.reap(limit=2) == (2, 0)
    assert queue.reap() == (3, 0)
    assert_invariants(queue)
