"""The fence (attempts + nonce) of ack, retry, extend and release: a stale holder, a wrong
nonce, a token of a deleted and re-enqueued id are each refused and change nothing."""

from __future__ import annotations

from typing import Any

import pytest
from faults import assert_clean
from helpers import assert_invariants, expire_now, make_task, new_job

from emqtasks import App
from emqtasks.store.queue import Lease, Queue
from emqtasks.verdicts import AckVerdict, ReleaseVerdict, RetryVerdict

STALE = RetryVerdict.STALE


def _stolen(app, queue):
    """A ran (its lease renewed once), its lease expired, the job was reaped and claimed
    again by B."""
    make_task(app, group="A", max_attempts=5).delay(1)
    (a,) = queue.claim()
    queue.extend([a])
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


# -- the same, every structure of the queue compared, and the checker clean --------------

def _everything(q: Queue, job_id: str) -> dict[str, Any]:
    c, k = q.client, q.keys
    return {
        "row": c.hgetall(k.job(job_id)),
        "active": c.zrange(k.active, 0, -1, withscores=True),
        "delayed": c.zrange(k.delayed, 0, -1, withscores=True),
        "dead": c.zrange(k.dead, 0, -1, withscores=True),
        "gactive": c.hgetall(k.gactive),
        "ring": c.lrange(k.ring, 0, -1),
        "wake": c.lrange(k.wake, 0, -1),
        "done": c.lrange(k.done(job_id), 0, -1),
    }


def _refused_everything(q: Queue, stale: Lease) -> None:
    before = _everything(q, stale.id)
    assert q.ack(stale, '"from A"') == (False, None)
    assert q.retry(stale, "A's error") == STALE
    assert q.retry(stale, "A's final error", delay=0, final=True) == STALE
    assert q.extend([stale]) == [False]
    assert q.extend([stale], lease_ms=600_000) == [False]
    assert q.release(stale, "A lets go") is ReleaseVerdict.STALE
    after = _everything(q, stale.id)
    assert after == before
    row = after["row"]
    assert "result" not in row and not (row.get("error") or "").startswith("A")


@pytest.mark.timeout(30)
def test_a_stale_holder_can_neither_ack_retry_nor_extend(app: App) -> None:
    q = app.queue()
    q.enqueue_many([new_job("stale-1", group="g", lease_ms=200, max_attempts=5)])
    (a,) = q.claim()
    # A runs (renewed once), its lease expires and is reaped; B claims it with a new token
    q.extend([a])
    expire_now(q, a.id)
    assert q.reap() == (1, 0)
    (b,) = q.claim()
    assert b.id == a.id and b.attempts == a.attempts + 1 and b.nonce != a.nonce
    # A comes back: every fenced verb is refused and nothing of A's is written
    _refused_everything(q, a)
    assert q.client.hget(q.keys.gactive, "g") == "1"
    # B still holds a good lease
    assert q.extend([b]) == [True]
    assert q.ack(b, '"from B"') == (True, None)
    row = q.client.hgetall(q.keys.job(b.id))
    assert row["state"] == "done" and row["result"] == '"from B"' and row["attempts"] == "2"
    assert_clean(q)


@pytest.mark.timeout(30)
def test_the_nonce_refuses_a_token_from_a_deleted_and_reenqueued_job(app: App) -> None:
    q = app.queue()
    q.enqueue_many([new_job("stale-2", group="g", lease_ms=200, ttl=0, max_attempts=5)])
    (a,) = q.claim()
    assert a.attempts == 1
    # A's lease expires; B takes the job over and finishes it: ttl 0 deletes the row
    expire_now(q, a.id)
    assert q.reap() == (1, 0)
    (b,) = q.claim()
    assert q.ack(b, "null") == (True, None)
    assert not q.client.exists(q.keys.job("stale-2"))
    # The same id enqueued again: attempts start over, so C's count equals A's
    assert q.enqueue_many([new_job("stale-2", group="g", lease_ms=30_000, ttl=0,
                                   max_attempts=5)]) == [1]
    (c,) = q.claim()
    assert c.id == a.id and c.attempts == a.attempts == 1 and c.nonce != a.nonce
    # A's old token still fails: the nonce tells the holders apart
    _refused_everything(q, a)
    assert q.client.hget(q.keys.job(c.id), "state") == "active"
    assert q.extend([c]) == [True]
    assert q.ack(c, "null") == (True, None)
    assert_clean(q)
