"""``expires=`` on apply_async / map / send_task (issue 27): a job not started by its deadline
ends ``expired``, is never run, and ``get()`` raises; one whose deadline is ahead runs as any
other. On both paths (the scripts, EMQ_NATIVE=off; the module, EMQ_NATIVE=require), with a
real worker."""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import worker_tasks as wt
from workerproc import WorkerProc

from emqtasks import App
from emqtasks.errors import InvalidArgument, TaskFailed
from emqtasks.ops.check import check, repair

pytestmark = pytest.mark.timeout(60)


def _runs(app: App, tag: str) -> int:
    return int(app.client.hget(f"t:{app.settings.queue}:runs", tag) or 0)


def _worker(app: App) -> WorkerProc:
    w = WorkerProc(app.settings.redis_url, app.settings.queue)
    w.wait_ready()
    return w


def test_an_expired_job_never_runs_and_get_raises(path_app: App) -> None:
    # Given, in one lane, a job already past its deadline (in seconds, and as a datetime)
    # ahead of jobs whose deadline is far off, or that have none
    app = path_app
    past = datetime.now(timezone.utc) - timedelta(seconds=1)
    ahead = datetime.now(timezone.utc) + timedelta(hours=1)
    gone = [app.send_task(wt.record, ("x:gone0",), expires=0),
            app.send_task(wt.record, ("x:gone1",), expires=past)]
    kept = [app.send_task(wt.record, ("x:kept0",), expires=3600),
            app.send_task(wt.record, ("x:kept1",), expires=ahead),
            app.send_task(wt.record, ("x:kept2",))]
    # When a worker runs the queue
    with _worker(app) as w:
        # Then the others run as usual, and the expired ones end without running
        assert [h.get(timeout=20) for h in kept] == ["x:kept0", "x:kept1", "x:kept2"]
        for h in gone:
            with pytest.raises(TaskFailed, match="expired"):
                h.get(timeout=20)
            assert h.status() == "expired"
        assert w.stop() == 0
    assert [_runs(app, t) for t in ("x:gone0", "x:gone1")] == [0, 0]
    assert all(_runs(app, f"x:kept{i}") == 1 for i in range(3))
    # not dead, nothing to requeue; and `emqtasks check` finds nothing wrong
    assert app.dead_jobs(10) == [] and check(app.queue()).violations == []
    repair(app.queue())                              # --repair leaves an expired row be
    assert app.job(gone[0].id)["state"] == "expired"  # type: ignore[index]
    row = app.job(gone[0].id)
    assert row is not None and row["attempts"] == 0 and row["started"] is None
    assert app.cancel(gone[0].id) == "finished"


def test_a_client_blocked_in_get_wakes_when_the_claim_expires_the_job(path_app: App) -> None:
    # Given a client already blocked in get() on a job past its deadline
    h = path_app.send_task(wt.record, ("w:late",), expires=0)
    seen: list[Any] = []
    blocked = threading.Event()

    def follow() -> None:
        blocked.set()
        try:
            h.get(timeout=30)
        except TaskFailed as exc:
            seen.append(exc)

    t = threading.Thread(target=follow)
    t.start()
    blocked.wait(5)
    # When a worker's claim meets the job
    with _worker(path_app) as w:
        t.join(20)
        # Then the client wakes with the failure, long before its timeout
        assert not t.is_alive() and len(seen) == 1 and "expired" in str(seen[0])
        assert w.stop() == 0
    assert _runs(path_app, "w:late") == 0


def test_map_with_expires(path_app: App) -> None:
    app = path_app
    t = app.task(name="t.record", group=lambda tag: tag.split(":")[0])(wt.record.spec.fn)
    late = t.map([("m:a",), ("m:b",)], expires=0)
    fine = t.map([("m:c",)], expires=60.0)
    with _worker(app) as w:
        assert fine[0].get(timeout=20) == "m:c"
        for h in late:
            with pytest.raises(TaskFailed, match="expired"):
                h.get(timeout=20)
        assert w.stop() == 0
    assert _runs(app, "m:a") == _runs(app, "m:b") == 0


@pytest.mark.parametrize("bad", [True, "60", 5e8, 11 * 365.25 * 86400, float("nan"),
                                 datetime(3000, 1, 1, tzinfo=timezone.utc)])
def test_a_bad_expires_is_refused_with_nothing_written(app: App, bad: Any) -> None:
    with pytest.raises(InvalidArgument, match="expires"):
        app.send_task(wt.record, ("b:x",), expires=bad)
    assert list(app.client.scan_iter(match=app.queue().keys.base + "*")) == []


def test_a_job_without_expires_sends_the_previous_arguments(app: App) -> None:
    # a call without an expiry is the previous release's call (rolling deploys): ten
    # arguments per job, and a row without `expires`, which never expires
    from emqtasks.producer.jobs import build_job
    from emqtasks.store.hot import enqueue_plan
    from emqtasks.store.plan import Hot

    nj = build_job(wt.record.spec, ("r:x",), {}, limit=1 << 20)
    step = enqueue_plan(app.queue().keys, [nj]).send(None)
    assert isinstance(step, Hot) and len(step.args) == 1 + 10
    step = enqueue_plan(app.queue().keys, [nj], [None]).send(None)
    assert isinstance(step, Hot) and len(step.args) == 1 + 10
    step = enqueue_plan(app.queue().keys, [nj], [0]).send(None)
    assert isinstance(step, Hot) and len(step.args) == 1 + 10 + 1


def test_the_awaited_twins_take_expires(path_app: App) -> None:
    t = path_app.task(name="t.record", group=lambda tag: tag.split(":")[0])(wt.record.spec.fn)

    async def send() -> list[str]:
        one = await t.aapply_async(("a:x",), expires=0)
        many = await t.amap([("a:y",)], expires=0)
        kept = await t.aapply_async(("a:z",), expires=600)
        return [one.id, many[0].id, kept.id]

    one, many, kept = asyncio.run(send())
    leases = path_app.queue().claim(3)
    assert [lease.id for lease in leases] == [kept]
    assert path_app.job(one)["state"] == path_app.job(many)["state"] == "expired"  # type: ignore[index]
