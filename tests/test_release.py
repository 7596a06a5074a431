"""Release: a held job handed back unrun, its attempt rolled back, its place in the lane kept."""

from __future__ import annotations

from helpers import assert_invariants, make_task

from emqtasks.verdicts import AbortAsk, AckVerdict, ReleaseVerdict


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


def test_a_release_of_an_attempt_whose_abort_was_asked_ends_it_aborted(app, queue):
    # Given a claimed job (held, not started) whose abort was asked, and a second one that
    # was claimed before that abort (its attempt not named by it)
    make_task(app, group="A").map([(1,), (2,)])
    lease, other = queue.claim(2)
    assert queue.abort_ask(lease.id) is AbortAsk.ASKED
    # When both are released (a hand-on, a warm stop, RateLimited)
    assert queue.release(lease, "handed on: held behind a long job") is ReleaseVerdict.RELEASED
    assert queue.release(other) is ReleaseVerdict.RELEASED
    # Then the one asked ends aborted, never claimed again; the other is back in its lane
    row = queue.client.hgetall(queue.keys.job(lease.id))
    assert row["state"] == "aborted"
    assert row["error"] == ("Aborted: asked before it was released; "
                            "handed on: held behind a long job")
    assert queue.client.hget(queue.keys.job(other.id), "state") == "pending"
    assert [again.id for again in queue.claim(2)] == [other.id]
    assert_invariants(queue)
