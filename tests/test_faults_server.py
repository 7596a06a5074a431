"""Fault injection: killed children, masters and connections, stale holders, flushed scripts,
a crashed Redis with and without persistence, and concurrent reapers.

Every test runs real processes against a real redis-server, is bounded in time, and ends
with the invariant checker clean. Tests that kill, restart, flush or CLIENT KILL the server
take a server of their own.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import fault_tasks as ft
import pytest
import redis
from helpers import expire_now, new_job
from redis.backoff import NoBackoff
from redis.retry import Retry as RedisRetry
from workerproc import WorkerProc

from emqtasks import App
from emqtasks._dev.localserver import LocalRedis
from emqtasks.check import check, repair
from emqtasks.queue import Lease, Queue
from emqtasks.scripts import VERBS, source
from emqtasks.task import Task, build_job
from emqtasks.verdicts import ReleaseVerdict, RetryVerdict
from emqtasks.worker.resilience import TRANSIENT, Outage

STALE = RetryVerdict.STALE

log = logging.getLogger("test_faults")


# -- helpers ------------------------------------------------------------------------------

def assert_clean(queue: Queue) -> None:
    report = check(queue)
    assert report.ok, "invariants broken:\n" + "\n".join(report.violations)


class Rec:
    """What the fault tasks recorded for one queue (``t:<queue>:*``)."""

    def __init__(self, client: Any, queue: str) -> None:
        self.r = client
        self.prefix = f"t:{queue}:"

    def runs(self, tag: str) -> int:
        return int(self.r.hget(self.prefix + "runs", tag) or 0)

    def starts(self, tag: str) -> int:
        return int(self.r.hget(self.prefix + "starts", tag) or 0)

    def pid(self, tag: str) -> int:
        return int(self.r.hget(self.prefix + "pid", tag) or 0)

    def all_runs(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.r.hgetall(self.prefix + "runs").items()}

    def all_starts(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.r.hgetall(self.prefix + "starts").items()}

    def clear(self) -> None:
        for key in self.r.scan_iter(match=self.prefix + "*"):
            self.r.delete(key)


@pytest.fixture
def rec(app: App):  # type: ignore[no-untyped-def]
    recorder = Rec(app.client, app.settings.queue)
    yield recorder
    recorder.clear()


def reaped_then_completed(queue: Queue, job_id: str) -> None:
    """An orphaned lease (its holder never heard of it) expires, the reaper returns it, and
    its second attempt runs to completion; the queue is whole after each step."""
    time.sleep(0.4)   # the server clock must pass the short lease these tests use
    assert queue.reap() == (1, 0)
    (lease,) = queue.claim()
    assert (lease.id, lease.attempts) == (job_id, 2)
    assert queue.ack(lease, "null") == (True, None)
    assert_clean(queue)


def start_worker(url: str, queue: str, *extra: str, concurrency: int = 2,
                 tick: float = 0.1, module: str = "fault_tasks",
                 whole_pool: bool = False) -> WorkerProc:
    w = WorkerProc(url, queue, *extra, concurrency=concurrency, tick=tick, modules=(module,))
    try:
        w.wait_ready()
        if whole_pool:
            w.wait_for(lambda: len(w.children()) == concurrency, what="the whole pool")
    except BaseException:
        w.__exit__(None, None, None)
        raise
    return w


def enqueue(app: App, task: Task, calls: Iterable[Sequence[Any]], **opts: Any) -> list[str]:
    """Batch enqueue (one round trip, as Task.map) on the given app's queue; returns ids."""
    jobs = [build_job(task.spec, tuple(c), {}, limit=app.settings.max_payload_bytes, **opts)
            for c in calls]
    app.queue().enqueue_many(jobs)
    return [j.id for j in jobs]


def wait_until(predicate: Callable[[], object], timeout: float, what: str,
               worker: WorkerProc | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            tail = f"\nworker log:\n{worker.output()[-4000:]}" if worker else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{tail}")
        time.sleep(0.02)


def quiet(queue: Queue) -> bool:
    s = queue.stats()
    return s["pending"] == 0 and s["active"] == 0 and s["delayed"] == 0


def is_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def preload_scripts(client: Any) -> None:
    for name in VERBS:
        client.script_load(source(name))


class Relay:
    """A TCP relay in front of a Redis server that can lose one reply on purpose.

    ``arm(marker)``: the next request whose bytes contain ``marker`` is forwarded, the
    server's reply to it is read and thrown away, and both sides of that connection are
    closed: the command was applied, its caller sees a dropped connection.
    """

    def __init__(self, port: int) -> None:
        self.target = ("127.0.0.1", port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.marker: bytes | None = None
        self.victim = threading.Event()    # a matching request was sent on
        self.dropped = threading.Event()   # and its reply thrown away
        self.closed = False
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def arm(self, marker: bytes) -> None:
        with self.lock:
            self.marker = marker
            self.victim.clear()
            self.dropped.clear()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.socks += [client, upstream]
            state = {"drop": False}
            threading.Thread(target=self._up, args=(client, upstream, state),
                             daemon=True).start()
            threading.Thread(target=self._down, args=(client, upstream, state),
                             daemon=True).start()

    @staticmethod
    def _close(*socks: socket.socket) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _up(self, client: socket.socket, upstream: socket.socket, state: dict) -> None:
        try:
            while data := client.recv(65536):
                with self.lock:
                    if self.marker is not None and self.marker in data:
                        self.marker = None
                        state["drop"] = True
                        self.victim.set()
                upstream.sendall(data)
        except OSError:
            pass
        self._close(client, upstream)

    def _down(self, client: socket.socket, upstream: socket.socket, state: dict) -> None:
        try:
            while data := upstream.recv(65536):
                if state["drop"]:
                    self.dropped.set()
                    break
                client.sendall(data)
        except OSError:
            pass
        self._close(client, upstream)

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        with self.lock:
            self._close(*self.socks)


# -- 1. a child SIGKILLed mid-task --------------------------------------------------------

@pytest.mark.timeout(60)
def test_child_killed_mid_task_completes_exactly_once(app: App, rec: Rec) -> None:
    q = app.queue()
    with start_worker(app.settings.redis_url, q.name) as w:
        h = app.send_task(ft.sleepy, ("k1", 1.5))
        w.wait_for(lambda: rec.pid("k1"), what="job start")
        victim = rec.pid("k1")
        assert victim in w.children()
        os.kill(victim, signal.SIGKILL)
        assert h.get(timeout=20) == "k1"
        # exactly one completion, the kill counted as an attempt
        assert rec.runs("k1") == 1 and rec.starts("k1") == 2
        job = app.job(h.id)
        assert job["attempts"] == 2 and "WorkerLost" in (job["error"] or "")
        assert q.client.hget(q.keys.gactive, "sleepy") is None
        w.wait_for(lambda: len(w.children()) == 2 and victim not in w.children(),
                   what="replacement child")
        assert w.stop() == 0
    assert q.client.zcard(q.keys.active) == 0
    assert_clean(q)


# -- 2. the master SIGKILLed with children busy -------------------------------------------

@pytest.mark.timeout(60)
def test_master_killed_children_stop_and_a_new_master_finishes(app: App, rec: Rec) -> None:
    q = app.queue()
    tags = [f"m{i}" for i in range(5)]
    with start_worker(app.settings.redis_url, q.name) as w:
        handles = [app.send_task(ft.sleepy, (t, 2.0)) for t in tags]
        w.wait_for(lambda: sum(rec.starts(t) for t in tags) == 2, what="two jobs running")
        children = w.children()
        assert len(children) == 2
        w.kill()
    # the children die with their master (PR_SET_PDEATHSIG) ...
    wait_until(lambda: not any(is_alive(c) for c in children), 10, "children to die")
    # ... and claim nothing more: for longer than the jobs last, no start and no completion
    time.sleep(2.5)
    assert sum(rec.starts(t) for t in tags) == 2
    assert sum(rec.runs(t) for t in tags) == 0
    stats = q.stats()
    assert stats["pending"] == 3 and stats["active"] == 2
    # A new master reaps the orphaned leases and finishes every job, each once
    with start_worker(app.settings.redis_url, q.name) as w2:
        assert [h.get(timeout=30) for h in handles] == tags
        assert all(rec.runs(t) == 1 for t in tags), rec.all_runs()
        killed = [t for t in tags if rec.starts(t) == 2]
        assert len(killed) == 2, rec.all_starts()
        assert "reaped expired leases" in w2.output()
        assert w2.stop() == 0
    assert_clean(q)


# -- 3. SIGTERM during a long task ---------------------------------------------------------

@pytest.mark.timeout(60)
def test_sigterm_lets_a_long_task_finish_within_grace(app: App, rec: Rec) -> None:
    q = app.queue()
    with start_worker(app.settings.redis_url, q.name, "--grace", "10") as w:
        h = app.send_task(ft.sleepy, ("term", 1.5))
        w.wait_for(lambda: rec.starts("term") == 1, what="job start")
        t0 = time.monotonic()
        w.signal(signal.SIGTERM)
        assert w.proc.wait(20) == 0
        assert time.monotonic() - t0 < 10
    assert rec.runs("term") == 1 and h.status() == "done"
    assert app.job(h.id)["attempts"] == 1
    assert_clean(q)


@pytest.mark.timeout(60)
def test_sigterm_with_short_grace_releases_the_job_and_loses_nothing(app: App,
                                                                    rec: Rec) -> None:
    q = app.queue()
    with start_worker(app.settings.redis_url, q.name, "--grace", "0.3") as w:
        h = app.send_task(ft.sleepy, ("cut", 4.0))
        w.wait_for(lambda: rec.starts("cut") == 1, what="job start")
        w.signal(signal.SIGTERM)
        assert w.proc.wait(20) == 0
        assert "released back to its lane" in w.output()
    # released through the fence: pending again, the attempt rolled back, nothing lost
    assert rec.runs("cut") == 0
    assert h.status() == "pending" and app.job(h.id)["attempts"] == 0
    assert_clean(q)
    with start_worker(app.settings.redis_url, q.name) as w2:
        assert h.get(timeout=20) == "cut"
        w2.stop()
    assert rec.runs("cut") == 1 and rec.starts("cut") == 2
    assert app.job(h.id)["attempts"] == 1
    assert_clean(q)


# -- 4. a stale holder, on the queue API ----------------------------------------------------

def _snapshot(q: Queue, job_id: str) -> dict[str, Any]:
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
    before = _snapshot(q, stale.id)
    assert q.ack(stale, '"from A"') == (False, None)
    assert q.retry(stale, "A's error") == STALE
    assert q.retry(stale, "A's final error", delay=0, final=True) == STALE
    assert q.extend([stale]) == [False]
    assert q.extend([stale], lease_ms=600_000) == [False]
    assert q.release(stale, "A lets go") is ReleaseVerdict.STALE
    after = _snapshot(q, stale.id)
    assert after == before
    row = after["row"]
    assert "result" not in row and not (row.get("error") or "").startswith("A")


@pytest.mark.timeout(30)
def test_a_stale_holder_can_neither_ack_retry_nor_extend(app: App) -> None:
    q = app.queue()
    q.enqueue_many([new_job("stale-1", group="g", lease_ms=200, max_attempts=5)])
    (a,) = q.claim()
    # A's lease expires and is reaped; B claims the job with a new token
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


# -- 5. a task holding the GIL or blocking in C past its lease ------------------------------

@pytest.mark.timeout(60)
def test_a_task_holding_the_gil_past_its_lease_runs_once(app: App, rec: Rec) -> None:
    q = app.queue()
    with start_worker(app.settings.redis_url, q.name, tick=0.05) as w:
        # 3x the 0.5 s lease: a pure-Python loop, and usleep in C with the GIL held
        spin = app.send_task(ft.spin, ("spin", 1.5))
        block = app.send_task(ft.cblock, ("cblock", 1.5))
        spin.get(timeout=20)
        assert block.get(timeout=20) == "cblock"
        assert "reaped" not in w.output()
        w.stop()
    for tag, h in (("spin", spin), ("cblock", block)):
        assert rec.starts(tag) == 1 and rec.runs(tag) == 1, (tag, rec.all_starts())
        assert app.job(h.id)["attempts"] == 1
    assert_clean(q)


# -- 6. killed connections around a claim ---------------------------------------------------

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
        relay.arm(q.scripts.claim.sha.encode())
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
            if not got and not q_admin.stats()["pending"]:
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


# -- 7. the connection drops after an ack was applied ---------------------------------------

@pytest.mark.timeout(60)
def test_a_retried_ack_after_a_lost_reply_is_stale_and_schedules_nothing(
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
        relay.arm(q.scripts.ack.sha.encode())
        acked, nxt = Outage(log, "test").call(q.ack, lease, '"ok"', True)
        assert relay.dropped.is_set()
        assert (acked, nxt) == (False, None)    # stale: it was already done
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


# -- 8. SCRIPT FLUSH under a running worker ---------------------------------------------------

@pytest.mark.timeout(60)
def test_script_flush_under_a_running_worker_is_transparent(private_redis: LocalRedis,
                                                            queue_name: str) -> None:
    app = App(redis_url=private_redis.url, queue=queue_name)
    q = app.queue()
    admin = private_redis.client()
    r = Rec(admin, queue_name)
    stop = threading.Event()
    flushes = [0]

    def flusher() -> None:
        rnd = random.Random(8)
        while not stop.wait(0.02 + rnd.random() * 0.08):
            admin.script_flush()
            flushes[0] += 1

    try:
        with start_worker(app.settings.redis_url, queue_name) as w:
            thread = threading.Thread(target=flusher, daemon=True)
            thread.start()
            tags = [f"s{i % 3}:{i}" for i in range(300)]
            for i in range(0, len(tags), 20):
                enqueue(app, ft.count, [(t,) for t in tags[i:i + 20]])
                time.sleep(0.1)
            wait_until(lambda: len(r.all_runs()) == len(tags), 30, "every job run", w)
            stop.set()
            thread.join(5)
            wait_until(lambda: quiet(q), 10, "a quiet queue", w)
            assert all(v == 1 for v in r.all_runs().values())
            assert w.proc.poll() is None and w.stop() == 0
            out = w.log_path.read_text()
            assert "Traceback" not in out and "error" not in out.lower(), out[-3000:]
            assert flushes[0] >= 10
        assert_clean(q)
    finally:
        stop.set()
        app.close()


# -- 9 and 10. Redis SIGKILLed under load -----------------------------------------------------

def _load(app: App, tags: list[str], batch: int, pause: float, ok: list[str],
          failed: list[str], progress: threading.Event, at: int) -> None:
    """Enqueue in batches at a steady pace; a batch that raised is recorded as refused
    (it may or may not have been applied) and the producer moves on."""
    for i in range(0, len(tags), batch):
        chunk = tags[i:i + batch]
        try:
            enqueue(app, ft.count, [(t,) for t in chunk])
            ok.extend(chunk)
        except (redis.RedisError, OSError):
            failed.extend(chunk)
            time.sleep(0.1)
        if i + batch >= at:
            progress.set()
        time.sleep(pause)


def _commands(client: Any) -> int:
    stats = client.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_info",))


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.timeout(120)
def test_redis_crash_with_aof_always_under_load_loses_no_acknowledged_job(
        queue_name: str) -> None:
    with LocalRedis(persist=True) as srv:
        app = App(redis_url=srv.url, queue=queue_name)
        q = app.queue()
        tags = [f"g{i % 16}:{i}" for i in range(10_000)]
        ok: list[str] = []
        failed: list[str] = []
        halfway = threading.Event()
        try:
            with start_worker(srv.url, queue_name, concurrency=4, tick=0.1) as w:
                loader = threading.Thread(target=_load, args=(app, tags, 100, 0.03, ok, failed,
                                                              halfway, 3000), daemon=True)
                loader.start()
                assert halfway.wait(30)
                # A consumer that will never come back holds a few leases across the crash
                zombie = q.claim(5)
                assert len(zombie) == 5
                srv.kill()              # SIGKILL: a crash, no shutdown save
                time.sleep(1.5)         # longer than the 1 s leases
                srv.start()             # same port, same AOF directory
                loader.join(60)
                assert not loader.is_alive()
                r = Rec(srv.client(), queue_name)
                wait_until(lambda: set(ok) <= set(r.all_runs()), 60,
                           "every acknowledged job to complete", w)
                wait_until(lambda: quiet(q), 20, "a quiet queue", w)
                runs = r.all_runs()
                assert all(runs[t] >= 1 for t in ok)
                zombie_ids = {lease.id for lease in zombie}
                assert all(q.status(i) == "done" for i in zombie_ids)
                out = w.output()
                assert "Redis unavailable" in out and "Redis is back" in out
                assert "reaped expired leases" in out
                assert int(srv.client().info("memory")["number_of_cached_scripts"]) > 0
                assert w.proc.poll() is None
                print(f"{len(ok)} acknowledged, {len(failed)} refused by the outage, "
                      f"{sum(v > 1 for v in runs.values())} ran twice")
                assert_clean(q)
                assert w.stop() == 0
        finally:
            app.close()


@pytest.mark.timeout(120)
def test_redis_crash_without_persistence_does_not_wedge_or_spin_the_worker(
        queue_name: str) -> None:
    with LocalRedis() as srv:
        app = App(redis_url=srv.url, queue=queue_name)
        q = app.queue()
        tags = [f"g{i % 16}:{i}" for i in range(10_000)]
        ok: list[str] = []
        failed: list[str] = []
        halfway = threading.Event()
        try:
            # tick 2 s: the tick is the idle cost (reap + promote + one park per tick, and
            # commandstats counts the commands the two scripts run inside as well)
            with start_worker(srv.url, queue_name, concurrency=4, tick=2.0) as w:
                loader = threading.Thread(target=_load, args=(app, tags, 100, 0.03, ok, failed,
                                                              halfway, 3000), daemon=True)
                loader.start()
                assert halfway.wait(30)
                admin = srv.client()
                r = Rec(admin, queue_name)
                done_before = set(r.all_runs())   # the records die with the data too
                srv.kill()
                time.sleep(1.5)
                srv.start()             # empty: everything of before is gone
                loader.join(60)
                assert not loader.is_alive()
                wait_until(lambda: quiet(q), 30, "the surviving backlog to drain", w)
                done = done_before | set(r.all_runs())
                lost = [t for t in ok if t not in done]
                print(f"{len(ok)} acknowledged, {len(failed)} refused by the outage, "
                      f"{len(lost)} acknowledged but lost with the unpersisted data")
                # The worker carries on: new work after the restart runs, each job once
                fresh = [f"new{i % 4}:{i}" for i in range(200)]
                enqueue(app, ft.count, [(t,) for t in fresh])
                wait_until(lambda: all(r.runs(t) == 1 for t in fresh), 20, "fresh jobs", w)
                wait_until(lambda: quiet(q), 10, "a quiet queue", w)
                # ... and idles cheaply: no spin, few commands
                time.sleep(1.5)
                pids = [w.pid, *w.children()]
                cpu0 = sum(_cpu(p) for p in pids)
                before = _commands(admin)
                time.sleep(2.0)
                rate = (_commands(admin) - before) / 2.0
                cpu = sum(_cpu(p) for p in pids) - cpu0
                print(f"idle: {rate:.1f} commands/s, {cpu:.2f} s CPU in 2 s")
                assert rate < 10, rate
                assert cpu < 0.3, cpu
                report = check(q)
                if not report.ok:
                    print("before repair:", report.violations)
                    repair(q)
                assert_clean(q)
                assert w.proc.poll() is None and w.stop() == 0
        finally:
            app.close()


# -- 11. three workers reaping and promoting at once ----------------------------------------

@pytest.mark.timeout(90)
def test_three_workers_reaping_and_promoting_at_once_run_each_job_once(
        app: App, rec: Rec) -> None:
    q = app.queue()
    groups = ["a", "b", "c", "d"]
    k = q.keys
    overlaps: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        # One MULTI snapshot of every structure at a time: no id in two places, ever
        c = redis.Redis.from_url(app.settings.redis_url, decode_responses=True)
        while not stop.wait(0.01):
            pipe = c.pipeline(transaction=True)
            for g in groups:
                pipe.zrange(k.lane(g), 0, -1)
            pipe.zrange(k.active, 0, -1)
            pipe.zrange(k.delayed, 0, -1)
            pipe.zrange(k.dead, 0, -1)
            seen: dict[str, int] = {}
            for ids in pipe.execute():
                for i in ids:
                    seen[i] = seen.get(i, 0) + 1
            overlaps.extend(i for i, n in seen.items() if n > 1)
        c.close()

    rnd = random.Random(11)
    once = [f"{groups[i % 4]}:o{i}" for i in range(240)]
    flaky = [f"{groups[i % 4]}:f{i}" for i in range(60)]
    watcher = threading.Thread(target=watch, daemon=True)
    workers: list[WorkerProc] = []
    try:
        for _ in range(3):
            workers.append(start_worker(app.settings.redis_url, q.name, concurrency=2,
                                        tick=0.05))
        watcher.start()
        # countdowns spread over 1.5 s, some due at once; fail_once goes through delayed
        # twice (its countdown, then its retry)
        for tag in once:
            app.send_task(ft.once, (tag,), countdown=rnd.choice([0, rnd.random() * 1.5]))
        for tag in flaky:
            app.send_task(ft.fail_once, (tag,), countdown=rnd.random() * 1.0)
        wait_until(lambda: len(rec.all_runs()) == len(once) + len(flaky), 40,
                   "every job to complete", workers[0])
        wait_until(lambda: quiet(q), 10, "a quiet queue")
        stop.set()
        watcher.join(5)
        for w in workers:
            assert w.stop() == 0
    finally:
        stop.set()
        for w in workers:
            w.__exit__(None, None, None)
    assert not overlaps, sorted(set(overlaps))[:10]
    starts, runs = rec.all_starts(), rec.all_runs()
    assert all(starts[t] == 1 and runs[t] == 1 for t in once), \
        {t: (starts[t], runs[t]) for t in once if (starts[t], runs[t]) != (1, 1)}
    assert all(starts[t] == 2 and runs[t] == 1 for t in flaky), \
        {t: (starts[t], runs[t]) for t in flaky if (starts[t], runs[t]) != (2, 1)}
    assert_clean(q)
