"""Admin verbs: group limits, pause and resume of the queue and of a lane (each re-rings with a
wake), weights in stats, cancel, requeue of dead jobs, purge; wake tokens stay bounded."""

from __future__ import annotations

import pytest
from helpers import (
    assert_invariants,
    count_keys,
    drain_wake,
    flood,
    make_task,
    new_job,
    ring,
    wake_tokens,
)

from emqtasks import App
from emqtasks.errors import InvalidArgument, InvalidGroup, TaskFailed
from emqtasks.verdicts import AckVerdict, RetryVerdict

DEAD = RetryVerdict.DEAD


def fill(app, group, n):
    return make_task(app, name=f"tests.limits.{group}", group=group).map(
        [(i,) for i in range(n)])


def groups_of(leases):
    return [l.group for l in leases]


# -- limits ------------------------------------------------------------------------------

def test_a_group_at_its_limit_is_not_served(app, queue):
    # Given A limited to 2 with 5 pending, and B with 3
    fill(app, "A", 5)
    fill(app, "B", 3)
    app.set_group_limit("A", 2)
    # When claims take two of A in flight
    first = queue.claim(4)
    assert groups_of(first) == ["A", "B", "A", "B"]
    # Then a further claim serves another group, and once B is drained nothing
    assert groups_of(queue.claim()) == ["B"]
    assert queue.claim() == []
    assert ring(queue) == []
    stats = app.stats()["groups"]["A"]
    assert (stats["pending"], stats["active"], stats["limit"]) == (3, 2, 2)
    assert_invariants(queue)


def test_acking_a_limited_job_returns_the_group_to_the_ring_with_a_wake(app, queue):
    # Given A at its limit of 2 with a backlog, and no wake tokens left over
    fill(app, "A", 4)
    app.set_group_limit("A", 2)
    leases = queue.claim(3)
    assert groups_of(leases) == ["A", "A"]
    assert ring(queue) == []
    drain_wake(queue)
    # When one of them is acknowledged
    assert queue.ack(leases[0])[0] is AckVerdict.DONE
    # Then A is back on the ring, a wake was pushed, and a parked master would wake
    assert ring(queue) == ["A"]
    assert wake_tokens(queue) == 1
    assert queue.park(0.5)  # a token was taken
    assert groups_of(queue.claim(2)) == ["A"]
    assert_invariants(queue)


def test_a_failure_of_a_limited_job_also_frees_its_slot(app, queue):
    fill(app, "A", 3)
    app.set_group_limit("A", 1)
    (lease,) = queue.claim(2)
    assert queue.claim() == []
    drain_wake(queue)
    assert queue.retry(lease, "boom") == 1
    assert ring(queue) == ["A"] and wake_tokens(queue) == 1
    assert_invariants(queue)


def test_clearing_a_limit_makes_the_group_serviceable_again(app, queue):
    fill(app, "A", 5)
    app.set_group_limit("A", 2)
    assert len(queue.claim(5)) == 2
    drain_wake(queue)
    # When the limit is cleared
    app.set_group_limit("A", None)
    # Then A is back on the ring with a wake, and all of its backlog can be claimed
    assert ring(queue) == ["A"] and wake_tokens(queue) == 1
    assert queue.client.hget(queue.keys.glimit, "A") is None
    assert app.stats()["groups"]["A"]["limit"] is None
    assert groups_of(queue.claim(5)) == ["A"] * 3
    assert_invariants(queue)


def test_lowering_a_limit_below_the_jobs_in_flight_takes_the_group_off_the_ring(app, queue):
    fill(app, "A", 6)
    leases = queue.claim(3)
    app.set_group_limit("A", 1)
    assert ring(queue) == []
    # Two acks still leave A at its limit; the third frees it
    queue.ack(leases[0])
    queue.ack(leases[1])
    assert ring(queue) == []
    queue.ack(leases[2])
    assert ring(queue) == ["A"]
    assert_invariants(queue)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_limits_and_weights_below_one_are_refused(app, queue, bad):
    with pytest.raises(InvalidArgument):
        app.set_group_limit("A", bad)
    with pytest.raises(InvalidArgument):
        app.set_group_weight("A", bad)
    assert not queue.client.exists(queue.keys.glimit, queue.keys.gweight)


def test_admin_verbs_refuse_an_empty_group(app):
    for verb in (lambda: app.set_group_limit("", 2), lambda: app.set_group_weight("", 2),
                 lambda: app.pause_group(""), lambda: app.resume_group("")):
        with pytest.raises(InvalidGroup):
            verb()


# -- pause and resume: the queue, one lane -----------------------------------------------

def test_a_queue_wide_pause_stops_claims_and_resume_wakes(app, queue):
    # Given work in two lanes and a paused queue
    fill(app, "A", 2)
    fill(app, "B", 2)
    app.pause()
    assert app.stats()["paused"] is True
    # When workers claim, or ack and ask for the next
    leases_while_paused = queue.claim(4)
    # Then nothing is handed out
    assert leases_while_paused == []
    # And on resume a wake is pushed and claims work again
    drain_wake(queue)
    app.resume()
    assert app.stats()["paused"] is False
    assert wake_tokens(queue) == 1
    leases = queue.claim(4)
    assert sorted(groups_of(leases)) == ["A", "A", "B", "B"]
    assert_invariants(queue)


def test_a_paused_queue_still_accepts_acks_but_hands_out_no_next_job(app, queue):
    fill(app, "A", 3)
    lease = queue.claim()[0]
    app.pause()
    done, nxt = queue.ack(lease, claim_next=True)
    assert done is AckVerdict.DONE and nxt is None
    assert queue.status(lease.id) == "done"


def test_a_paused_lane_keeps_its_backlog_and_its_job_in_flight(app, queue):
    # Given A with 4 pending, one of them in flight, and B with 3
    fill(app, "A", 4)
    fill(app, "B", 3)
    in_flight = queue.claim()[0]
    assert in_flight.group == "A"
    # When lane A is paused
    assert app.pause_group("A") is True
    assert app.pause_group("A") is False  # already so
    # Then stats show its backlog and its job in flight, and claims serve only B
    a = app.stats()["groups"]["A"]
    assert (a["paused"], a["pending"], a["active"]) == (True, 3, 1)
    assert groups_of(queue.claim(10)) == ["B"] * 3
    assert queue.claim() == []
    # And finishing its in-flight job does not bring the paused lane back
    assert queue.ack(in_flight)[0] is AckVerdict.DONE
    assert ring(queue) == [] and queue.claim() == []
    assert_invariants(queue)


def test_resuming_a_lane_makes_it_serviceable_and_wakes(app, queue):
    fill(app, "A", 2)
    app.pause_group("A")
    assert ring(queue) == []
    drain_wake(queue)
    assert app.resume_group("A") is True
    assert app.resume_group("A") is False
    assert ring(queue) == ["A"] and wake_tokens(queue) == 1
    assert app.stats()["groups"]["A"]["paused"] is False
    assert groups_of(queue.claim(5)) == ["A", "A"]
    assert_invariants(queue)


def test_work_arriving_in_a_paused_lane_waits_for_resume(app, queue):
    app.pause_group("A")
    fill(app, "A", 2)
    assert ring(queue) == [] and queue.claim() == []
    app.resume_group("A")
    assert len(queue.claim(5)) == 2


# -- weights and stats -------------------------------------------------------------------

def test_stats_report_weights_and_pending_per_group(app, queue):
    flood(app, "A", 5)
    app.set_group_weight("A", 4)
    stats = app.stats()
    assert stats["groups"]["A"]["weight"] == 4
    assert stats["groups"]["A"]["pending"] == 5
    assert stats["pending"] == 5 and stats["ring"] == 1


# -- cancel ------------------------------------------------------------------------------

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


# -- requeue of dead jobs ----------------------------------------------------------------

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


# -- purge -------------------------------------------------------------------------------

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


# -- wake tokens -------------------------------------------------------------------------

def test_wake_tokens_stay_bounded(app, queue):
    # Given many lanes becoming serviceable, each pushing a wake
    make_task(app, group=lambda g, *_: g).map([(f"g{i}",) for i in range(100)])
    # Then the wake list stays short
    assert 1 <= queue.client.llen(queue.keys.wake) <= 16
    for _ in range(40):
        queue.push_wake()
    assert queue.client.llen(queue.keys.wake) <= 16
