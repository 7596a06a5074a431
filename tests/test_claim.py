"""Claim: the ring's turns (one per backlogged group, or `weight` in a row), batched claims,
oldest first, ghosts skipped, the lease deadline as the active score, and 10,000 groups."""

from __future__ import annotations

from collections import Counter

import pytest
from helpers import assert_invariants, flood, make_task, ring, server_ms


def lane_task(app, name="tests.fair"):
    """A task whose first argument names its lane."""
    return make_task(app, name=name, group=lambda g, *_, **__: g)


# -- turns of the ring -------------------------------------------------------------------

@pytest.mark.timeout(30)
def test_a_flooded_lane_does_not_lock_out_the_others(app, queue):
    # Given lane A holding 10,000 pending jobs, then B and C a few each
    flood(app, "A", 10_000)
    t = lane_task(app)
    t.map([("B", i) for i in range(3)])
    t.map([("C", i) for i in range(3)])
    # When workers claim one job at a time
    served = [queue.claim()[0].group for _ in range(9)]
    # Then A, B and C are served in turn, and B's first job comes within 3 claims
    assert served == ["A", "B", "C"] * 3
    assert served.index("B") < 3
    # And once B and C are drained, A has the ring to itself
    assert [queue.claim()[0].group for _ in range(3)] == ["A"] * 3
    assert ring(queue) == ["A"]
    assert_invariants(queue)


def test_a_batched_claim_takes_one_turn_of_the_ring_per_job(app, queue):
    # Given A with a long backlog and B, C with two jobs each
    flood(app, "A", 500)
    t = lane_task(app)
    t.map([("B", 1), ("B", 2)])
    t.map([("C", 1), ("C", 2)])
    # When one call claims 7 jobs
    leases = queue.claim(7)
    # Then the batch was served as seven single claims would be: fair within the batch
    assert [l.group for l in leases] == ["A", "B", "C", "A", "B", "C", "A"]
    assert len({l.id for l in leases}) == 7
    assert len({l.nonce for l in leases}) == 7
    assert queue.client.zcard(queue.keys.active) == 7
    assert_invariants(queue)


def test_a_batched_claim_stops_when_nothing_is_left(app, queue):
    lane_task(app).map([("B", 1), ("C", 1)])
    leases = queue.claim(10)
    assert sorted(l.group for l in leases) == ["B", "C"]
    assert queue.claim(10) == []
    assert ring(queue) == []


def test_jobs_of_one_lane_come_out_oldest_first(app, queue):
    t = lane_task(app)
    ids = [h.id for h in t.map([("A", i) for i in range(20)])]
    got = [l.id for l in queue.claim(20)]
    assert got == ids


# -- weights: `weight` turns in a row ----------------------------------------------------

@pytest.mark.timeout(30)
def test_a_weighted_group_gets_its_weight_of_turns(app, queue):
    # Given A with weight 3, and A and B each with 4,000+ pending
    flood(app, "A", 4_100)
    flood(app, "B", 4_100)
    app.set_group_weight("A", 3)
    # When 4,000 jobs are claimed (in batches: each batch is that many turns)
    served = Counter()
    for _ in range(40):
        leases = queue.claim(100)
        assert len(leases) == 100
        served.update(l.group for l in leases)
    # Then A got three claims for each one of B's
    share = served["A"] / 4_000
    assert abs(share - 0.75) <= 0.05, served
    assert_invariants(queue)


def test_weighted_turns_are_consecutive_and_the_weight_can_be_reset(app, queue):
    flood(app, "A", 50)
    flood(app, "B", 50)
    app.set_group_weight("A", 3)
    assert [l.group for l in queue.claim(8)] == ["A", "A", "A", "B"] * 2
    # Back to weight 1: plain alternation (stored as absent)
    app.set_group_weight("A", 1)
    assert queue.client.hget(queue.keys.gweight, "A") is None
    got = [l.group for l in queue.claim(6)]
    assert Counter(got) == Counter({"A": 3, "B": 3})
    assert all(a != b for a, b in zip(got, got[1:]))


# -- the lease a claim takes -------------------------------------------------------------

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


# -- ghosts: lane entries whose row is gone ----------------------------------------------

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


# -- 10,000 groups -----------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_ten_thousand_groups_the_ring_holds_exactly_the_serviceable_ones(app, queue):
    # Given 10,000 groups with one job each, enqueued in one batch
    t = lane_task(app)
    handles = t.map([(f"g{i:05d}", i) for i in range(10_000)])
    assert not any(h.duplicate for h in handles)
    # Then every group is on the ring once
    assert app.stats()["ring"] == 10_000
    assert len(set(ring(queue))) == 10_000
    # When some are paused, some limited to what they have in flight, some drained
    for i in range(0, 100):
        app.pause_group(f"g{i:05d}")
    for i in range(100, 150):
        t.delay(f"g{i:05d}", "second")  # a backlog of two
        app.set_group_limit(f"g{i:05d}", 1)
    leases = queue.claim(500)  # the ring's head: g00100 ... g00599
    assert len(leases) == 500
    # Then the ring holds exactly the serviceable groups: 10,000 - 100 paused -
    # 50 at their limit (with a backlog left) - 450 drained
    assert app.stats()["ring"] == 10_000 - 100 - 500
    assert_invariants(queue)
    # And resuming and acking puts them back, each exactly once
    for i in range(0, 100):
        app.resume_group(f"g{i:05d}")
    for lease in leases[:50]:
        assert queue.ack(lease)[0]
    assert app.stats()["ring"] == 10_000 - 450
    assert_invariants(queue)
