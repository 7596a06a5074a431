"""History in the server: the verbs' per-minute counters, read back by App.history()."""

from __future__ import annotations

import pytest
from helpers import expire_now, make_task, server_ms

from emqtasks import App
from emqtasks.errors import InvalidArgument
from emqtasks.observe.history import BUCKETS_MS, quantile
from emqtasks.store.queue import Queue

pytestmark = pytest.mark.timeout(60)


def _drain(queue: Queue, fail: set[str] = frozenset(), final: bool = False) -> int:
    n = 0
    while True:
        leases = queue.claim()
        if not leases:
            return n
        (lease,) = leases
        n += 1
        if lease.group in fail:
            queue.retry(lease, "boom", 0, final)
        else:
            queue.ack(lease)


def test_a_drained_queue_counts_the_jobs_by_outcome_task_and_group(app: App,
                                                                   queue: Queue) -> None:
    # Given jobs of two tasks in three groups
    a = make_task(app, name="t.a", group=lambda g, *_: g)
    b = make_task(app, name="t.b", group=lambda g, *_: g, max_attempts=1)
    a.map([("acme", i) for i in range(5)] + [("globex", i) for i in range(3)])
    b.map([("flaky", i) for i in range(4)])
    # When the queue is drained; flaky's jobs fail once and, out of attempts, die
    ran = _drain(queue, fail={"flaky"})
    assert ran == 12
    h = app.history(minutes=5)
    # Then the counters equal the jobs run, by outcome, task and group
    assert h["total"]["enqueued"] == 12 and h["total"]["started"] == 12
    assert (h["total"]["succeeded"], h["total"]["retried"], h["total"]["dead"]) == (8, 0, 4)
    assert h["tasks"]["t.a"]["succeeded"] == 8 and h["tasks"]["t.a"]["started"] == 8
    assert h["tasks"]["t.a"]["enqueued"] == 0     # enqueues are counted per group only
    assert h["tasks"]["t.b"]["dead"] == 4 and h["tasks"]["t.b"]["succeeded"] == 0
    g = h["groups"]
    assert (g["acme"]["enqueued"], g["acme"]["started"], g["acme"]["succeeded"]) == (5, 5, 5)
    assert (g["globex"]["started"], g["flaky"]["dead"]) == (3, 4)
    # And the histograms count every start and every end that ran
    assert sum(h["total"]["wait_buckets"]) == 12 and sum(h["total"]["run_buckets"]) == 8
    assert sum(m["started"] for m in h["minutes"]) == 12
    assert len(h["minutes"]) == 5 and h["retention_hours"] == 24


def test_retries_reaps_and_waits_are_counted(app: App, queue: Queue) -> None:
    t = make_task(app, name="t.r", group="g", max_attempts=3, retry_delay=0)
    t.delay(1)
    (lease,) = queue.claim()
    queue.retry(lease, "again", 0)          # retried: into delayed, due now
    queue.promote()
    (lease,) = queue.claim()
    expire_now(queue, lease.id)
    queue.reap()                             # the reaper takes it back: retried, no run time
    (lease,) = queue.claim()
    queue.ack(lease)
    h = app.history(minutes=2)
    tot = h["total"]
    assert (tot["enqueued"], tot["started"], tot["retried"], tot["succeeded"]) == (1, 3, 2, 1)
    assert sum(tot["run_buckets"]) == 1      # the run time histogram is the successes
    assert h["groups"]["g"]["retried"] == 2


def test_the_wait_time_is_start_less_due(app: App, queue: Queue) -> None:
    # Given a job that became due 40 s ago (its lane score moved into the past)
    t = make_task(app, name="t.w", group="w")
    h = t.delay(1)
    queue.client.zadd(queue.keys.lane("w"), {h.id: server_ms(queue) - 40_000}, xx=True)
    (lease,) = queue.claim()
    queue.ack(lease)
    tot = app.history(minutes=1)["total"]
    # Then it waited ~40 s: in the (30 s, 60 s] bucket
    assert 40_000 <= tot["wait_ms_sum"] < 45_000
    assert tot["wait_buckets"][BUCKETS_MS.index(60000)] == 1
    assert 30_000 <= quantile(tot["wait_buckets"], 0.5) <= 60_000


def test_history_off_counts_nothing_and_retention_sets_the_expiry(app: App,
                                                                  queue: Queue) -> None:
    t = make_task(app, name="t.x", group="x")
    app.set_history(0)
    t.delay(1)
    _drain(queue)
    assert not list(queue.scan(queue.keys.base + "h:*"))
    assert app.history(minutes=1)["total"]["enqueued"] == 0
    app.set_history(2)
    t.delay(2)
    (key,) = queue.scan(queue.keys.base + "h:*")
    assert 2 * 3600 < queue.client.ttl(key) <= 2 * 3600 + 60
    assert app.history(minutes=1)["retention_hours"] == 2
    with pytest.raises(InvalidArgument):
        app.set_history(-1)
    with pytest.raises(InvalidArgument):
        app.set_history(24 * 365)


def test_a_tenant_flood_past_the_cap_is_counted_together(app: App, queue: Queue) -> None:
    # Given a cap of 3 groups a minute, When 10 groups enqueue and run
    app.set_history(24, max_groups=3)
    t = make_task(app, name="t.f", group=lambda g, *_: g)
    t.map([(f"tenant{i}", 0) for i in range(10)])
    _drain(queue)
    h = app.history(minutes=2)
    # Then 3 groups are tracked one by one and the other 7 counted together; tasks see all
    assert len(h["groups"]) == 3
    other = h["other_groups"]
    assert (other["enqueued"], other["started"], other["succeeded"]) == (7, 7, 7)
    assert h["total"]["succeeded"] == 10
    (key,) = queue.scan(queue.keys.base + "h:*")
    assert queue.client.hlen(key) < 20            # bounded, whatever the number of groups
