"""Reap: expired leases go back to their lane (or to dead, out of attempts), live ones are
left alone; a claim never seen running (no renewal reached the server) is given back without
spending its attempt; deadlines on the server clock, a limit per call; the queue's clock
mark; an attempt whose abort was asked ends aborted when its lease expires."""

from __future__ import annotations

import time

import pytest
from helpers import assert_invariants, drain_wake, expire_now, make_task, ring, wake_tokens

from emqtasks.errors import TaskFailed
from emqtasks.verdicts import AbortAsk, RetryVerdict

pytestmark = pytest.mark.timeout(60)

REAP_ABORTED = "Aborted: asked, and its lease expired"


def test_reap_returns_an_expired_lease_to_its_lane(app, queue):
    # Given a claimed job, seen running (its lease renewed once), whose lease has run out
    make_task(app, group="A", max_attempts=3).delay(1)
    (lease,) = queue.claim()
    assert ring(queue) == []
    queue.extend([lease])
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
    # Given a job with one attempt, claimed and seen running, its lease expired
    make_task(app, group="A", max_attempts=1).delay(1)
    (lease,) = queue.claim()
    queue.extend([lease])
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


def test_a_claim_never_seen_running_is_given_back_without_spending_an_attempt(app, queue):
    # Given a one-attempt job claimed by a holder that never renewed it (its claim reply
    # was lost: nobody ran it), its lease run out
    make_task(app, group="A", max_attempts=1).delay(1)
    (lease,) = queue.claim()
    expire_now(queue, lease.id)
    # When reaped, it is back at the head of its lane with its attempt given back
    assert queue.reap() == (1, 0)
    row = queue.client.hgetall(queue.keys.job(lease.id))
    assert row["state"] == "pending" and row["attempts"] == "0" and row["unrun"] == "1"
    assert "not counted" in row["error"] and row["fence"] == "1"
    assert ring(queue) == ["A"]
    assert_invariants(queue)
    # and its next claim is its first attempt again (the fence still grows)
    (again,) = queue.claim()
    assert (again.id, again.attempts, again.fence) == (lease.id, 1, 2)


def test_a_claim_given_back_every_time_still_ends_dead(app, queue):
    # A job whose leases keep expiring before it was seen running (a poison job that takes
    # its whole worker down at once) is given back max_attempts times, then its expiries
    # count again: it cannot loop for ever
    make_task(app, group="A", max_attempts=2).delay(1)
    seen = []
    for _ in range(4):
        (lease,) = queue.claim()
        expire_now(queue, lease.id)
        seen.append((queue.reap(), queue.job(lease.id)["attempts"]))
    assert seen == [((1, 0), 0), ((1, 0), 0), ((1, 0), 1), ((0, 1), 2)]
    assert queue.job(lease.id)["state"] == "dead"
    # a requeue gives it fresh attempts and fresh give-backs
    assert queue.requeue_dead(lease.id) == 1
    assert "unrun" not in queue.client.hgetall(queue.keys.job(lease.id))


def test_reap_keeps_the_queues_clock_mark(app, queue):
    # Each reap answers the server's time and the latest one a reap saw before, and moves
    # the mark up, never back
    first = queue.reap_tick()
    assert first.seen_ms == 0 and first.server_ms > 0
    second = queue.reap_tick()
    assert second.seen_ms == first.server_ms and second.server_ms >= first.server_ms
    ahead = second.server_ms + 3_600_000          # as a step back of the clock leaves it
    queue.client.hset(queue.keys.clock, "seen", ahead)
    third = queue.reap_tick()
    assert third.seen_ms == ahead and int(queue.client.hget(queue.keys.clock, "seen")) == ahead


@pytest.mark.parametrize("seen_running", [True, False])
def test_an_expired_attempt_whose_abort_was_asked_ends_aborted(app, queue, seen_running):
    # Given a claimed job (seen running, or not: a worker gone before its renewal) whose
    # abort was asked, a client waiting on it, and its worker gone: its lease has run out
    h = make_task(app, group="A", max_attempts=3).delay(1)
    (lease,) = queue.claim()
    if seen_running:
        queue.extend([lease])
    assert queue.abort_ask(lease.id) is AbortAsk.ASKED
    assert queue.outcome(lease.id, register=True)[0] == "active"
    expire_now(queue, lease.id)
    # When the reaper runs
    reaped = queue.reap()
    # Then the attempt ends aborted (counted with the dead: the job ended), never handed
    # back, never retried, not in `dead`; its waiter woken, get() raises the abort
    assert reaped == (0, 1)
    row = queue.client.hgetall(queue.keys.job(lease.id))
    assert row["state"] == "aborted" and row["error"] == REAP_ABORTED
    assert row["attempts"] == "1"
    assert queue.client.zscore(queue.keys.lane("A"), lease.id) is None
    assert queue.client.zscore(queue.keys.active, lease.id) is None
    assert queue.client.zscore(queue.keys.dead, lease.id) is None
    assert queue.client.hget(queue.keys.gactive, "A") in (None, "0")
    assert queue.wait_done(lease.id, 5.0)
    with pytest.raises(TaskFailed, match="aborted: Aborted: asked, and its lease expired"):
        h.get(timeout=5)
    assert h.status() == "aborted"
    assert queue.claim() == [] and queue.reap() == (0, 0)
    assert app.dead_jobs() == []
    assert_invariants(queue)


def test_an_expired_attempt_an_older_abort_named_is_handed_back(app, queue):
    # Given a job whose abort was asked of attempt 1, which failed and was retried (the
    # abort names attempt 1's nonce), and attempt 2 claimed, seen running, its lease expired
    make_task(app, group="A", max_attempts=3).delay(1)
    (first,) = queue.claim()
    assert queue.abort_ask(first.id) is AbortAsk.ASKED
    assert queue.retry(first, "boom", delay=0) is RetryVerdict.RETRIED
    queue.promote()
    (second,) = queue.claim()
    assert second.id == first.id and second.nonce != first.nonce
    assert queue.client.hget(queue.keys.job(first.id), "abort") == first.nonce
    queue.extend([second])
    expire_now(queue, second.id)
    # When the reaper runs
    assert queue.reap() == (1, 0)
    # Then the stale abort does not stop it: it is back in its lane, its third attempt next
    row = queue.client.hgetall(queue.keys.job(second.id))
    assert row["state"] == "pending" and row["error"] == "lease expired"
    assert_invariants(queue)
    (third,) = queue.claim()
    assert (third.id, third.attempts) == (first.id, 3)


def test_an_asked_attempt_whose_ttl_cannot_be_read_is_buried(app, queue):
    # Given an attempt whose abort was asked, its lease expired, its row's ttl not an integer
    make_task(app, group="A").delay(1)
    (lease,) = queue.claim()
    assert queue.abort_ask(lease.id) is AbortAsk.ASKED
    queue.client.hset(queue.keys.job(lease.id), "ttl", "soon")
    expire_now(queue, lease.id)
    # When the reaper runs: the job goes to `dead` with the reason, the tick goes on
    assert queue.reap() == (0, 1)
    row = queue.client.hgetall(queue.keys.job(lease.id))
    assert row["state"] == "dead" and row["error"] == "unreadable job row: ttl is not an integer"
    assert queue.client.zscore(queue.keys.dead, lease.id) is not None
    assert queue.claim() == []
