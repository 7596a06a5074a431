"""Release: a held job handed back unrun, its attempt rolled back, its place in the lane kept."""

from __future__ import annotations

from helpers import assert_invariants, make_task

from emqtasks.verdicts import AckVerdict, ReleaseVerdict


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
