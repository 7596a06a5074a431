"""Retries through `delayed`, dead letters and requeue, countdown / eta, ghosts, cancel, purge."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
from helpers import assert_invariants, count_keys, due_now, make_task, new_job, ring, server_ms

from emqtasks import App
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


def test_promote_brings_a_retry_back_when_due(app, queue):
    make_task(app, group="A", retry_delay=60.0).delay(1)
    (lease,) = queue.claim()
    assert queue.retry(lease, "boom", delay=0) == RETRIED
    assert queue.promote() == (1, None)
    assert queue.status(lease.id) == "pending" and ring(queue) == ["A"]
    (again,) = queue.claim()
    assert (again.id, again.attempts) == (lease.id, 2)


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


def _kill(app, queue, n):
    make_task(app, group="A", max_attempts=1).map([(i,) for i in range(n)])
    for lease in queue.claim(n):
        assert queue.retry(lease, f"boom {lease.id}") == DEAD
    assert queue.client.zcard(queue.keys.dead) == n


def test_requeue_dead_one_brings_it_back_with_fresh_attempts(app, queue):
    _kill(app, queue, 3)
    victim = app.dead_jobs()[0]["id"]
    assert app.requeue_dead(victim) == 1
    assert app.requeue_dead(victim) == 0  # no longer dead
    assert queue.status(victim) == "pending" and app.job(victim)["attempts"] == 0
    assert queue.client.zcard(queue.keys.dead) == 2
    (lease,) = queue.claim()
    assert lease.id == victim and lease.attempts == 1
    assert_invariants(queue)


def test_requeue_dead_all_brings_every_one_back(app, queue):
    _kill(app, queue, 600)  # more than one requeue call's batch of 500
    assert app.requeue_dead() == 600
    assert queue.client.zcard(queue.keys.dead) == 0
    assert app.stats()["groups"]["A"]["pending"] == 600
    assert ring(queue) == ["A"]
    assert all(l.attempts == 1 for l in queue.claim(600))


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


def test_claim_skips_a_ghost_and_serves_the_next_real_job(app, queue):
    # Given lane A whose head job's row was deleted, and lane B with a job
    t = make_task(app, group=lambda g, *_: g)
    ghost, real = t.delay("A", 1), t.delay("A", 2)
    other = t.delay("B", 1)
    queue.client.delete(queue.keys.job(ghost.id))
    # When claiming
    first, second = queue.claim(2)
    # Then the ghost is skipped, the next real job returned, and the books hold
    assert (first.id, second.id) == (real.id, other.id)
    assert queue.client.zscore(queue.keys.lane("A"), ghost.id) is None
    assert ring(queue) == []
    assert queue.claim() == []
    assert_invariants(queue)


def test_a_lane_of_ghosts_leaves_the_ring(app, queue):
    t = make_task(app, group=lambda g, *_: g)
    ghosts = [t.delay("A", i).id for i in range(3)]
    other = t.delay("B", 1)
    for job_id in ghosts:
        queue.client.delete(queue.keys.job(job_id))
    assert [l.id for l in queue.claim(5)] == [other.id]
    assert ring(queue) == [] and not queue.client.exists(queue.keys.lane("A"))
    assert_invariants(queue)


def test_cancel_answers_by_state(app, queue):
    t = make_task(app, group="A")
    running, pending = t.delay(1), t.delay(2)
    later = t.apply_async(args=(3,), countdown=60)
    assert queue.claim()[0].id == running.id
    # Pending: withdrawn from its lane, which leaves the ring once empty
    assert app.cancel(pending.id) == "cancelled"
    assert pending.status() == "cancelled"
    assert queue.client.zscore(queue.keys.lane("A"), pending.id) is None
    assert ring(queue) == []
    with pytest.raises(TaskFailed, match="cancelled"):
        pending.get(timeout=1)
    # Active: not interrupted
    assert app.cancel(running.id) == "active" and running.status() == "active"
    # Delayed: withdrawn from `delayed`
    assert app.cancel(later.id) == "cancelled"
    assert queue.client.zcard(queue.keys.delayed) == 0
    # Missing and finished
    assert app.cancel("no-such-job") == "missing"
    assert app.cancel(pending.id) == "finished"
    assert_invariants(queue)


def test_cancelling_one_of_many_pending_keeps_the_lane_on_the_ring(app, queue):
    t = make_task(app, group="A")
    a, b = t.delay(1), t.delay(2)
    assert app.cancel(a.id) == "cancelled"
    assert ring(queue) == ["A"]
    assert [l.id for l in queue.claim(3)] == [b.id]


def test_purge_removes_every_key_of_the_queue_and_only_those(app, queue, redis_url):
    # Given a queue with something in every structure, and a neighbour queue
    t = make_task(app, group=lambda g, *_: g, max_attempts=1)
    t.map([("A", i) for i in range(5)] + [("B", i) for i in range(3)])
    t.apply_async(args=("C", 1), countdown=60)
    app.set_group_limit("A", 3)
    app.set_group_weight("B", 2)
    app.pause_group("C")
    app.pause()
    neighbour = App(redis_url=redis_url, queue=queue.name + "-n")
    try:
        neighbour.queue().enqueue_many([new_job("keep-me")])
        app.resume()
        leases = queue.claim(3)
        assert queue.retry(leases[0], "boom") == DEAD
        assert count_keys(queue) > 10
        # When it is purged
        removed = app.purge()
        # Then every key of the queue is gone, and the neighbour is untouched
        assert removed > 10 and count_keys(queue) == 0
        assert neighbour.queue().status("keep-me") == "pending"
    finally:
        neighbour.purge()
        neighbour.close()
