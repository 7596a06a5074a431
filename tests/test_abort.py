"""Aborting a job (issue 32 item 1): a running job is stopped within about a second through
the server (Aborted in a sync task, the cancellation of an async one, a kill past the
grace), ends ``aborted``, is never retried, fires task_dead; one not started is cancelled; an
abort aimed at one attempt never stops the next. On both paths (the scripts, EMQ_NATIVE=off;
the module, EMQ_NATIVE=require), with real workers (tests/tasks/abort_tasks.py)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import abort_tasks as at
import pytest
from click.testing import CliRunner
from dashsrv import DashServer
from workerproc import WorkerProc

from emqtasks import App, AsyncResult, chain, states
from emqtasks.cli import main
from emqtasks.config import WorkerSettings
from emqtasks.errors import InvalidArgument, TaskFailed, UnknownJob
from emqtasks.ops.check import check
from emqtasks.producer.registry import Registry
from emqtasks.verdicts import RetryVerdict
from emqtasks.worker.master import ChildHandle, Master, _ctx
from emqtasks.worker.pipe import IDLE

pytestmark = pytest.mark.timeout(90)


def _k(app: App, name: str) -> str:
    return f"t:{app.settings.queue}:{name}"


def _worker(app: App, *extra: str, concurrency: int = 2) -> WorkerProc:
    w = WorkerProc(app.settings.redis_url, app.settings.queue, *extra,
                   concurrency=concurrency, modules=("abort_tasks",))
    w.wait_ready()
    return w


def _started(app: App, *tags: str, timeout: float = 15.0) -> None:
    """Block until the tasks of ``tags`` said they started (each says so once)."""
    deadline = time.monotonic() + timeout
    waiting = set(tags)
    while waiting and time.monotonic() < deadline:
        got = app.client.blpop([_k(app, "started")], timeout=1)
        if got is not None:
            waiting.discard(got[1])
    assert not waiting, f"{sorted(waiting)} never started"


def _hook(app: App) -> str | None:
    """The next task_dead hook fired: "<job id> <exception type>" (it fires just after the
    job's end is written, so a moment after get() returns)."""
    got = app.client.blpop([_k(app, "dead_hook")], timeout=5)
    return None if got is None else str(got[1])


def _stop_time(app: App, handle: object) -> float:
    """Abort a running job; seconds until get() reports it aborted."""
    t0 = time.monotonic()
    assert handle.abort() == "aborting"  # type: ignore[attr-defined]
    with pytest.raises(TaskFailed, match="aborted"):
        handle.get(timeout=10)  # type: ignore[attr-defined]
    return time.monotonic() - t0


def test_abort_stops_a_busy_loop(path_app: App) -> None:
    # Given a sync task spinning in pure Python on a worker
    app = path_app
    with _worker(app):
        h = app.send_task(at.busy, ("b1",))
        _started(app, "b1")
        # When it is aborted
        took = _stop_time(app, h)
        # Then Aborted was raised in it, within a second, and the job ended aborted: not
        # retried, its failure hook fired with the Aborted
        assert took < 1.0
        assert app.client.hget(_k(app, "ended"), "b1") == "aborted"
        assert h.status() == "aborted"
        row = h.info()
        assert row is not None and row["attempts"] == 1
        assert _hook(app) == f"{h.id} Aborted"
        assert app.dead_jobs() == []
        # and the child that ran it serves the next job
        assert app.send_task(at.quick, ("q1",)).get(timeout=10) == "q1"


def test_a_task_that_swallows_aborted_is_killed_after_its_grace(path_app: App) -> None:
    # Given a task that catches Aborted and goes on (abort_grace=1.0), on a pool of 2
    app = path_app
    with _worker(app) as w:
        h = app.send_task(at.stubborn, ("s1",))
        _started(app, "s1")
        pid = int(app.client.hget(_k(app, "pid"), "s1"))
        before = set(w.children())
        assert pid in before and len(before) == 2
        # When it is aborted
        took = _stop_time(app, h)
        # Then it saw Aborted, kept going, and its child was killed after the grace: the
        # job is aborted (not retried), the child replaced, the pool still 2 children
        assert app.client.hget(_k(app, "swallowed"), "s1") == "1"
        assert 1.0 <= took < 4.0
        assert h.status() == "aborted"
        w.wait_for(lambda: len(w.children()) == 2 and pid not in w.children(), timeout=10)
        results = [app.send_task(at.quick, (f"q{i}",)) for i in range(4)]
        assert [r.get(timeout=10) for r in results] == [f"q{i}" for i in range(4)]
        assert _hook(app) == f"{h.id} Aborted"


def test_the_workers_abort_grace(path_app: App) -> None:
    # Given a task without an abort_grace of its own that swallows Aborted, on a worker run
    # with --abort-grace 0.3 (the default, 5 s, would outlast the bound below)
    app = path_app
    with _worker(app, "--abort-grace", "0.3"):
        h = app.send_task(at.deaf, ("g1",))
        _started(app, "g1")
        # When it is aborted, Then its child is killed after 0.3 s, the job aborted
        assert 0.3 <= _stop_time(app, h) < 2.0
        assert h.status() == "aborted"


def test_an_idle_worker_does_not_listen_for_aborts(path_app: App) -> None:
    # Given a pool of one child that ran a job and is idle now: only its park thread blocks
    # on the server (the abort listener waits for a job, in the process)
    app = path_app
    with _worker(app, concurrency=1):
        assert app.send_task(at.quick, ("i",)).get(timeout=10) == "i"
        time.sleep(0.5)   # the listener's last BLPOP (0.2 s, the test worker's tick) ends
        blocked = []
        for _ in range(5):
            blocked.append(app.client.info("clients")["blocked_clients"])
            time.sleep(0.1)
        assert max(blocked) <= 1, blocked
        # While a job runs, the listener blocks on the master's abort list
        h = app.send_task(at.busy, ("i2",))
        _started(app, "i2")
        time.sleep(0.3)
        assert app.client.info("clients")["blocked_clients"] >= 1
        assert _stop_time(app, h) < 1.0


def test_abort_cancels_an_async_job(path_app: App) -> None:
    # Given an async task awaiting on a child's event loop (--async-concurrency 2)
    app = path_app
    with _worker(app, "--async-concurrency", "2"):
        h = app.send_task(at.sleeper, ("a1",))
        other = app.send_task(at.sleeper, ("a2",))
        _started(app, "a1", "a2")
        # When one is aborted
        took = _stop_time(app, h)
        # Then its coroutine was cancelled, it ended aborted, and its neighbour runs on
        assert took < 1.0
        assert app.client.hget(_k(app, "ended"), "a1") == "cancelled"
        assert h.status() == "aborted"
        assert other.status() == "active"
        assert other.abort() == "aborting"
        with pytest.raises(TaskFailed, match="aborted"):
            other.get(timeout=10)


def test_abort_of_an_async_task_on_a_sync_child(path_app: App) -> None:
    # Given an async task run to its end by a child without an event loop of its own
    app = path_app
    with _worker(app):
        h = app.send_task(at.sleeper, ("a3",))
        _started(app, "a3")
        assert _stop_time(app, h) < 1.0
        assert app.client.hget(_k(app, "ended"), "a3") == "cancelled"
        assert app.send_task(at.quick, ("q",)).get(timeout=10) == "q"


def test_abort_during_a_warm_stop(path_app: App) -> None:
    # Given a worker finishing its running job after SIGTERM (its grace is 30 s)
    app = path_app
    w = _worker(app)
    try:
        h = app.send_task(at.busy, ("ws",))
        _started(app, "ws")
        w.signal(signal.SIGTERM)
        w.wait_for(lambda: "finishing running jobs" in w.output(), timeout=10)
        # When the job is aborted, Then it stops within a second, and the worker exits
        assert _stop_time(app, h) < 1.0
        assert w.stop() == 0
    finally:
        w.kill() if w.proc.poll() is None else None


def test_an_aborted_step_fails_its_workflow(path_app: App) -> None:
    # Given a chain whose first step runs (and spins) on a worker
    app = path_app
    with _worker(app):
        wf = chain(at.busy.s("c1"), at.quick.si("after")).apply_async(app=app)
        first, second = (s["id"] for s in wf.steps())
        _started(app, "c1")
        # When that step is aborted
        assert app.abort(first) == "aborting"
        # Then the workflow fails as with a dead step: the step after it never runs
        with pytest.raises(TaskFailed):
            wf.get(timeout=10)
        assert wf.status() == "failed"
        assert app.queue().status(first) == "aborted"
        assert app.queue().status(second) == "cancelled"


def test_revoke_terminate_aborts_a_running_job(path_app: App) -> None:
    # Celery's spelling: AsyncResult.revoke(terminate=True) of a running job aborts it
    app = path_app
    with _worker(app):
        res = AsyncResult(app.send_task(at.busy, ("r1",)).id, app)
        _started(app, "r1")
        assert res.state == states.STARTED
        assert res.revoke(terminate=True) == "aborting"
        with pytest.raises(TaskFailed, match="aborted"):
            res.get(timeout=10)
        assert res.state == states.REVOKED
        assert isinstance(res.result, TaskFailed) and "aborted" in str(res.result)


def test_abort_of_a_job_not_started_cancels_it(path_app: App) -> None:
    # Given a job waiting in its lane and one delayed (no worker runs)
    app = path_app
    waiting = app.send_task(at.quick, ("w",))
    later = app.send_task(at.quick, ("l",), countdown=60)
    # When they are aborted, Then they are cancelled, as cancel() does
    assert waiting.abort() == "cancelled"
    assert later.abort() == "cancelled"
    assert waiting.status() == later.status() == "cancelled"
    # and an abort of a finished job says so, of an unknown id raises UnknownJob
    assert waiting.abort() == "finished"
    with pytest.raises(UnknownJob):
        app.abort("no-such-job")


def test_current_job_aborted_lets_a_loop_stop_cleanly(path_app: App) -> None:
    # Given a loop that swallows every exception but checks current_job().aborted
    app = path_app
    with _worker(app):
        h = app.send_task(at.polite, ("p1",))
        _started(app, "p1")
        # When it is aborted, Then it returns on its own, and the job still ends aborted
        assert _stop_time(app, h) < 1.0
        assert app.client.hget(_k(app, "ended"), "p1") == "saw aborted"
        assert h.status() == "aborted"


def test_a_stale_abort_never_stops_the_next_attempt(path_app: App) -> None:
    # Given attempt N of a job, claimed by hand, aborted while a master (registered by
    # hand) is the queue's only one: the abort's token waits on that master's list
    app = path_app
    q = app.queue()
    h = app.send_task(at.busy, ("n1",))
    app.client.hset(q.keys.workers, "gone:1:1", "1")
    lease = q.claim(1)[0]
    assert h.abort() == "aborting"
    assert app.client.hget(q.keys.job(h.id), "abort") == lease.nonce
    assert app.client.llen(q.keys.aborts("gone:1:1")) == 1
    report = check(q)   # the checker knows the abort lists and the row's field
    assert report.ok, report.violations
    # When attempt N fails before its master took the abort and is retried (a release, or
    # its lease running out, would end the attempt an abort named: aborted), a real worker
    # claims it again (attempt N+1), and the stale token is delivered to that worker
    assert q.retry(lease, "failed as its abort was asked", delay=0) is RetryVerdict.RETRIED
    with _worker(app):
        _started(app, "n1")
        (worker,) = [w for w in app.workers() if w["id"] != "gone:1:1"]
        nonce = app.client.hget(_k(app, "nonce"), "n1")
        assert nonce != lease.nonce
        app.client.lmove(q.keys.aborts("gone:1:1"), q.keys.aborts(worker["id"]), "LEFT",
                         "RIGHT")
        # Then attempt N+1 runs on: the abort was aimed at attempt N
        time.sleep(1.5)   # what a delivered abort takes at most, and some
        assert h.status() == "active"
        assert app.client.llen(q.keys.aborts(worker["id"])) == 0   # taken, and dropped
        # while an abort aimed at it stops it
        assert _stop_time(app, h) < 1.0
    app.client.hdel(q.keys.workers, "gone:1:1")


def test_the_job_page_aborts_a_running_job(path_app: App) -> None:
    # Given a running job's page on the dashboard (a token, so the session's CSRF is checked)
    app = path_app
    with _worker(app), DashServer([app.queue()], token="tok") as d:
        h = app.send_task(at.busy, ("d1",))
        _started(app, "d1")
        cookie, csrf = d.sign_in("tok")
        hdr = {"Cookie": cookie}
        status, body, _ = d.request(f"/job?id={h.id}", headers=hdr)
        assert status == 200 and 'id="abort-one">abort<' in body
        # When the button is pressed without the session's CSRF token, Then nothing happens
        assert d.request("/job/abort", {"id": h.id, "csrf": "forged"}, headers=hdr)[0] == 403
        assert h.status() == "active"
        # When it is pressed, Then the job stops and ends aborted; the page says so
        status, _, _ = d.request("/job/abort", {"id": h.id, "csrf": csrf}, headers=hdr)
        assert status == 303
        with pytest.raises(TaskFailed, match="aborted"):
            h.get(timeout=10)
        body = d.request(f"/job?id={h.id}&done=aborting", headers=hdr)[1]
        assert 'id="done">abort asked' in body and 'id="abort-one"' not in body
        # And an unknown or malformed id is a clear refusal
        assert d.request("/job/abort", {"id": "nope", "csrf": csrf}, headers=hdr)[0] == 404
        assert d.request("/job/abort", {"id": "bad id", "csrf": csrf}, headers=hdr)[0] == 400
    # A read-only dashboard shows no button and refuses the action
    later = app.send_task(at.quick, ("ro",), countdown=60)
    with DashServer([app.queue()], read_only=True) as d:
        assert 'id="abort-one"' not in d.request(f"/job?id={later.id}")[1]
        assert d.request("/job/abort", {"id": later.id, "csrf": "x"})[0] == 403
    assert later.status() == "delayed"


def test_cli_abort(path_app: App) -> None:
    app = path_app
    args = ["--redis-url", app.settings.redis_url, "-Q", app.settings.queue]
    # An unknown id: one line, exit 1
    result = CliRunner().invoke(main, ["abort", "no-such-job", *args])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "no job no-such-job" in result.output
    # A job not started: cancelled
    h = app.send_task(at.quick, ("c",), countdown=60)
    result = CliRunner().invoke(main, ["abort", h.id, *args])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"cancelled job {h.id}"


#: The benchmark's size and target (issue 32): the p99 of abort() to stopped over this many
#: running jobs, within this many seconds (printed, never asserted: a speed target).
ABORTS, TARGET = 50, 1.0


def test_abort_time_to_stop(path_app: App, capsys: pytest.CaptureFixture[str]) -> None:
    # A benchmark figure: ABORTS running jobs aborted one after another, each timed from
    # the abort() call to get() reporting it aborted (asserted only as stopped)
    app = path_app
    times = []
    with _worker(app, concurrency=2):
        for i in range(ABORTS):
            h = app.send_task(at.busy, (f"m{i}",))
            _started(app, f"m{i}")
            times.append(_stop_time(app, h))
            assert h.status() == "aborted"
    times.sort()

    def pct(p: float) -> float:
        return times[min(len(times) - 1, int(len(times) * p))]

    p99 = pct(0.99)
    with capsys.disabled():
        print(f"\nabort to stopped, {len(times)} running jobs, "
              f"EMQ_NATIVE={os.environ.get('EMQ_NATIVE', '')} ({Path(__file__).name}): "
              f"p50 {pct(0.5) * 1000:.0f} ms, p95 {pct(0.95) * 1000:.0f} ms, "
              f"p99 {p99 * 1000:.0f} ms, max {times[-1] * 1000:.0f} ms: target p99 within "
              f"{TARGET:g} s {'met' if p99 <= TARGET else 'NOT MET'}")


def test_the_listener_listens_from_a_childs_go(app: App) -> None:
    # Given a master of one child (a stand-in process: the rule is the master's own)
    master = Master(lambda: [app.queue()], WorkerSettings(concurrency=1), Registry())
    mine, theirs = _ctx.Pipe(duplex=True)
    child = _ctx.Process(target=time.sleep, args=(30,), daemon=True)
    child.start()
    try:
        master.children[0] = ChildHandle(0, child, mine)
        assert not master.jobs_running.is_set()
        # When the child is sent to claim: the abort listener blocks from then on, before
        # the child's slot shows a job (so an abort of the job it starts is taken at once,
        # not when the master's loop turns next)
        assert master._fan()
        assert master.jobs_running.is_set()
        master._supervise_running()
        assert master.jobs_running.is_set()
        # and until the child says it is idle again
        theirs.send_bytes(IDLE)
        master._on_message(0)
        master._supervise_running()
        assert not master.jobs_running.is_set()
    finally:
        child.kill()
        child.join(5)
        mine.close()
        theirs.close()


def test_a_bad_abort_grace_is_refused_at_decoration(app: App) -> None:
    for bad in (-1, float("nan"), float("inf"), "5", True):
        with pytest.raises(InvalidArgument, match="abort_grace"):
            app.task(name=f"bad-{bad!r}", abort_grace=bad)(lambda: None)
    assert app.task(name="ok", abort_grace=0)(lambda: None).spec.abort_grace == 0
