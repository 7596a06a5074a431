"""The worker as users run it: a real `emqtasks worker` process against a real Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import worker_tasks as wt
from helpers import data_keys
from workerproc import HERE, WorkerProc

from emqtasks import App
from emqtasks.store.queue import NewJob

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def rec(app: App):  # type: ignore[no-untyped-def]
    """Reads what the test tasks recorded for this test's queue; cleans it up after."""
    r = app.client
    prefix = f"t:{app.settings.queue}:"

    class Recorder:
        def runs(self, tag: str) -> int:
            return int(r.hget(prefix + "runs", tag) or 0)

        def starts(self, tag: str) -> int:
            return int(r.hget(prefix + "starts", tag) or 0)

        def hget(self, name: str, tag: str) -> str | None:
            return r.hget(prefix + name, tag)

        def seq(self) -> int:
            """How many jobs have started so far (the tasks number their starts)."""
            return int(r.get(prefix + "seq") or 0)

        def total_runs(self) -> int:
            return sum(int(v) for v in r.hvals(prefix + "runs"))

    yield Recorder()
    for key in r.scan_iter(match=prefix + "*"):
        r.delete(key)


def start(app: App, *extra: str, concurrency: int = 2, tick: float = 0.2) -> WorkerProc:
    w = WorkerProc(app.settings.redis_url, app.settings.queue, *extra,
                   concurrency=concurrency, tick=tick)
    w.wait_ready()
    return w


def test_jobs_from_several_groups_all_complete(app: App, rec) -> None:
    # Given a worker, When jobs arrive in three groups, Then each runs exactly once
    with start(app) as w:
        tags = [f"{g}:{i}" for g in ("a", "b", "c") for i in range(30)]
        handles = [app.send_task(wt.record, (t,)) for t in tags]
        assert [h.get(timeout=20) for h in handles] == tags
        assert all(rec.runs(t) == 1 for t in tags)
        assert w.stop() == 0
    stats = app.stats()
    assert stats["pending"] == 0 and stats["active"] == 0


def test_quiet_group_starts_before_the_flood_drains(app: App, rec) -> None:
    # Given a running pool and a 5,000-job flood in one group
    with start(app) as w:
        app.queue().enqueue_many([
            NewJob(f"flood-{i}", "t.record", f'{{"v":1,"a":["flood:{i}"],"k":{{}}}}',
                   "flood", 3, 30_000, 50, 3600) for i in range(5000)])
        # When one job of a quiet group arrives behind it (the pool drains the flood as it
        # is enqueued: on a loaded machine some hundred flood jobs may start before the
        # quiet one exists, and those say nothing of fairness)
        quiet = app.send_task(wt.record, ("quiet:1",))
        enqueued_at = rec.seq()
        quiet.get(timeout=20)
        # Then it started long before the flood drained: within a few turns of the ring of
        # its enqueue (two children, each with a batch of at most 8 held)
        started_at = int(rec.hget("seqof", "quiet:1") or 0)
        assert started_at > 0 and started_at - enqueued_at < 50, (started_at, enqueued_at)
        assert app.stats()["groups"].get("flood", {}).get("pending", 0) > 3000
        w.stop()


def test_a_killed_child_is_replaced_and_its_job_runs_again_exactly_once(app: App, rec) -> None:
    with start(app) as w:
        before = set(w.children())
        h = app.send_task(wt.sleepy, ("k1", 1.5))
        w.wait_for(lambda: rec.hget("pid", "k1"), what="job start")
        victim = int(rec.hget("pid", "k1") or 0)
        # When the child running it is SIGKILLed mid-job
        os.kill(victim, signal.SIGKILL)
        # Then the job is retried (the kill counts as an attempt) and completes once
        assert h.get(timeout=20) == "k1"
        assert rec.runs("k1") == 1 and rec.starts("k1") == 2
        assert app.job(h.id)["attempts"] == 2
        # And a new child took the dead one's place
        w.wait_for(lambda: len(w.children()) == 2 and victim not in w.children(),
                   what="replacement child")
        assert set(w.children()) != before
        assert "WorkerLost" in (app.job(h.id)["error"] or "")
        assert w.stop() == 0
    assert app.stats()["groups"].get("sleepy", {}).get("active", 0) == 0


def test_after_the_master_is_killed_a_new_worker_finishes_every_job(app: App, rec) -> None:
    tags = [f"m{i}" for i in range(4)]
    with start(app) as w:
        handles = [app.send_task(wt.sleepy, (t, 0.6)) for t in tags]
        w.wait_for(lambda: sum(rec.starts(t) for t in tags) >= 2, what="jobs running")
        children = w.children()
        # When the master is SIGKILLed with children busy
        w.kill()
    # Then its children die with it (they stop claiming) ...
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{c}") and _is_alive(c) for c in children):
        assert time.monotonic() < deadline, "children outlived their master"
        time.sleep(0.02)
    # ... and a new master reaps the expired leases and completes every job
    with start(app) as w2:
        assert [h.get(timeout=30) for h in handles] == tags
        assert all(rec.runs(t) == 1 for t in tags)
        w2.stop()


def _is_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_a_job_past_its_lease_is_renewed_and_runs_once(app: App, rec) -> None:
    # Given a task with a 1 s lease, When it runs for 3 s under a worker
    with start(app, concurrency=2) as w:
        h = app.send_task(wt.sleepy, ("long", 3.0))
        assert h.get(timeout=20) == "long"
        # Then the master's renewals kept the lease: nobody reaped and re-ran it
        assert rec.starts("long") == 1 and rec.runs("long") == 1
        assert app.job(h.id)["attempts"] == 1
        w.stop()


def test_sigterm_mid_job_lets_it_finish_and_exits_zero(app: App, rec) -> None:
    with start(app) as w:
        h = app.send_task(wt.sleepy, ("term", 1.0))
        w.wait_for(lambda: rec.starts("term") == 1, what="job start")
        w.signal(signal.SIGTERM)
        assert w.proc.wait(20) == 0
        assert rec.runs("term") == 1
        assert h.status() == "done"
        assert "stopped" in w.output()


def test_an_idle_worker_stops_at_once_not_at_the_end_of_its_park(app: App) -> None:
    # Given an idle worker whose park waits up to its 20 s tick on the wake key
    with start(app, tick=20) as w:
        w.wait_for(lambda: any(c["cmd"] == "blpop" for c in app.client.client_list()),
                   what="the park's BLPOP")
        # When it is told to stop, Then it is gone at once: the park is cut short, not
        # waited on (it used to cost the master a second's join of the park thread)
        began = time.monotonic()
        w.signal(signal.SIGTERM)
        assert w.proc.wait(20) == 0
        assert time.monotonic() - began < 0.7, w.output()
        assert "Redis unavailable" not in w.output()


def test_grace_running_out_releases_the_job_back_to_its_lane(app: App, rec) -> None:
    with start(app, "--grace", "0.3") as w:
        h = app.send_task(wt.sleepy, ("cut", 5.0))
        w.wait_for(lambda: rec.starts("cut") == 1, what="job start")
        w.signal(signal.SIGTERM)
        assert w.proc.wait(20) == 0
    # The job was cut short, released through the fence: pending again, attempt rolled back
    assert rec.runs("cut") == 0
    assert h.status() == "pending"
    assert app.job(h.id)["attempts"] == 0
    assert app.stats()["groups"]["sleepy"]["active"] == 0


def test_two_masters_share_a_burst(app: App, rec) -> None:
    with start(app, concurrency=2) as w1, start(app, concurrency=2) as w2:
        tags = [f"b{i}" for i in range(16)]
        handles = [app.send_task(wt.sleepy, (t, 0.3)) for t in tags]
        assert [h.get(timeout=30) for h in handles] == tags
        pids = {int(rec.hget("pid", t) or 0) for t in tags}
        w1_kids, w2_kids = set(w1.children()), set(w2.children())
        assert pids & w1_kids and pids & w2_kids, (pids, w1_kids, w2_kids)
        w1.stop()
        w2.stop()


def test_raised_errors_retry_after_their_delay_then_succeed(app: App, rec) -> None:
    with start(app) as w:
        h = app.send_task(wt.flaky, ("f1",))
        assert h.get(timeout=20) == 3
        assert rec.runs("f1") == 1
        assert app.job(h.id)["attempts"] == 3
        w.stop()


def test_out_of_attempts_lands_in_dead_with_the_traceback(app: App, rec) -> None:
    with start(app) as w:
        h = app.send_task(wt.always_fails)
        w.wait_for(lambda: h.status() == "dead", what="dead job")
        error = app.job(h.id)["error"]
        assert "RuntimeError: no luck" in error and "Traceback" in error
        assert app.job(h.id)["attempts"] == 2
        assert "failed" in w.output() and h.id in w.output()
        w.stop()


def test_bad_jobs_are_dead_lettered_and_the_worker_goes_on(app: App, rec) -> None:
    with start(app) as w:
        unknown = app.send_task("t.no_such_task", (1,))
        misfit = app.send_task(wt.needs_two, (1,))
        app.queue().enqueue_many([NewJob("garbled", "t.record", "{not json", "default",
                                         3, 30_000, 50, 3600)])
        for job_id in (unknown.id, misfit.id, "garbled"):
            w.wait_for(lambda j=job_id: app.queue().status(j) == "dead", what=f"{job_id} dead")
        assert "UnknownTask" in app.job(unknown.id)["error"]
        assert "arguments do not fit" in app.job(misfit.id)["error"]
        assert "SerializationError" in app.job("garbled")["error"]
        # Each is dead on its first attempt: retrying could never help
        assert app.job(misfit.id)["attempts"] == 1
        # And the children are still the same, serving good work
        assert app.send_task(wt.needs_two, (2, 3)).get(timeout=10) == 5
        w.stop()


def test_a_job_past_its_time_limit_is_killed_and_retried(app: App, rec) -> None:
    with start(app) as w:
        h = app.send_task(wt.slow_limited, ("tl",))
        w.wait_for(lambda: h.status() == "dead", timeout=20, what="dead after time limits")
        assert rec.starts("tl") == 2
        assert "TimeLimitExceeded" in app.job(h.id)["error"]
        w.wait_for(lambda: len(w.children()) == 2, what="replacement children")
        w.stop()


def test_children_are_replaced_after_max_tasks_per_child(app: App, rec) -> None:
    with start(app, "--max-tasks-per-child", "2", concurrency=1) as w:
        handles = [app.send_task(wt.sleepy, (f"r{i}", 0.0)) for i in range(6)]
        for h in handles:
            h.get(timeout=20)
        pids = {rec.hget("pid", f"r{i}") for i in range(6)}
        assert len(pids) == 3
        w.stop()


def test_the_worker_rides_out_a_redis_restart(private_redis, queue_name) -> None:
    app = App(redis_url=private_redis.url, queue=queue_name)
    with start(app) as w:
        assert app.send_task(wt.needs_two, (1, 1)).get(timeout=10) == 2
        private_redis.restart()   # SIGKILL and start again: the data is gone, the port same
        app.close()
        # (A blip this short may be absorbed by redis-py's own reconnect, logged or not.)
        h = app.send_task(wt.needs_two, (2, 2))
        assert h.get(timeout=30) == 4
        assert w.proc.poll() is None
        assert w.stop() == 0
    app.close()


def _cli(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(HERE))
    return subprocess.run([sys.executable, "-m", "emqtasks.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("args, message", [
    (["-A", "no_such_module_xyz"], "cannot import module 'no_such_module_xyz'"),
    (["-A", "worker_tasks", "--redis-url", "redis://127.0.0.1:1/0"],
     "cannot reach Redis at redis://127.0.0.1:1/0"),
    (["-A", "worker_tasks", "-Q", "bad name!"], "invalid queue name"),
])
def test_worker_start_errors_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = _cli("worker", *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_a_drained_queue_returns_to_its_baseline_keys_once_results_expire(app: App,
                                                                          rec) -> None:
    # Given a queue's key count before any work (the minutes of history and the workers'
    # heartbeats left aside: they expire after the retention, or a few ticks)
    def queue_keys() -> int:
        return data_keys(app.queue())

    baseline = queue_keys()
    with start(app) as w:
        # When jobs in many groups run with a 1 s result ttl, and their results are read
        handles = [app.send_task(wt.short_lived, (f"g{i % 7}",)) for i in range(50)]
        assert [h.get(timeout=20) for h in handles] == [f"g{i % 7}" for i in range(50)]
        w.stop()
    # Then once the results expire nothing of them is left: no rows, lanes, books or lists
    # (a wake token nobody took may stay up to a minute: it is not the jobs' and we skip it)
    app.client.delete(app.queue().keys.wake)
    deadline = time.monotonic() + 10
    while queue_keys() != baseline:
        assert time.monotonic() < deadline, sorted(app.client.scan_iter(
            match=app.queue().keys.all_pattern))
        time.sleep(0.1)


def test_the_park_thread_rides_out_a_server_down_when_it_connects(app: App) -> None:
    """A cluster client connects as it is made: the park thread's own client, made as the
    thread starts, can meet a server that is down. It must retry, not die (a worker whose
    park thread died took no more wakes)."""
    import threading

    import redis

    from emqtasks.worker import park

    calls = []

    def make_queues():  # type: ignore[no-untyped-def]
        calls.append(time.monotonic())
        if len(calls) in (1, 2):   # the park thread's first two tries meet a server down
            raise redis.exceptions.ConnectionError("no Redis Cluster node answered")
        return [app.queue()]

    stop, has_idle = threading.Event(), threading.Event()
    parker = park.Parker(make_queues, [0], 0.05, has_idle, stop, lambda _i: None, {})
    thread = threading.Thread(target=parker.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(calls) == 3 and thread.is_alive()
    stop.set()
    has_idle.set()
    thread.join(5)
    assert not thread.is_alive()
