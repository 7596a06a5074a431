"""Faults in the worker: a child or the master killed mid-task, SIGTERM within and past its
grace, tasks that hold the GIL, run out of memory, kill their own child or never return."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import fault_tasks as ft
import fault_tasks_more as fm
import pytest
from faults import (
    Notes,
    Rec,
    assert_clean,
    is_alive,
    recorded,
    rss_mb,
    start_more_worker,
    start_worker,
    summary,
    wait_until,
)

from emqtasks import App
from emqtasks.errors import TaskFailed
from emqtasks.observe.lanes import stats as queue_stats


@pytest.fixture
def rec(app: App) -> Iterator[Notes]:
    yield from recorded(app)


# -- a child SIGKILLed mid-task, the master SIGKILLed with children busy -----------------

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
    stats = queue_stats(q)
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


# -- SIGTERM during a long task ----------------------------------------------------------

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


# -- a task holding the GIL or blocking in C past its lease ------------------------------

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


# -- a task that kills its own child -----------------------------------------------------

@pytest.mark.timeout(60)
def test_a_task_that_kills_its_own_child_dies_worker_lost_without_a_crash_loop(
        app: App, rec: Notes) -> None:
    q = app.queue()
    attempts = fm.exit_self.spec.max_attempts
    with start_more_worker(app.settings.redis_url, q.name, concurrency=2) as w:
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


# -- MemoryError, and the OOM killer -----------------------------------------------------

@pytest.mark.timeout(60)
def test_memory_error_is_an_ordinary_retry_and_an_oom_kill_is_worker_lost(
        app: App, rec: Notes) -> None:
    q = app.queue()
    with start_more_worker(app.settings.redis_url, q.name, concurrency=2) as w:
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


# -- a task that never returns: time limits ----------------------------------------------

@pytest.mark.timeout(90)
def test_a_task_that_never_returns_is_stopped_at_its_time_limit_and_the_slot_reused(
        app: App, rec: Notes) -> None:
    q = app.queue()
    # One child, so every job runs in the same slot
    with start_more_worker(app.settings.redis_url, q.name, concurrency=1, tick=0.1) as w:
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
