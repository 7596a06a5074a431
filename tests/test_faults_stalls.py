"""Stalls: a claim whose reply never came (a partition past the socket timeout), a job whose
lease ran out under it (a stale ack), a master frozen while its children run, a primary
demoted under a parked worker.

Real processes against a real redis-server; lost replies go through the TCP relay of
faults.py (the command is applied, its reply thrown away); every test is bounded in time.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis
import stall_tasks as st
from faults import (
    Rec,
    Relay,
    assert_clean,
    log,
    preload_scripts,
    start_worker,
    verb_marker,
    wait_until,
)
from helpers import expire_now, new_job

from emqtasks import App
from emqtasks._dev.localserver import LocalRedis
from emqtasks.observe.lanes import stats as queue_stats
from emqtasks.store.queue import Queue
from emqtasks.verdicts import AckVerdict
from emqtasks.worker.resilience import Outage

# -- 8. an abandoned claim spends no attempt ---------------------------------------------


@pytest.mark.timeout(60)
def test_an_abandoned_claim_spends_no_attempt_and_never_dies_unrun(
        private_redis: LocalRedis, queue_name: str) -> None:
    # Given jobs of one attempt each, and a child whose ack-and-claim-next is applied but
    # whose reply never comes (the partition outlasted its socket timeout)
    admin = private_redis.client()
    preload_scripts(admin)
    relay = Relay(private_redis.port)
    try:
        q = Queue(redis.Redis(port=relay.port, decode_responses=True), queue_name)
        direct = Queue(admin, queue_name)
        k = direct.keys
        q.enqueue_many([new_job(f"one-{i}", group="g", max_attempts=1, lease_ms=200)
                        for i in range(3)])
        (lease,) = q.claim()
        relay.arm(verb_marker(q, "ack"))
        # When the child sends it again (its Outage), the ack is answered done (the first
        # was applied: the row is done with this holder's token) and the next claim leases
        # the job after; the job the lost reply carried is leased to nobody
        acked, nxt = Outage(log, "test").call(q.ack, lease, '"ok"', True)
        assert relay.dropped.is_set() and acked == AckVerdict.DONE and nxt is not None
        abandoned = ({"one-1", "one-2"} - {nxt.id}).pop()
        assert admin.hget(k.job(abandoned), "state") == "active"
        # Then its lease runs out: the reaper gives the claim back, not an attempt
        expire_now(direct, abandoned)
        assert direct.reap() == (1, 0)
        row = admin.hgetall(k.job(abandoned))
        assert row["state"] == "pending" and row["attempts"] == "0", row
        assert row["fence"] == "1"           # the fence never goes back
        # and the job runs once, to its end, on its one attempt
        assert direct.ack(nxt, '"ok"') == (AckVerdict.DONE, None)
        (again,) = direct.claim()
        assert (again.id, again.attempts, again.fence) == (abandoned, 1, 2)
        assert direct.ack(again, '"ok"') == (AckVerdict.DONE, None)
        assert admin.zcard(k.dead) == 0
        # the ack sent again is not a stale one (none is counted)
        assert queue_stats(direct)["stale_acks"] == 0
        assert_clean(direct)
    finally:
        relay.close()


@pytest.mark.timeout(60)
def test_a_job_seen_running_spends_its_attempt_when_its_whole_worker_vanishes(
        app: App) -> None:
    # Given a one-attempt job running in a real worker, whose master has seen it start
    q = app.queue()
    r = Rec(app.client, q.name)
    with start_worker(app.settings.redis_url, q.name, module="stall_tasks") as w:
        h = app.send_task(st.hold, ("vanish", 30.0))
        w.wait_for(lambda: r.starts("vanish") == 1, what="the job's start")
        row = q.keys.job(h.id)
        w.wait_for(lambda: app.client.hget(row, "ran") == app.client.hget(row, "nonce"),
                   what="the master to note the start")
        # When the whole worker vanishes (master and children at once)
        os.killpg(w.pid, signal.SIGKILL)
        w.proc.wait(5)
    # Then its expired lease spent the attempt: a job that ran is not run for free again
    expire_now(q, h.id)
    assert q.reap() == (0, 1)
    assert app.job(h.id)["state"] == "dead" and app.job(h.id)["error"] == "lease expired"
    r.clear()


@pytest.mark.timeout(60)
def test_a_stale_ack_is_one_log_line_and_a_counter_in_stats(app: App) -> None:
    q = app.queue()
    r = Rec(app.client, q.name)
    with start_worker(app.settings.redis_url, q.name, concurrency=1,
                      module="stall_tasks") as w:
        h = app.send_task(st.lose_lease, ("lost",))
        assert h.get(timeout=20) == "lost"
        assert r.starts("lost") == 2 and r.runs("lost") == 2
        out = w.output()
        lines = [ln for ln in out.splitlines() if "stale" in ln]
        assert len(lines) == 1 and h.id in lines[0], out
        assert "Traceback" not in out
        assert w.stop() == 0
    assert queue_stats(q)["stale_acks"] == 1
    assert_clean(q)
    r.clear()


# -- 9. a frozen master ----------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_a_frozen_master_costs_at_most_one_duplicate_per_job_it_held(app: App) -> None:
    # Given a worker whose two children run jobs on short leases only its master renews,
    # and a live peer (its reaper takes expired leases back and runs what it gets)
    q = app.queue()
    r = Rec(app.client, q.name)
    tags = [f"fz{i}" for i in range(6)]
    with start_worker(app.settings.redis_url, q.name, module="stall_tasks",
                      whole_pool=True) as frozen:
        for t in tags:
            app.send_task(st.frozen, (t, 1.5))
        frozen.wait_for(lambda: sum(r.starts(t) for t in tags) == 2, what="two starts")
        held = [t for t in tags if r.starts(t) == 1]
        # When its master is stopped (SIGSTOP) for longer than the leases and the jobs
        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            with start_worker(app.settings.redis_url, q.name, module="stall_tasks",
                              concurrency=1) as peer:
                time.sleep(4.0)   # the freeze: frozen's children run on, nobody renews
                os.kill(frozen.pid, signal.SIGCONT)
                wait_until(lambda: all(r.runs(t) >= 1 for t in tags), 30, "every job", peer)
                wait_until(lambda: queue_stats(q)["active"] == 0, 10, "nothing in flight", peer)
                assert peer.stop() == 0
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        assert frozen.stop() == 0
    # Then only the jobs it held when it froze ran twice; every other job ran once
    starts = r.all_starts()
    assert all(starts[t] <= 2 for t in held), starts
    assert all(starts[t] == 1 for t in tags if t not in held), (held, starts)
    assert_clean(q)
    r.clear()


# -- 11. a primary demoted under a parked worker ---------------------------------------------


@pytest.mark.timeout(60)
def test_a_worker_on_a_demoted_primary_logs_one_line_and_rides_it_out(
        private_redis: LocalRedis, queue_name: str) -> None:
    app = App(redis_url=private_redis.url, queue=queue_name)
    admin = private_redis.client()
    r = Rec(admin, queue_name)
    try:
        with start_worker(private_redis.url, queue_name, module="stall_tasks") as w:
            wait_until(lambda: any(c.get("cmd") == "blpop" for c in admin.client_list()), 10,
                       "the master to park", w)
            # The primary becomes a replica (of a server that is not there: its data stays)
            admin.execute_command("REPLICAOF", "127.0.0.1", "1")
            wait_until(lambda: "Redis unavailable (park)" in w.output(), 10,
                       "the outage to be noticed", w)
            time.sleep(1.0)   # a few park retries against the replica
            admin.execute_command("REPLICAOF", "NO", "ONE")
            h = app.send_task(st.hold, ("after", 0.0))
            assert h.get(timeout=20) == "after"
            out = w.output()
            assert "Traceback" not in out and "park loop error" not in out, out
            assert out.count("Redis unavailable (park)") == 1, out
            assert w.stop() == 0
    finally:
        admin.execute_command("REPLICAOF", "NO", "ONE")
        r.clear()
        app.close()
