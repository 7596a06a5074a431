"""Batches of short jobs under review (issue 31 item 5): every job a batching child holds
(claimed, not started) or finished (its ack sent with the next claim) runs exactly once and
is settled once, on the normal path and through a warm stop, --max-tasks-per-child, a
retry, a time limit, a long job behind it and a child killed while holding jobs. The jobs
of one group run in order, so a lane of fast jobs makes one child claim 1, 2, 4, then 8."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable

import pytest
from workerproc import WorkerProc

from emqtasks import App
from emqtasks.store.queue import NewJob

pytestmark = pytest.mark.timeout(90)
MODULES = ("batchreview_tasks",)


def _k(app: App, name: str) -> str:
    return f"br:{app.settings.queue}:{name}"


def _job(tag: str, task: str = "br.fast", *args: object, lease_ms: int = 30_000) -> NewJob:
    payload = json.dumps({"v": 1, "a": [tag, *args], "k": {}})
    return NewJob(tag, task, payload, tag.split("-")[0], 3, lease_ms, 50, 3600)


def _counts(app: App, name: str) -> dict[str, int]:
    raw = app.client.hgetall(_k(app, name))
    return {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}


def _until(app: App, done: Callable[[], bool], timeout: float = 30.0) -> bool:
    """Wait (bounded) until done() holds: a 50 ms pause per look, blocked on a list."""
    end = time.monotonic() + timeout
    while not done():
        if time.monotonic() > end:
            return False
        app.client.blpop([_k(app, "never")], timeout=0.05)
    return True


def _all_done(app: App, tags: list[str]) -> bool:
    q = app.queue()
    return all(q.status(t) == "done" for t in tags)


def _once_each(app: App, tags: list[str]) -> None:
    """Every job done, ran once, its success hook fired once, its context was its own."""
    q = app.queue()
    assert {t: q.status(t) for t in tags if q.status(t) != "done"} == {}
    runs, ok = _counts(app, "runs"), _counts(app, "succeeded")
    assert {t: runs.get(t, 0) for t in tags if runs.get(t, 0) != 1} == {}
    assert {t: ok.get(t, 0) for t in tags if ok.get(t, 0) != 1} == {}
    assert app.client.lrange(_k(app, "wrong_ctx"), 0, -1) == []


def _drain(app: App, tags: list[str], *extra: str, concurrency: int = 1,
           timeout: float = 20.0) -> None:
    """Run a worker until the jobs are done and their hooks fired (at most ``timeout``: a
    job left active waits for its 30 s lease; the test's asserts then say which)."""
    with WorkerProc(app.settings.redis_url, app.settings.queue, *extra,
                    concurrency=concurrency, modules=MODULES) as w:
        w.wait_ready()
        _until(app, lambda: _all_done(app, tags)
               and len(_counts(app, "succeeded")) >= len(tags), timeout)
        w.stop()



def test_a_warm_stop_releases_the_held_jobs_each_runs_once(app, queue):
    # Given one lane of fast jobs (batches of 1, 2, 4, 8), the 21st asks for a warm stop
    # in the middle of a batch of 8 (two jobs held behind it)
    tags = [f"g-{i:03d}" for i in range(40)]
    with WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=1,
                    modules=MODULES) as w:
        w.wait_ready()
        queue.enqueue_many([_job(t, "br.stop_master" if t == "g-020" else "br.fast")
                            for t in tags])
        assert w.proc.wait(timeout=30) == 0
    # Then the worker ran no job twice, left none active, and the held ones wait again
    runs = _counts(app, "runs")
    assert max(runs.values()) == 1 and "g-020" in runs
    assert [t for t in tags if queue.status(t) not in ("done", "pending")] == []
    assert [t for t in tags if t not in runs and queue.status(t) != "pending"] == []
    # And a new worker runs the rest: each job once
    _drain(app, tags)
    _once_each(app, tags)


def test_max_tasks_per_child_with_batches_runs_each_job_once(app, queue):
    tags = [f"g-{i:03d}" for i in range(40)]
    queue.enqueue_many([_job(t) for t in tags])
    _drain(app, tags, "--max-tasks-per-child", "7")
    _once_each(app, tags)


def test_a_long_job_in_a_batch_hands_on_the_others_each_settled_once(app, queue):
    # Given fast jobs with a few 0.15 s ones among them (the watchdog acks the finished
    # jobs and releases the held ones; this child claims them again)
    tags = [f"g-{i:03d}" for i in range(40)]
    queue.enqueue_many([_job(t, "br.sleep", 0.15) if i in (10, 25, 33) else
                        _job(t, "br.sleep", 0) for i, t in enumerate(tags)])
    _drain(app, tags)
    _once_each(app, tags)


def test_jobs_about_as_long_as_the_hand_on_each_run_once(app, queue):
    # Given jobs that end about when the watchdog hands on (0.1 s) among fast ones, in
    # four lanes on two children: the watchdog's hand-on races the child's next start
    rng = random.Random(31)
    tags = [f"{g}-{i:03d}" for i in range(60) for g in "abcd"]
    queue.enqueue_many([_job(t, "br.sleep", rng.uniform(0.095, 0.105))
                        if rng.random() < 0.15 else _job(t, "br.sleep", 0) for t in tags])
    _drain(app, tags, concurrency=2)
    _once_each(app, tags)


def test_a_retry_in_a_batch(app, queue):
    tags = [f"g-{i:03d}" for i in range(20)]
    queue.enqueue_many([_job(t, "br.retry_once" if t == "g-010" else "br.fast")
                        for t in tags])
    _drain(app, tags)
    runs = _counts(app, "runs")
    assert runs.pop("g-010") == 2 and _counts(app, "retried") == {"g-010": 1}
    _once_each(app, [t for t in tags if t != "g-010"])
    assert _counts(app, "succeeded")["g-010"] == 1


def test_a_held_jobs_time_limit_counts_from_its_start(app, queue):
    # Given a batch of 8 (jobs 7..14) whose 14th job (0.5 s limit, runs 0.3 s) starts
    # 0.45 s after the claim, behind five of 0.09 s
    tags = [f"g-{i:03d}" for i in range(16)]
    jobs = [_job(t) for t in tags]
    for i in range(8, 13):
        jobs[i] = _job(tags[i], "br.sleep", 0.09)
    jobs[13] = _job(tags[13], "br.limited", 0.3)
    queue.enqueue_many(jobs)
    _drain(app, tags)
    _once_each(app, tags)


def test_finished_jobs_of_a_batch_are_acked_within_their_lease(app, queue):
    # Given jobs with a 0.4 s lease: a batch of 8 (jobs 7..14) whose first is fast and the
    # next seven run 0.09 s each (none long enough for the watchdog's 0.1 s)
    tags = [f"g-{i:03d}" for i in range(16)]
    jobs = [_job(t, lease_ms=400) for t in tags]
    for i in range(8, 15):
        jobs[i] = _job(tags[i], "br.sleep", 0.09, lease_ms=400)
    queue.enqueue_many(jobs)
    _drain(app, tags)
    # Then the fast one's ack was not held past its lease (it would be reaped and run again)
    _once_each(app, tags)


def test_a_child_killed_holding_jobs_they_come_back_and_run(app, queue):
    # Given a batch of 8 (jobs 7..14) whose third job kills its child on its first attempt
    tags = [f"g-{i:03d}" for i in range(16)]
    queue.enqueue_many([_job(t, "br.die_once" if t == "g-009" else "br.fast",
                             lease_ms=1000) for t in tags])
    _drain(app, tags)
    runs = _counts(app, "runs")
    # Then the killed job ran again, the held ones (never started) once each, and the
    # finished ones whose ack was pending at least once
    assert runs["g-009"] == 2
    assert {t: runs[t] for t in tags[10:]} == dict.fromkeys(tags[10:], 1)
    assert all(runs[t] >= 1 for t in tags[:9])


def test_the_jobs_a_killed_child_held_are_released_not_left_to_their_lease(app, queue):
    # Given a batch of 8 (jobs 7..14) of 30 s leases whose fourth job SIGKILLs its child on
    # its first run: four jobs are held behind it (claimed, not started)
    tags = [f"g-{i:03d}" for i in range(16)]
    queue.enqueue_many([_job(t, "br.die_once" if t == "g-010" else "br.fast") for t in tags])
    with WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=1,
                    modules=MODULES) as w:
        w.wait_ready()
        # When the master sees its child die (and replaces it)
        finished = _until(app, lambda: _all_done(app, tags), timeout=10.0)
        held = {t: queue.status(t) for t in tags[11:15] if queue.status(t) != "done"}
        w.stop()
    # Then the held jobs were given back at once, not after their lease (30 s): the
    # replacement ran each of them, once (released unrun: no attempt spent)
    assert held == {}
    assert finished
    runs = _counts(app, "runs")
    assert runs.pop("g-010") == 2
    assert {t: runs.get(t, 0) for t in tags[11:]} == dict.fromkeys(tags[11:], 1)
    assert {t: (queue.job(t) or {}).get("attempts") for t in tags[11:15]} == dict.fromkeys(
        tags[11:15], 1)


def test_a_child_killed_mid_batch_runs_no_finished_job_of_it_again(app, queue):
    # Given one lane of fast jobs (batches of 1, 2, 4, 8) whose 11th, the fourth of the
    # batch of 8 (jobs 7..14), SIGKILLs its child on its first run: three jobs of that
    # batch finished before it
    tags = [f"g-{i:03d}" for i in range(16)]
    queue.enqueue_many([_job(t, "br.die_once" if t == "g-010" else "br.fast",
                             lease_ms=1000) for t in tags])
    with WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=1,
                    modules=MODULES) as w:
        w.wait_ready()
        # (the success hooks of the three are not waited for: their child was killed
        # before it read their acks' replies)
        assert _until(app, lambda: _all_done(app, tags))
        w.stop()
    runs = _counts(app, "runs")
    # Then the killed job ran again, and each other job once: a finished job's ack was
    # written as it finished, not held for the batch's next claim
    assert runs.pop("g-010") == 2
    assert runs == {t: 1 for t in tags if t != "g-010"}
    assert all(queue.status(t) == "done" for t in tags)


def test_acks_posted_on_a_cut_connection_are_sent_again_each_settled_once(app, queue):
    # Given a batch of 8 (jobs 7..14) whose fourth job has the server cut its child's
    # connection: its own ack and the next ones are posted on a connection that is gone
    tags = [f"g-{i:03d}" for i in range(16)]
    queue.enqueue_many([_job(t, "br.cut_once" if t == "g-010" else "br.fast") for t in tags])
    _drain(app, tags)
    # Then each lost ack was sent again (its verdict read: the success hook fired once),
    # and no job ran twice
    _once_each(app, tags)


def test_a_batch_never_exceeds_a_group_limit_of_one(app, queue):
    app.set_group_limit("lim", 1)
    queue.enqueue_many([NewJob(f"{g}-{i}", "bt.short", f'{{"v":1,"a":["{g}:{i}"],"k":{{}}}}',
                               g, 3, 30_000, 50, 3600)
                        for i in range(200) for g in ("lim", "free")])
    with WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=3,
                    modules=("batch_tasks",)) as w:
        w.wait_ready()
        key = f"bt:{app.settings.queue}:order"
        assert _until(app, lambda: app.client.llen(key) >= 400)
        w.stop()
    assert int(app.client.get(f"bt:{app.settings.queue}:max:lim") or 0) == 1


def test_a_child_retiring_right_after_a_hand_on_settles_the_finished_jobs(app, queue):
    # Given a child that retires after 7 jobs (claims of 1, 2, then 4) whose 7th runs just
    # past the watchdog's 0.1 s: the watchdog acks the three finished before it as the
    # child ends its job, settles it and exits
    tags = [f"g-{i:03d}" for i in range(70)]
    queue.enqueue_many([_job(t, "br.sleep", 0.1015) if i % 7 == 6 else _job(t, "br.sleep", 0)
                        for i, t in enumerate(tags)])
    _drain(app, tags, "--max-tasks-per-child", "7")
    # Then each of them was acked once and its hook fired, before the child was gone
    _once_each(app, tags)


def test_a_rate_limited_job_in_a_batch_stops_its_group_held_behind_it(app, queue):
    # Given a batch of 8 (jobs 7..14) of one group whose second job hits an outside limit
    # (RateLimited: its group sits out 1 s)
    tags = [f"g-{i:03d}" for i in range(16)]
    queue.enqueue_many([_job(t, "br.api" if t == "g-008" else "br.fast") for t in tags])
    _drain(app, tags)
    # Then none of its group ran while it sat out: the jobs held behind it waited too, as
    # jobs not yet claimed would (g-008 runs again first, at the head of its lane)
    order = [x.decode() if isinstance(x, bytes) else x
             for x in app.client.lrange(_k(app, "order"), 0, -1)]
    first = order.index("g-008")
    assert order[first + 1] == "g-008", order
    _once_each(app, [t for t in tags if t != "g-008"])


def test_a_hard_stop_leaves_no_held_job_active(app, queue):
    # Given a batch of 8 (jobs 7..14) whose fourth job interrupts its worker twice (the
    # master kills its children at once) while four jobs are held behind it
    tags = [f"g-{i:03d}" for i in range(16)]
    with WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=1,
                    modules=MODULES) as w:
        w.wait_ready()
        queue.enqueue_many([_job(t, "br.hard_stop" if t == "g-010" else "br.fast")
                            for t in tags])
        w.proc.wait(timeout=30)
    # Then the job it ran is released, and so are the held ones: none waits for its lease
    assert queue.status("g-010") == "pending"
    assert {t: queue.status(t) for t in tags[11:] if queue.status(t) != "pending"} == {}


def test_time_fairness_charges_a_batched_short_job_its_own_time(app, queue):
    # Given a queue in time mode: group a's jobs run ~0 ms, group b's 20 ms, one child
    app.set_fairness("time")
    queue.enqueue_many([_job(f"a-{i:04d}", "br.sleep", 0) for i in range(3000)]
                       + [_job(f"b-{i:03d}", "br.sleep", 0.02) for i in range(200)])
    with WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=1,
                    modules=MODULES) as w:
        w.wait_ready()
        # When b has run 25 jobs (half a second of its time)
        assert _until(app, lambda: sum(1 for t in _counts(app, "runs") if t[0] == "b") >= 25)
        runs = _counts(app, "runs")
        w.stop()
    # Then a had about as much of the child's time: many more of its short jobs ran. A
    # short job of a batch acked after b's job had been charged b's 20 ms (claim to ack):
    # then a ran about as many jobs as b. (Quiet, a ran 37-42 times b's count; a loaded
    # machine stretches a's short jobs, hence the margin.)
    a = sum(1 for t in runs if t[0] == "a")
    b = sum(1 for t in runs if t[0] == "b")
    assert a >= 4 * b, (a, b)


def test_a_warm_stop_of_a_child_starts_no_held_job(app, queue):
    # Given a batch of 8 (jobs 7..14) whose fourth job gets its child a warm stop (SIGTERM,
    # as the master's stop or systemd's reaches it): four jobs are held behind it
    tags = [f"g-{i:03d}" for i in range(16)]
    queue.enqueue_many([_job(t, "br.term_self" if t == "g-010" else "br.pid")
                        for t in tags])
    _drain(app, tags)
    pids = {str(k): int(v) for k, v in app.client.hgetall(_k(app, "pid")).items()}
    # Then the stopping child ran only the job in hand: g-011, held (claimed, not started)
    # when the stop came, went back and was run by another child, as the jobs after it
    assert pids["g-011"] != pids["g-010"]
    _once_each(app, tags)


def test_an_abort_of_a_held_job_is_not_lost_when_it_is_handed_on(app, queue):
    # Given a batch of 8 (jobs 7..14) whose second job asks an abort of the fourth (held
    # behind it: active, not started; the abort is answered "asked") and runs 0.3 s, past
    # the watchdog's 0.1 s: the held jobs are handed on
    tags = [f"g-{i:03d}" for i in range(16)]
    queue.enqueue_many([_job(t, "br.abort_next", "g-010") if t == "g-008" else _job(t)
                        for t in tags])
    with WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=1,
                    modules=MODULES) as w:
        w.wait_ready()
        assert _until(app, lambda: queue.status("g-010") in ("done", "aborted")
                      and _all_done(app, [t for t in tags if t != "g-010"]))
        w.stop()
    assert app.client.hget(_k(app, "asked"), "g-010") == "1"   # AbortAsk.ASKED
    # Then the job whose abort was asked did not run to its end: it is aborted
    assert queue.status("g-010") == "aborted"


def test_an_ack_lost_with_a_cut_connection_while_a_long_job_runs_is_not_run_again(app,
                                                                                  queue):
    # Given a batch of 8 (jobs 7..14) whose fourth job (a 0.5 s lease) has the server cut
    # its child's connection: its ack is posted on a connection that is gone. The job
    # after it runs 2.5 s: the fourth's slot is the fifth's now, nobody renews its lease
    tags = [f"g-{i:03d}" for i in range(16)]
    jobs = [_job(t) for t in tags]
    jobs[10] = _job(tags[10], "br.cut_once", lease_ms=500)
    jobs[11] = _job(tags[11], "br.sleep", 2.5)
    queue.enqueue_many(jobs)
    _drain(app, tags, timeout=30)
    # Then the job whose ack was lost ran once (its ack sent again before its lease ran out,
    # as the ack of a child without batches is: while its slot keeps its lease)
    assert _counts(app, "runs")["g-010"] == 1
