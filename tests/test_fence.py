"""Leases: the deadline on the server clock, reaping expired ones, and the attempts+nonce fence."""

from __future__ import annotations

import time

from helpers import (
    assert_invariants,
    drain_wake,
    expire_now,
    make_task,
    ring,
    server_ms,
    wake_tokens,
)

from emqtasks.verdicts import AckVerdict, ReleaseVerdict, RetryVerdict

STALE = RetryVerdict.STALE


def test_the_active_score_is_the_lease_deadline_on_the_server_clock(app, queue):
    # Given a task with a 30 s lease
    make_task(app, lease=30.0).delay(1)
    # When it is claimed
    before = server_ms(queue)
    (lease,) = queue.claim()
    after = server_ms(queue)
    # Then its score in `active` is the server's now + 30,000 ms, and the row says active
    score = queue.client.zscore(queue.keys.active, lease.id)
    assert before + 30_000 <= score <= after + 30_000
    assert lease.lease_ms == 30_000 and lease.attempts == 1
    row = queue.client.hgetall(queue.keys.job(lease.id))
    assert row["state"] == "active" and row["attempts"] == "1" and row["nonce"] == lease.nonce
    assert int(queue.client.hget(queue.keys.gactive, "default")) == 1


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


def _stolen(app, queue):
    """A's lease expired, the job was reaped and claimed again by B."""
    make_task(app, group="A", max_attempts=5).delay(1)
    (a,) = queue.claim()
    expire_now(queue, a.id)
    assert queue.reap() == (1, 0)
    (b,) = queue.claim()
    assert b.id == a.id and b.attempts == a.attempts + 1
    return a, b


def _snapshot(queue, job_id):
    c, k = queue.client, queue.keys
    return (c.hgetall(k.job(job_id)), c.hgetall(k.gactive), c.zscore(k.active, job_id),
            c.zrange(k.delayed, 0, -1), c.zrange(k.dead, 0, -1), c.llen(k.ring))


def test_a_stale_holder_cannot_ack_retry_extend_or_release(app, queue):
    # Given A's lease expired and the job claimed again by B
    a, b = _stolen(app, queue)
    before = _snapshot(queue, a.id)
    # When A, late, tries every fenced verb
    assert queue.ack(a, '"late result"') == (False, None)
    assert queue.retry(a, "late error") == STALE
    assert queue.retry(a, "late error", final=True) == STALE
    assert queue.extend([a], lease_ms=600_000) == [False]
    assert queue.release(a) is ReleaseVerdict.STALE
    # Then nothing changed: no result, no error text, no books, no deadline
    assert _snapshot(queue, a.id) == before
    # And B still holds it and can complete it
    assert queue.ack(b, '"b result"')[0] is AckVerdict.DONE
    assert queue.client.hget(queue.keys.job(b.id), "result") == '"b result"'
    assert_invariants(queue)


def test_a_wrong_nonce_with_the_right_attempts_is_stale(app, queue):
    make_task(app).delay(1)
    (lease,) = queue.claim()
    forged = lease._replace(nonce="0" * 16)
    before = _snapshot(queue, lease.id)
    assert queue.ack(forged)[0] is AckVerdict.STALE
    assert queue.extend([forged]) == [False]
    assert _snapshot(queue, lease.id) == before


def test_an_old_token_is_refused_after_the_id_is_deleted_and_enqueued_again(app, queue):
    # Given A's lease stolen by B, B done, the row deleted and the id enqueued afresh
    a, b = _stolen(app, queue)
    assert queue.ack(b)[0] is AckVerdict.DONE
    queue.client.delete(queue.keys.job(a.id))
    t = make_task(app, group="A", max_attempts=5)
    assert t.apply_async(args=(2,), job_id=a.id).duplicate is False
    # When it is claimed again: its attempts restart, so A's count matches once more
    (c,) = queue.claim()
    assert (c.id, c.attempts) == (a.id, a.attempts) == (a.id, 1)
    before = _snapshot(queue, a.id)
    # Then A's old token is still refused by its nonce, and nothing changes
    assert queue.ack(a, '"ghost"') == (False, None)
    assert queue.retry(a, "ghost") == STALE
    assert queue.extend([a]) == [False]
    assert queue.release(a) is ReleaseVerdict.STALE
    assert _snapshot(queue, a.id) == before
    assert queue.ack(c)[0] is AckVerdict.DONE


def test_extend_pushes_the_deadline_out(app, queue):
    # Given a claimed job whose deadline is near
    make_task(app, lease=30.0).delay(1)
    (lease,) = queue.claim()
    queue.client.zadd(queue.keys.active, {lease.id: server_ms(queue) + 1_000}, xx=True)
    # When it is extended by its own lease, and then by a longer one
    assert queue.extend([lease]) == [True]
    now = server_ms(queue)
    assert abs(queue.client.zscore(queue.keys.active, lease.id) - (now + 30_000)) < 1_000
    assert queue.extend([lease], lease_ms=120_000) == [True]
    now = server_ms(queue)
    assert abs(queue.client.zscore(queue.keys.active, lease.id) - (now + 120_000)) < 1_000
    # Then a reap finds nothing to take back
    assert queue.reap() == (0, 0)


def test_extend_answers_per_lease(app, queue):
    make_task(app).map([(1,), (2,)])
    live, gone = queue.claim(2)
    assert queue.ack(gone)[0]
    assert queue.extend([live, gone]) == [True, False]


def test_ack_with_claim_next_returns_the_next_lease_in_the_same_call(app, queue):
    # Given two lanes with work
    t = make_task(app, group=lambda g, *_: g, result_ttl=60)
    t.map([("A", 1), ("A", 2), ("B", 1)])
    (first,) = queue.claim()
    # When the first job is acknowledged asking for the next
    done, nxt = queue.ack(first, '{"ok":true}', claim_next=True)
    # Then it is done with its result, and the next lease came from the next turn
    assert done is AckVerdict.DONE
    assert queue.status(first.id) == "done"
    assert app.job(first.id)["result"] == '{"ok":true}'
    assert 0 < queue.client.ttl(queue.keys.job(first.id)) <= 60
    assert nxt is not None and nxt.group == "B" and nxt.attempts == 1
    assert queue.client.zscore(queue.keys.active, nxt.id) is not None
    # And draining with claim_next ends with None
    _, last = queue.ack(nxt, claim_next=True)
    assert last is not None and last.group == "A"
    assert queue.ack(last, claim_next=True) == (True, None)
    assert queue.client.zcard(queue.keys.active) == 0
    assert_invariants(queue)


def test_ack_with_no_result_ttl_deletes_the_row(app, queue):
    make_task(app, result_ttl=0).delay(1)
    (lease,) = queue.claim()
    assert queue.ack(lease)[0] is AckVerdict.DONE
    assert not queue.client.exists(queue.keys.job(lease.id))


def test_release_hands_the_job_back_unrun_with_its_attempt_rolled_back(app, queue):
    make_task(app, group="A").map([(1,), (2,)])
    (lease,) = queue.claim()
    assert queue.release(lease) is ReleaseVerdict.RELEASED
    row = queue.client.hgetall(queue.keys.job(lease.id))
    assert row["state"] == "pending" and row["attempts"] == "0"
    # It keeps its place at the head of its lane, and the old token is now stale
    (again,) = queue.claim()
    assert again.id == lease.id and again.attempts == 1 and again.nonce != lease.nonce
    assert queue.ack(lease)[0] is AckVerdict.STALE
    assert_invariants(queue)
