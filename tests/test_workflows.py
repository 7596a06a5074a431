"""Workflows on real workers and a real server: chains pass results, chords collect them,
the hand-over survives killed children and masters, a dead step stops its workflow, bad
input is refused with nothing written, the checker knows workflow structures."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import workflow_tasks as wt
from click.testing import CliRunner
from helpers import count_keys
from workerproc import WorkerProc

from emqtasks import (
    AckVerdict,
    App,
    EmptyGroup,
    LaneFull,
    TaskFailed,
    UnknownTask,
    WorkflowTooLarge,
    chain,
    chord,
    group,
)
from emqtasks.cli import main
from emqtasks.observe.lanes import lane as lane_view
from emqtasks.ops.check import check, repair
from emqtasks.producer.task import JobHandle
from emqtasks.verdicts import CancelVerdict

pytestmark = pytest.mark.timeout(120)


def start(app: App, concurrency: int = 2) -> WorkerProc:
    w = WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=concurrency,
                   tick=0.1, modules=("workflow_tasks",))
    try:
        w.wait_ready()
    except BaseException:
        w.__exit__(None, None, None)
        raise
    return w


class Rec:
    """What the tasks noted in Redis (tests/tasks/workflow_tasks.py)."""

    def __init__(self, app: App) -> None:
        self.r = app.client
        self.prefix = f"wt:{app.settings.queue}:"

    def key(self, name: str) -> str:
        return self.prefix + name

    def runs(self) -> dict[str, int]:
        """Runs per job id (a run counts once the task body finished)."""
        return {k: int(v) for k, v in self.r.hgetall(self.key("runs")).items()}

    def task_runs(self, name: str) -> int:
        return int(self.r.hget(self.key("tasks"), name) or 0)

    def cleanup(self) -> None:
        keys = list(self.r.scan_iter(self.prefix + "*"))
        if keys:
            self.r.delete(*keys)


@pytest.fixture
def rec(app: App) -> Iterator[Rec]:
    r = Rec(app)
    yield r
    r.cleanup()


def test_chain_passes_results_si_ignores_and_group_collects(app: App, rec: Rec) -> None:
    with start(app) as w:
        # Given a chain of 3: each step gets the one before's result as its first argument
        h = chain(wt.add.s(1, 2), wt.add.s(10), wt.add.s(100)).apply_async(app=app)
        # and a chain whose middle step is immutable, and a group, and a `|` chain
        hi = chain(wt.add.s(1, 2), wt.add.si(5, 5), wt.add.s(1)).apply_async(app=app)
        hg = group([wt.add.s(i, i) for i in range(5)]).apply_async(app=app)
        hp = (wt.add.s(1, 1) | group([wt.add.s(i) for i in range(3)]) | wt.tsum.s()) \
            .apply_async(app=app)
        # Then
        assert h.get(timeout=30) == 113
        assert hi.get(timeout=30) == 11
        assert hg.get(timeout=30) == [0, 2, 4, 6, 8]
        assert hp.get(timeout=30) == 2 * 3 + 3
        assert h.status() == "done"
        steps = app.workflow(h.id).steps()
        assert [s["state"] for s in steps] == ["done"] * 3
        assert [s["attempts"] for s in steps] == [1, 1, 1]
        assert all(n == 1 for n in rec.runs().values()), rec.runs()
        assert w.stop() == 0
    assert check(app.queue()).ok


def test_chord_of_200_with_20_retried_members_calls_back_once_in_order(
        app: App, rec: Rec) -> None:
    members = [wt.flaky_once.s(i, fail=i % 10 == 0) for i in range(200)]
    h = chord(members, wt.tsum.s()).apply_async(app=app)
    with start(app, concurrency=3) as w:
        assert h.get(timeout=90) == sum(range(200))
        # the callback ran exactly once, with the 200 results in member order
        assert rec.task_runs("tsum") == 1
        assert [json.loads(x) for x in app.client.lrange(rec.key("cbargs"), 0, -1)] == \
            [list(range(200))]
        # the 20 that failed once were retried: attempts 2, one completion each
        retried = [s for s in app.workflow(h.id).steps() if s["attempts"] == 2]
        assert len(retried) == 20
        assert all(n == 1 for n in rec.runs().values())
        assert w.stop() == 0
    assert check(app.queue()).ok


def test_child_killed_mid_chain_step_every_workflow_completes(app: App, rec: Rec) -> None:
    # Given chains whose middle step is slow on its first run in the first chain; one child
    # is SIGKILLed in it
    hs = [chain(wt.add.s(i), wt.slow_first.s(f"c{i}", 30.0 if i == 0 else 0.0),
                wt.add.s(100)).apply_async(app=app) for i in range(3)]
    with start(app, concurrency=3) as w:
        started = app.client.blpop([rec.key("started:c0")], timeout=30)
        assert started is not None
        victim = int(started[1])
        assert victim in w.children()
        os.kill(victim, signal.SIGKILL)
        # Then every chain completes, its next step released once
        assert [h.get(timeout=60) for h in hs] == [i + 1 + 100 for i in range(3)]
        runs = rec.runs()
        for h in hs:
            steps = app.workflow(h.id).steps()
            assert [s["state"] for s in steps] == ["done"] * 3
            assert all(runs[s["id"]] == 1 for s in steps), (steps, runs)
        assert int(app.client.hget(rec.key("starts"), "c0")) >= 2
        assert w.stop() == 0
    assert check(app.queue()).ok


def test_master_killed_right_after_a_member_ack_chord_completes_once(
        app: App, rec: Rec) -> None:
    # Given chords in flight; the master is SIGKILLed the moment one member is acked
    hs = [chord([wt.flaky_once.s(i).set(job_id=f"k{c}m{i}") for i in range(10)],
                wt.tsum.s()).apply_async(app=app) for c in range(4)]
    w = start(app, concurrency=2)
    try:
        JobHandle(app.queue(), "k0m3").get(timeout=30)
        w.kill()
    finally:
        w.__exit__(None, None, None)
    # Then a new master finishes every workflow, each callback exactly once
    with start(app, concurrency=2) as w2:
        assert [h.get(timeout=60) for h in hs] == [45] * 4
        assert rec.task_runs("tsum") == 4
        assert [json.loads(x) for x in app.client.lrange(rec.key("cbargs"), 0, -1)] == \
            [list(range(10))] * 4
        for h in hs:
            assert all(s["state"] == "done" for s in app.workflow(h.id).steps())
        assert w2.stop() == 0
    assert check(app.queue()).ok


def test_dead_member_stops_the_chord_and_link_error_runs_once(app: App, rec: Rec) -> None:
    h = chord([wt.add.s(1), wt.boom.s(2).set(job_id="the-boom"), wt.add.s(3)], wt.tsum.s()) \
        .apply_async(app=app, link_error=wt.on_error.s())
    with start(app) as w:
        with pytest.raises(TaskFailed, match="the-boom") as info:
            h.get(timeout=30)
        assert info.value.job_id == "the-boom" and "wf.boom" in str(info.value.error)
        assert app.client.blpop([rec.key("errors")], timeout=30)[1] == "the-boom"
        assert h.status() == "failed"
        states = {s["task"]: s["state"] for s in app.workflow(h.id).steps()}
        assert states["wf.tsum"] == "cancelled" and states["wf.boom"] == "dead"
        assert w.stop() == 0
    assert rec.task_runs("tsum") == 0 and rec.task_runs("on_error") == 1
    assert app.client.llen(rec.key("errors")) == 0


def test_cancel_mid_chain_later_steps_never_start(app: App, rec: Rec) -> None:
    h = chain(wt.gate.s(1, "g").set(job_id="gate-step"), wt.add.s(1), wt.add.s(2)) \
        .apply_async(app=app)
    with start(app) as w:
        assert app.client.blpop([rec.key("at:g")], timeout=30) is not None
        assert h.cancel() == 2                   # the two steps not yet started
        app.client.rpush(rec.key("open:g"), "1")
        assert JobHandle(app.queue(), "gate-step").get(timeout=30) == 1
        with pytest.raises(TaskFailed, match="cancelled"):
            h.get(timeout=10)
        assert [s["state"] for s in h.steps()] == ["done", "cancelled", "cancelled"]
        assert h.status() == "cancelled"
        assert w.stop() == 0
    assert rec.task_runs("add") == 0


def test_cancelling_one_step_cancels_its_workflow(app: App) -> None:
    # Given a chain and a chord enqueued with no worker: their first steps wait in lanes
    line = chain(wt.add.s(1), wt.add.s(2), wt.add.s(3)).apply_async(app=app)
    fan = chord([wt.add.s(i) for i in range(3)], wt.tsum.s()).apply_async(app=app)
    first, second = (s["id"] for s in line.steps()[:2])
    member = fan.steps()[1]["id"]
    # When a user cancels one step of each by its job id (as Celery's revoke)
    assert app.cancel(member) is CancelVerdict.CANCELLED
    assert app.cancel(second) is CancelVerdict.CANCELLED      # a waiting step
    # Then each workflow is cancelled with every step that had not started: nothing is
    # left waiting for a parent that will never hand over, and get() answers at once
    for h in (line, fan):
        assert h.status() == "cancelled"
        assert {s["state"] for s in h.steps()} == {"cancelled"}
        with pytest.raises(TaskFailed, match="cancelled"):
            h.get(timeout=5)
    assert app.job(first)["state"] == "cancelled"
    assert app.stats()["pending"] == 0 and app.stats()["ring"] == 0
    # But cancelling a workflow's link_error step strands nothing: the workflow runs on
    kept = chain(wt.add.s(1), wt.add.s(2)).apply_async(
        app=app, link_error=wt.on_error.s().set(job_id="le-kept"))
    assert app.cancel("le-kept") is CancelVerdict.CANCELLED
    assert kept.status() == "running"
    assert [s["state"] for s in kept.steps()] == ["pending", "waiting"]
    assert check(app.queue()).ok


def test_a_workflow_is_held_to_its_lanes_caps_whole_and_not_counted_as_enqueued(
        app: App) -> None:
    """Steps' rows have the same writer as a producer's job (lua/lib/jobrow.lua new_job),
    with the differences lua/workflow.lua gives: every ready step's cap is checked before
    the first write (the lane's waiting jobs plus the workflow's own ready steps), and the
    history's `enqueued` counts none of them."""
    # Given a lane capped at 2 holding one job
    app.set_group_max_size("capped", 2)
    app.send_task(wt.add, (0,), group="capped")
    # When a group of two steps into it is sent: it does not fit, and nothing is written
    with pytest.raises(LaneFull):
        group([wt.add.s(1).set(group="capped"), wt.add.s(2).set(group="capped")]) \
            .apply_async(app=app)
    assert app.lane("capped")["pending"] == 1
    # Then a chain (one ready step) fits, its waiting step counting nothing against the cap
    chain(wt.add.s(1).set(group="capped"), wt.add.s(2).set(group="capped")) \
        .apply_async(app=app)
    assert app.lane("capped")["pending"] == 2
    # And the minute's history counts only the producer's job as enqueued
    assert app.history(minutes=1)["groups"]["capped"]["enqueued"] == 1


def test_bad_workflows_are_refused_with_nothing_written(app: App) -> None:
    q = app.queue()
    with pytest.raises(EmptyGroup):
        chord([], wt.tsum.s()).apply_async(app=app)
    with pytest.raises(UnknownTask):
        chain(wt.add.s(1), app.signature("no.such.task")).apply_async(app=app)
    with pytest.raises(WorkflowTooLarge):      # 20 results of 100 kB into a 1 MB payload
        chord([wt.add.s(i).set(result_bytes=100_000) for i in range(20)], wt.tsum.s()) \
            .apply_async(app=app)
    small = App(redis_url=app.settings.redis_url, queue=app.settings.queue,
                max_payload_bytes=50_000)
    with pytest.raises(WorkflowTooLarge):      # the default 64 bytes a result, 1,000 of them
        chord([wt.add.s(i) for i in range(1000)], wt.tsum.s()).apply_async(app=small)
    with pytest.raises(EmptyGroup):            # nesting is free, an empty group is not
        chain(group([wt.add.s(1)]), group([chain(wt.add.s(2)), wt.add.s(3) | group()])) \
            .apply_async(app=app)
    assert count_keys(q) == 0
    # a step id that exists: the whole workflow is refused, the existing row untouched
    app.send_task(wt.add, (1,), job_id="taken")
    before = count_keys(q)
    with pytest.raises(Exception, match="taken"):
        chain(wt.add.s(1), wt.add.s(2).set(job_id="taken")).apply_async(app=app)
    assert count_keys(q) == before
    small.close()


def test_workflow_command_and_view(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    h = chain(wt.add.s(1).set(job_id="v1"), wt.add.s(2).set(job_id="v2")) \
        .apply_async(app=app, workflow_id="wf-view")
    assert h.id == "wf-view"
    view = app.workflow("wf-view")
    assert [(s["id"], s["state"]) for s in view.steps()] == [("v1", "pending"),
                                                            ("v2", "waiting")]
    monkeypatch.setenv("EMQ_REDIS_URL", app.settings.redis_url)
    out = CliRunner().invoke(main, ["workflow", "wf-view", "-Q", app.settings.queue])
    assert out.exit_code == 0, out.output
    assert "v2" in out.output and "waiting" in out.output and "running" in out.output
    bad = CliRunner().invoke(main, ["workflow", "bad id", "-Q", app.settings.queue])
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1
    missing = CliRunner().invoke(main, ["workflow", "nope", "-Q", app.settings.queue])
    assert missing.exit_code == 1
    # the same id again: a duplicate, nothing written
    assert chain(wt.add.s(1)).apply_async(app=app, workflow_id="wf-view").duplicate


def test_checker_reports_a_step_whose_parent_is_gone_and_repair_fails_it(app: App) -> None:
    q = app.queue()
    h = chain(wt.add.s(1).set(job_id="p1"), wt.add.s(2).set(job_id="c1")) \
        .apply_async(app=app, link_error=wt.on_error.s().set(job_id="le"))
    assert check(q).ok
    # Given the parent's row is lost (with it the only way the child could be released)
    q.client.zrem(q.keys.lane("default"), "p1")
    q.client.delete(q.keys.job("p1"))
    report = check(q)
    assert any("step c1 waits for parent p1, which is gone" in v for v in report.violations)
    # When repaired (by the command): the workflow fails at the lost parent, said in its
    # count, and the link_error step is released
    out = CliRunner().invoke(main, ["check", "--repair", "-Q", app.settings.queue,
                                    "--redis-url", app.settings.redis_url])
    assert "1 workflows failed at a lost step" in out.output, out.output
    assert repair(q).workflows_failed == 0        # once: a second repair finds nothing
    assert check(q).ok, check(q).violations
    assert q.status("c1") == "cancelled" and q.status("le") == "pending"
    assert h.status() == "failed"
    with pytest.raises(TaskFailed, match="p1"):
        h.get(timeout=1)


def test_chord_members_are_ordinary_jobs_in_their_lanes(app: App) -> None:
    """A tenant's big chord does not jump the ring: its members wait in its own lane and
    another tenant's jobs are claimed turn about."""
    q = app.queue()
    chord([wt.add.s(i).set(group="big") for i in range(300)], wt.tsum.s().set(group="big")) \
        .apply_async(app=app)
    app.send_task(wt.add, (1,), group="small")
    app.send_task(wt.add, (2,), group="small")
    claimed = [lease.group for lease in (q.claim(1)[0] for _ in range(4))]
    assert claimed.count("small") == 2 and claimed.count("big") == 2, claimed
    assert lane_view(q, "big")["pending"] == 298


@pytest.mark.timeout(300)
def test_chord_of_10000_members_calls_back_once(app: App) -> None:
    """10,000 no-op members acked in process (their order shuffled): one callback release,
    with every result in member order. Not timed: bench --workflows reports the times."""
    import random

    q = app.queue()
    h = chord([wt.add.s(i) for i in range(10_000)], wt.tsum.s()).apply_async(app=app)
    leases = []
    while True:
        got = q.claim(500)
        if not got:
            break
        leases += got
    assert len(leases) == 10_000
    random.Random(16).shuffle(leases)
    for lease in leases:
        result = json.dumps(json.loads(lease.payload)["a"][0])
        assert q.ack(lease, result).verdict == AckVerdict.DONE
    (callback,) = q.claim(10)
    assert callback.task == "wf.tsum" and not q.claim(10)
    assert json.loads(callback.payload)["a"][0] == list(range(10_000))
    q.ack(callback, json.dumps(sum(range(10_000))))
    assert h.get(timeout=5) == sum(range(10_000))
    assert check(q).ok


def test_a_signature_alone_is_a_workflow_of_one_step(app: App) -> None:
    """sig.delay(x) puts x in front of the signature's own arguments (as a parent's result
    would be); .si ignores it; the handle follows the one step."""
    q = app.queue()
    h = wt.add.s(10).apply_async((5,), app=app)
    (lease,) = q.claim(1)
    assert json.loads(lease.payload)["a"] == [5, 10]
    q.ack(lease, "15")
    assert h.get(timeout=5) == 15 and h.status() == "done"
    wt.add.si(1, 2).apply_async((99,), app=app)
    (lease,) = q.claim(1)
    assert json.loads(lease.payload)["a"] == [1, 2]


def test_a_step_whose_last_lease_expires_fails_its_workflow(app: App) -> None:
    """The reap's dead path fails the workflow as the retry's does: the next step is
    cancelled and the link_error step released, with the dead step's id."""
    from helpers import expire_now

    q = app.queue()
    h = chain(wt.boom.s(1).set(job_id="lost"), wt.add.s(1).set(job_id="after")) \
        .apply_async(app=app, link_error=wt.on_error.s().set(job_id="errback"))
    assert h.status() == "running"
    for _ in range(2):                   # boom: max_attempts 2, both leases expire
        (lease,) = q.claim(1)
        q.extend([lease])                # it ran (its renewal marked it): the expiry counts
        expire_now(q, lease.id)
        q.reap()
        q.promote()
    assert q.status("lost") == "dead" and q.status("after") == "cancelled"
    (errback,) = q.claim(1)
    assert errback.id == "errback" and json.loads(errback.payload)["a"] == ["lost"]
    assert h.status() == "failed"
    with pytest.raises(TaskFailed, match="lost"):
        h.get(timeout=1)


def test_workflow_command_json_and_cancel(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    chain(wt.add.s(1).set(job_id="j1"), wt.add.s(2).set(job_id="j2")) \
        .apply_async(app=app, workflow_id="wf-cli")
    monkeypatch.setenv("EMQ_REDIS_URL", app.settings.redis_url)
    out = CliRunner().invoke(main, ["workflow", "wf-cli", "-Q", app.settings.queue, "--json",
                                    "--cancel"])
    assert out.exit_code == 0, out.output
    view = json.loads(out.output)
    assert view["status"] == "cancelled"
    assert [(s["id"], s["state"]) for s in view["steps"]] == [("j1", "cancelled"),
                                                               ("j2", "cancelled")]
    assert app.queue().claim(5) == []


def test_a_one_member_group_or_chord_header_passes_a_one_element_list(app: App) -> None:
    """A group of one is a group with n=1 (issue 27): its callback gets [r0], as with two
    members it gets [r0, r1], and the group's own result is a one-element list."""
    q = app.queue()

    def run_all() -> list[Any]:
        """Ack every step in process with the sum of its arguments as its result (a
        callback's: of the list it got); returns the callbacks' first arguments."""
        got = []
        while leases := q.claim(10):
            for lease in leases:
                a = json.loads(lease.payload)["a"]
                if lease.task == "wf.tsum":
                    got.append(a[0])
                    a = a[0] if isinstance(a[0], list) else a
                out = sum(a)
                assert q.ack(lease, json.dumps(out)).verdict == AckVerdict.DONE
        return got

    hc = chord([wt.add.s(2, 5)], wt.tsum.s()).apply_async(app=app)
    assert run_all() == [[7]] and hc.get(timeout=5) == 7
    hg = (group([wt.add.s(2, 5)]) | wt.tsum.s()).apply_async(app=app)
    assert run_all() == [[7]] and hg.get(timeout=5) == 7
    hm = (wt.add.s(1, 1) | group([wt.add.s(5)]) | wt.tsum.s()).apply_async(app=app)
    assert run_all() == [[7]] and hm.get(timeout=5) == 7
    h1 = group([wt.add.s(2, 5)]).apply_async(app=app)
    assert run_all() == [] and h1.get(timeout=5) == [7]
    assert check(q).ok
