"""Faults on the connection: a lost reply to a claim, an ack or a wake; CLIENT KILL around claims
and under a running worker; the master's blocked connection killed."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import fault_tasks as ft
import fault_tasks_more as fm
import pytest
import redis
from faults import (
    Rec,
    Relay,
    assert_clean,
    enqueue,
    log,
    preload_scripts,
    quiet,
    reaped_then_completed,
    start_more_worker,
    start_worker,
    verb_marker,
    wait_until,
)
from helpers import new_job
from redis.backoff import NoBackoff
from redis.retry import Retry as RedisRetry

from emqtasks import App
from emqtasks._dev.localserver import LocalRedis
from emqtasks.observe.lanes import stats as queue_stats
from emqtasks.store.queue import Lease, Queue
from emqtasks.verdicts import AckVerdict, RetryVerdict
from emqtasks.worker.resilience import REFUSALS, TRANSIENT, Outage, Refused

STALE = RetryVerdict.STALE


# -- killed connections around a claim ---------------------------------------------------

@pytest.mark.timeout(60)
def test_a_lost_claim_reply_leaves_the_job_leased_and_the_reaper_returns_it(
        private_redis: LocalRedis, queue_name: str) -> None:
    admin = private_redis.client()
    preload_scripts(admin)
    relay = Relay(private_redis.port)
    try:
        client = redis.Redis(port=relay.port, decode_responses=True)
        q = Queue(client, queue_name)
        direct = Queue(admin, queue_name)
        q.enqueue_many([new_job("lost-claim", group="g", lease_ms=300)])
        # The claim is applied, then the connection drops before its reply arrives
        relay.arm(verb_marker(q, "claim"))
        got = Outage(log, "test").call(q.claim, 1)
        assert relay.dropped.is_set()
        assert got == []   # the retried claim found nothing: the job was leased by the first
        # Never lost: the job is leased (to nobody that knows it), fenced and counted
        row = admin.hgetall(direct.keys.job("lost-claim"))
        assert row["state"] == "active" and row["attempts"] == "1"
        assert admin.zscore(direct.keys.active, "lost-claim") is not None
        assert_clean(direct)
        # The lease runs out and the reaper returns it; it then runs to completion
        reaped_then_completed(direct, "lost-claim")
    finally:
        relay.close()


@pytest.mark.timeout(60)
def test_client_kill_around_claims_never_loses_a_job(private_redis: LocalRedis,
                                                     queue_name: str) -> None:
    admin = private_redis.client()
    preload_scripts(admin)
    q_admin = Queue(admin, queue_name)
    n = 150
    q_admin.enqueue_many([new_job(f"ck-{i}", group=f"g{i % 5}", lease_ms=400)
                          for i in range(n)])
    # The claimant gives up at once on a dropped connection, so every kill is seen
    claimant = redis.Redis(port=private_redis.port, decode_responses=True,
                           client_name="claimant", retry=RedisRetry(NoBackoff(), 0))
    q = Queue(claimant, queue_name)
    sent = threading.Event()
    stop = threading.Event()
    kills = {"type": 0, "id": 0}

    def killer() -> None:
        killer_client = private_redis.client()
        rnd = random.Random(7)
        while not stop.is_set():
            if not sent.wait(0.05):
                continue
            sent.clear()
            time.sleep(rnd.random() * 0.0005)
            if rnd.random() < 0.5:
                killer_client.execute_command("CLIENT", "KILL", "TYPE", "normal",
                                              "SKIPME", "yes")
                kills["type"] += 1
            else:
                for c in killer_client.client_list():
                    if c.get("name") == "claimant":
                        killer_client.execute_command("CLIENT", "KILL", "ID", c["id"])
                        kills["id"] += 1

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    held: list[Lease] = []
    errors = 0
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline:
            sent.set()
            try:
                got = q.claim(1)
            except TRANSIENT:
                errors += 1
                continue
            if not got and not queue_stats(q_admin)["pending"]:
                break
            held.extend(got)
    finally:
        stop.set()
        thread.join(5)
    c, k = admin, q_admin.keys
    active = set(c.zrange(k.active, 0, -1))
    pending = {i for g in range(5) for i in c.zrange(k.lane(f"g{g}"), 0, -1)}
    ids = {f"ck-{i}" for i in range(n)}
    # Every job is leased or still pending, never lost; what we hold is leased
    assert active | pending == ids and not active & pending
    assert {lease.id for lease in held} <= active
    assert_clean(q_admin)
    orphans = active - {lease.id for lease in held}
    print(f"{errors} dropped claims ({kills}), {len(orphans)} leased with the reply lost")
    # Finish what we hold; the orphans come back through the reaper after their lease
    for lease in held:
        assert q_admin.ack(lease, "null") == (True, None)
    time.sleep(0.5)
    assert q_admin.reap() == (len(orphans), 0)
    done = len(held)
    while leases := q_admin.claim(10):
        for lease in leases:
            assert q_admin.ack(lease, "null") == (True, None)
            done += 1
    assert done == n
    assert_clean(q_admin)


@pytest.mark.timeout(60)
def test_a_worker_survives_connection_kills_and_finishes_every_job(
        private_redis: LocalRedis, queue_name: str) -> None:
    app = App(redis_url=private_redis.url, queue=queue_name)
    q = app.queue()
    r = Rec(private_redis.client(), queue_name)
    stop = threading.Event()

    def killer() -> None:
        c = private_redis.client()
        while not stop.wait(0.15):
            c.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")

    try:
        with start_worker(app.settings.redis_url, queue_name, concurrency=2) as w:
            thread = threading.Thread(target=killer, daemon=True)
            thread.start()
            tags = [f"g{i % 4}:{i}" for i in range(600)]
            for i in range(0, len(tags), 50):
                Outage(log, "test").call(enqueue, app, ft.count, [(t,) for t in tags[i:i + 50]])
                time.sleep(0.1)
            wait_until(lambda: len(r.all_runs()) == len(tags), 30, "every job run", w)
            stop.set()
            thread.join(5)
            wait_until(lambda: quiet(q), 20, "a quiet queue", w)
            assert w.proc.poll() is None
            runs = r.all_runs()
            print(f"{sum(v > 1 for v in runs.values())} jobs ran twice (at-least-once)")
            assert_clean(q)
            w.stop()
    finally:
        stop.set()
        app.close()


@pytest.mark.timeout(60)
def test_a_lost_wake_reply_does_not_strand_work(private_redis: LocalRedis,
                                                queue_name: str) -> None:
    # Given an idle worker that reaches Redis through a relay
    relay = Relay(private_redis.port)
    app = App(redis_url=private_redis.url, queue=queue_name)
    r = Rec(private_redis.client(), queue_name)
    try:
        with start_worker(relay.url, queue_name, concurrency=2, tick=0.2) as w:
            assert app.send_task(ft.count, ("warm:0",)).get(timeout=10) == "warm:0"
            # When the master's next BLPOP pops the wake token of a new job but its reply
            # is lost with the connection
            relay.arm(b"BLPOP")
            wait_until(relay.victim.is_set, 5, "the master to park again")
            h = app.send_task(ft.count, ("lost:1",))
            wait_until(relay.dropped.is_set, 5, "the wake reply to be dropped")
            # Then the job still runs: the token was a hint, the work is still in its lane
            assert h.get(timeout=10) == "lost:1"
            assert r.runs("lost:1") == 1
            w.stop()
        assert_clean(app.queue())
    finally:
        relay.close()
        app.close()


# -- the connection drops after an ack was applied ---------------------------------------

@pytest.mark.timeout(60)
def test_a_retried_ack_after_a_lost_reply_is_done_again_and_schedules_nothing(
        private_redis: LocalRedis, queue_name: str) -> None:
    admin = private_redis.client()
    preload_scripts(admin)
    relay = Relay(private_redis.port)
    try:
        q = Queue(redis.Redis(port=relay.port, decode_responses=True), queue_name)
        direct = Queue(admin, queue_name)
        k = direct.keys
        q.enqueue_many([new_job("ack-1", group="g", lease_ms=300, delay_ms=0),
                        new_job("ack-2", group="g", lease_ms=300, delay_ms=0)])
        (lease,) = q.claim()
        # The ack is applied (and claims the next job), then the reply is lost; the child's
        # way of calling (Outage, over redis-py's own retry) sends it again
        relay.arm(verb_marker(q, "ack"))
        acked, nxt = Outage(log, "test").call(q.ack, lease, '"ok"', True)
        assert relay.dropped.is_set()
        # the same holder's ack again: answered done (the first one was applied), nothing
        # more written, nothing more claimed
        assert (acked, nxt) == (AckVerdict.DONE, None)
        row = admin.hgetall(k.job("ack-1"))
        assert row["state"] == "done" and row["result"] == '"ok"' and row["attempts"] == "1"
        assert admin.zcard(k.delayed) == 0 and admin.zcard(k.dead) == 0
        assert admin.zscore(k.active, "ack-1") is None
        # a stale ack is all a worker does with it: its retry verb would be refused too
        assert q.retry(lease, "should not happen") == STALE
        assert admin.zcard(k.delayed) == 0 and admin.hget(k.job("ack-1"), "state") == "done"
        # The next job the lost reply carried is leased to nobody: the reaper returns it
        assert admin.hget(k.job("ack-2"), "state") == "active"
        assert_clean(direct)
        reaped_then_completed(direct, "ack-2")
    finally:
        relay.close()


# -- the master's blocking connection killed ---------------------------------------------

def _parked(admin: Any) -> list[dict[str, Any]]:
    return [c for c in admin.client_list() if c.get("cmd") == "blpop"]


def _park(admin: Any) -> dict[str, Any] | None:
    """The master's park: the one BLPOP blocked for 2 s or more. An abort listener's pop
    (while a job runs) lasts 1 s at most, so it is never taken for the park."""
    long = [c for c in _parked(admin) if int(c.get("idle", 0)) >= 2]
    return long[0] if len(long) == 1 else None


@pytest.mark.timeout(60)
def test_killing_the_masters_blocked_connection_strands_no_job(private_redis: LocalRedis,
                                                               queue_name: str) -> None:
    app = App(redis_url=private_redis.url, queue=queue_name)
    admin = private_redis.client()
    r = Rec(admin, queue_name)
    try:
        # A long tick: a job that waited for it would take up to 5 s
        with start_more_worker(private_redis.url, queue_name, concurrency=2, tick=5.0) as w:
            assert app.send_task(fm.quick, ("warm:0",)).get(timeout=10) == "warm:0"
            for n in range(3):
                # Given the master parked in BLPOP
                wait_until(lambda: _park(admin) is not None, 10, "the master to park", w)
                parked = _park(admin)
                assert parked is not None
                # When its connection is killed, and a job is enqueued right after
                admin.client_kill_filter(_id=parked["id"])
                t0 = time.monotonic()
                app.send_task(fm.quick, (f"k{n}:1",))
                # Then the job runs at once, without waiting for the tick or another enqueue
                wait_until(lambda n=n: r.runs(f"k{n}:1") == 1, 5, "the job to run", w)
                took = time.monotonic() - t0
                assert took < 2.0, took
                # and the master parks again on a new connection
                wait_until(lambda p=parked["id"]: (_park(admin) or {"id": p})["id"] != p, 10,
                           "a new parked connection", w)
            assert w.proc.poll() is None and w.stop() == 0
        assert_clean(app.queue())
    finally:
        app.close()


# -- a demoted primary (Sentinel) --------------------------------------------------------

@pytest.mark.timeout(30)
def test_a_demoted_primarys_readonly_is_an_outage_not_a_refusal(
        private_redis: LocalRedis) -> None:
    """redis-py's Sentinel connection answers a READONLY from the primary it knew (demoted
    by a failover) with ConnectionError("The previous master is now a slave") while that
    server still answers a PING: the call is retried until the failover is over, never
    Refused (a worker child once exited on it in the Sentinel soak)."""
    admin = private_redis.client()
    cuts = []

    def write() -> str:
        if len(cuts) < REFUSALS + 3:      # more cuts than a refusal takes
            cuts.append(1)
            raise redis.ConnectionError("The previous master is now a slave")
        return "written"

    assert Outage(log, "test", probe=admin.ping).call(write) == "written"
    assert len(cuts) == REFUSALS + 3
    # while the same cuts of another kind, the PING answering, are a refusal
    cuts.clear()

    def refused() -> str:
        cuts.append(1)
        raise redis.ConnectionError("Connection closed by server.")

    with pytest.raises(Refused):
        Outage(log, "test", probe=admin.ping).call(refused)
