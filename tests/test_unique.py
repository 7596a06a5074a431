"""Unique jobs (issue 32, item 2): ``apply_async(unique_key=, unique_for=)`` and
``@task(unique=, unique_for=)``. While a job of a key is pending, delayed or running, another
enqueue of the key writes nothing and its handle is the holder's (verdict "duplicate"); the
key is free once the job ends (done, dead, cancelled) or after ``unique_for``. On both paths
(the scripts, EMQ_NATIVE=off; the module, EMQ_NATIVE=require)."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any

import pytest
import worker_tasks as wt
from workerproc import WorkerProc

from emqtasks import App
from emqtasks.errors import InvalidArgument
from emqtasks.ops.check import check, repair

pytestmark = pytest.mark.timeout(60)


def _rows(app: App) -> list[str]:
    """The ids of the job rows the queue holds."""
    q = app.queue()
    return sorted(q.keys.name_of(k)[4:] for k in q.scan(q.keys.base + "job:*"))


def test_eight_producers_make_one_job_per_key(path_app: App) -> None:
    # Given 8 threads, each trying 200 enqueues over 5 keys at once
    app, keys = path_app, [f"inv:{i}" for i in range(5)]
    seen: dict[str, set[str]] = {k: set() for k in keys}
    verdicts: list[str] = []
    lock, go = threading.Lock(), threading.Barrier(8)

    def produce(n: int) -> None:
        go.wait()
        for i in range(200):
            key = keys[(n + i) % len(keys)]
            h = app.send_task(wt.record, (f"u:{n}:{i}",), unique_key=key, unique_for=600)
            with lock:
                seen[key].add(h.id)
                verdicts.append(h.verdict)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # Then exactly one job per key was written, and every handle of a key is that job's
    assert all(len(ids) == 1 for ids in seen.values()), seen
    assert _rows(app) == sorted(next(iter(ids)) for ids in seen.values())
    assert verdicts.count("enqueued") == 5 and verdicts.count("duplicate") == 1595


def test_a_duplicate_is_the_holders_handle_until_the_holder_ends(path_app: App) -> None:
    # Given a job holding its key
    app = path_app
    first = app.send_task(wt.record, ("u:a",), unique_key="inv:7", unique_for=600)
    # When the same key is sent again, pending, then delayed (a countdown), then running
    again = app.send_task(wt.record, ("u:b",), unique_key="inv:7")
    # Then nothing is written and the handle is the holder's
    assert (first.verdict, again.verdict, again.id) == ("enqueued", "duplicate", first.id)
    assert _rows(app) == [first.id]
    assert app.job(first.id)["unique"] == "inv:7"  # type: ignore[index]
    later = app.send_task(wt.record, ("u:c",), unique_key="inv:8", countdown=60)
    assert app.send_task(wt.record, ("u:d",), unique_key="inv:8").id == later.id
    # And once a worker ran it, the key is free: the next enqueue makes a new job
    with WorkerProc(app.settings.redis_url, app.settings.queue) as w:
        w.wait_ready()
        assert first.get(timeout=20) == "u:a"
        after = app.send_task(wt.record, ("u:e",), unique_key="inv:7")
        assert after.verdict == "enqueued" and after.id != first.id
        assert after.get(timeout=20) == "u:e"
        assert w.stop() == 0


def test_the_key_is_released_when_the_job_is_dead_or_cancelled(path_app: App) -> None:
    app, q = path_app, path_app.queue()
    # Given a job of key k1 that fails for good, and one of k2 cancelled while pending
    a = app.send_task(wt.record, ("u:a",), unique_key="k1")
    [lease] = q.claim(1)
    assert lease.id == a.id
    assert app.send_task(wt.record, ("u:x",), unique_key="k1").id == a.id   # running
    q.retry(lease, "boom", final=True)
    b = app.send_task(wt.record, ("u:b",), unique_key="k2")
    app.cancel(b.id)
    # Then each key is free again
    a2 = app.send_task(wt.record, ("u:a2",), unique_key="k1")
    b2 = app.send_task(wt.record, ("u:b2",), unique_key="k2")
    assert (a2.verdict, b2.verdict) == ("enqueued", "enqueued")
    assert a.id not in (a2.id, b2.id) and b.id != b2.id


def test_a_crashed_holders_key_is_released_with_its_reaped_job(path_app: App) -> None:
    # Given a one-attempt job whose lease lapses (its holder crashed)
    app, q = path_app, path_app.queue()
    spec = app.task(name="t.unique_once", max_attempts=1, lease=0.05)(lambda: None)
    held = spec.apply_async(unique_key="k3")
    buried = 0
    for _ in range(3):        # a lease never seen running is given back (unrun) once first
        assert [lease.id for lease in q.claim(1)] == [held.id]
        time.sleep(0.1)                              # past the 50 ms lease
        # When the master's reaper takes it back, and at last buries it
        returned, buried = q.reap()
        if buried:
            break
        # (given back to its lane: still its key's holder)
        assert spec.apply_async(unique_key="k3").id == held.id
    assert buried == 1 and app.job(held.id)["state"] == "dead"  # type: ignore[index]
    # Then its key is free
    assert spec.apply_async(unique_key="k3").verdict == "enqueued"


def test_the_key_lapses_after_unique_for(path_app: App) -> None:
    app = path_app
    first = app.send_task(wt.record, ("u:a",), unique_key="k4", unique_for=0.2)
    assert app.send_task(wt.record, ("u:b",), unique_key="k4").id == first.id
    time.sleep(0.25)                                 # past the 200 ms hold
    second = app.send_task(wt.record, ("u:c",), unique_key="k4")
    assert second.verdict == "enqueued" and second.id != first.id


def test_a_tasks_unique_function_and_map(path_app: App) -> None:
    app = path_app

    @app.task(name="t.invoice", unique=lambda invoice_id, **_: f"invoice:{invoice_id}",
              unique_for=600)
    def invoice(invoice_id: int, amount: int = 0) -> None:
        pass

    h1 = invoice.delay(7, amount=1)
    h2 = invoice.apply_async((7,), {"amount": 2})
    h3 = invoice.delay(8)
    assert (h1.verdict, h2.verdict, h2.id, h3.verdict) == ("enqueued", "duplicate", h1.id,
                                                           "enqueued")
    mapped = invoice.map([(7,), (9,), (9,)])
    assert [h.verdict for h in mapped] == ["duplicate", "enqueued", "duplicate"]
    assert mapped[0].id == h1.id and mapped[2].id == mapped[1].id
    assert len(_rows(app)) == 3


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, "10", True])
def test_a_bad_unique_for_is_refused_with_nothing_written(path_app: App, bad: Any) -> None:
    app = path_app
    with pytest.raises(InvalidArgument):
        app.send_task(wt.record, ("u:a",), unique_key="k5", unique_for=bad)
    with pytest.raises(InvalidArgument):
        app.task(name="t.bad_unique", unique="k", unique_for=bad)(lambda: None)
    assert _rows(app) == []


def test_unique_for_without_a_key_is_refused(path_app: App) -> None:
    app = path_app
    with pytest.raises(InvalidArgument, match="unique_for"):
        app.send_task(wt.record, ("u:a",), unique_for=60)
    with pytest.raises(InvalidArgument, match="unique_for"):
        app.task(name="t.keyless", unique_for=60)(lambda: None)
    for key in ("", "x" * 513, 7):
        with pytest.raises(InvalidArgument):
            app.send_task(wt.record, ("u:a",), unique_key=key)  # type: ignore[arg-type]
    assert _rows(app) == []


def test_check_repair_frees_a_key_whose_job_is_gone(path_app: App) -> None:
    # Given a key whose job's row was deleted (ttl 0 after it ended, or by hand)
    app, q = path_app, path_app.queue()
    h = app.send_task(wt.record, ("u:a",), unique_key="k6")
    app.client.delete(q.keys.job(h.id))
    app.client.zrem(q.keys.lane("u"), h.id)
    # Then the checker sees it (not a violation: the next enqueue would take it over) and
    # repair deletes it
    assert check(q).stale_uniques == {"k6": h.id}
    assert repair(q).uniques_freed == 1
    assert app.client.exists(q.keys.unique("k6")) == 0
    assert check(q).ok


# -- debounce (issue 32, item 3) ------------------------------------------------------------

def _runs(app: App, tag: str) -> int:
    return int(app.client.hget(f"t:{app.settings.queue}:runs", tag) or 0)


def test_a_burst_runs_once_after_its_last_call_with_its_arguments(path_app: App) -> None:
    # Given a burst of 5 calls of one key, debounced 0.3 s
    app = path_app
    handles = [app.send_task(wt.record, (f"b:{i}",), unique_key="burst", debounce=0.3)
               for i in range(5)]
    # Then every call's handle is the one waiting job's
    assert len({h.id for h in handles}) == 1
    assert [h.verdict for h in handles] == ["enqueued"] + ["duplicate"] * 4
    assert _rows(app) == [handles[0].id]
    # When a worker runs the queue, the job runs once, with the last call's arguments
    with WorkerProc(app.settings.redis_url, app.settings.queue) as w:
        w.wait_ready()
        assert handles[0].get(timeout=20) == "b:4"
        # And a call after it started makes a new job
        again = app.send_task(wt.record, ("b:5",), unique_key="burst", debounce=0.05)
        assert again.verdict == "enqueued" and again.id != handles[0].id
        assert again.get(timeout=20) == "b:5"
        assert w.stop() == 0
    assert [_runs(app, f"b:{i}") for i in range(6)] == [0, 0, 0, 0, 1, 1]


def test_a_burst_is_due_no_later_than_debounce_max_after_its_first_call(
        path_app: App) -> None:
    app, q = path_app, path_app.queue()
    first = app.send_task(wt.record, ("c:0",), unique_key="capped", debounce=5,
                          debounce_max=6)
    start = int(app.client.hget(q.keys.job(first.id), "dfirst"))  # type: ignore[arg-type]
    assert abs(app.client.zscore(q.keys.delayed, first.id) - (start + 5000)) < 5  # type: ignore[operator]
    time.sleep(1.2)                                  # the burst goes on past the cap's edge
    h = app.send_task(wt.record, ("c:1",), unique_key="capped", debounce=5, debounce_max=6)
    assert h.id == first.id
    assert app.client.zscore(q.keys.delayed, first.id) == start + 6000


@pytest.mark.parametrize("kw", [
    {"unique_key": "k", "debounce": 0}, {"unique_key": "k", "debounce": math.nan},
    {"unique_key": "k", "debounce": math.inf}, {"unique_key": "k", "debounce": -1},
    {"debounce": 5}, {"unique_key": "k", "debounce": 5, "debounce_max": 4},
    {"unique_key": "k", "debounce_max": 60},
    {"unique_key": "k", "debounce": 5, "countdown": 1}])
def test_bad_debounce_is_refused_with_nothing_written(path_app: App, kw: Any) -> None:
    with pytest.raises(InvalidArgument):
        path_app.send_task(wt.record, ("d:a",), **kw)
    assert _rows(path_app) == []


def test_the_awaited_twins_take_unique_keys(path_app: App) -> None:
    app = path_app
    t = app.task(name="t.record", group=lambda tag: tag.split(":")[0])(wt.record.spec.fn)

    async def send() -> list[Any]:
        one = await t.aapply_async(("a:x",), unique_key="ak")
        two = await t.aapply_async(("a:y",), unique_key="ak")
        many = await t.amap([("a:z",)])
        return [one.id, two.id, two.verdict, len(many)]

    one, two, verdict, _ = asyncio.run(send())
    assert (two, verdict) == (one, "duplicate")


def test_the_wire_is_unchanged_without_a_unique_key(path_app: App) -> None:
    # A call naming no key sends the arguments of the release before (rolling deploy); one
    # naming a key sends the expiries and tenants ('' each), then the keys
    from emqtasks.store.hot import enqueue_plan
    from emqtasks.store.keys import Unique
    from emqtasks.store.plan import Hot
    from emqtasks.store.queue import NewJob

    nj = NewJob("j1", "t", "{}", "g", 1, 1000, 0, 0, 0, 0)
    keys = path_app.queue().keys
    step = enqueue_plan(keys, [nj], None, None, None, [None]).send(None)
    assert isinstance(step, Hot) and len(step.args) == 1 + 10
    step = enqueue_plan(keys, [nj], None, None, None, [Unique("k", 5)]).send(None)
    assert isinstance(step, Hot) and step.args[11:] == ["", "", "5:k"]
