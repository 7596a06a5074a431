"""Celery's task API on emqtasks' own @task (issue 27, item 2), on real workers: bind=True
and self.request / self.retry, autoretry_for / max_retries / default_retry_delay and the
backoff options, soft_time_limit, rate_limit, ignore_result, acks_late, task_id= / queue= /
link= / link_error= on apply_async, and the Celery options refused by name."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import task_api_tasks as t
from day2 import cleanup, key
from workerproc import WorkerProc

from emqtasks import (
    App,
    InvalidArgument,
    JobHandle,
    MaxRetriesExceededError,
    Retry,
    SoftTimeLimitExceeded,
    TaskFailed,
    errors,
)
from emqtasks import task as task_decorator
from emqtasks.producer.app import pointed_at
from emqtasks.producer.bound import Request
from emqtasks.producer.celery_options import parse_rate


@pytest.fixture(autouse=True)
def _clean(app: App):  # type: ignore[no-untyped-def]
    # the tasks' own App (the default one) sends to the test's server and queue
    with pointed_at(app.settings.redis_url, app.settings.queue):
        yield
    cleanup(app)


def start(app: App, *extra: str, concurrency: int = 2) -> WorkerProc:
    w = WorkerProc(app.settings.redis_url, app.settings.queue, *extra,
                   concurrency=concurrency, modules=("task_api_tasks",))
    w.wait_ready()
    return w


def _starts(app: App, tag: str) -> list[int]:
    return [int(x) for x in app.client.lrange(key(app, f"at:{tag}"), 0, -1)]


def _tries(app: App, tag: str) -> int:
    return int(app.client.hget(key(app, "tries"), tag) or 0)


# -- bind=True: self.request, self.name, self.app, self.retry ------------------------------
def test_a_bound_task_sees_its_request(app: App) -> None:
    with start(app) as w:
        h = t.whoami.apply_async((4,), {"y": 5}, task_id="who-1")
        got = h.get(timeout=20)
        hs = t.async_whoami.delay(7)
        assert hs.get(timeout=20) == [hs.id, [7], "api.async_whoami"], w.output()[-2000:]
        # a bound task as a workflow step gets the parent's result after self
        step = (t.add.s(1, 2) | t.async_whoami.s()).apply_async().get(timeout=20)
        assert step[1:] == [[3], "api.async_whoami"]
    assert got == {"id": "who-1", "retries": 1, "args": [4], "kwargs": {"y": 5},
                   "delivery_info": {"queue": app.settings.queue,
                                     "routing_key": app.settings.queue, "group": "g1"},
                   "name": "api.whoami", "app": True, "called_directly": False}


def test_a_bound_task_called_directly_gets_itself_and_an_empty_request() -> None:
    assert t.async_whoami.request == Request()
    with pytest.raises(InvalidArgument, match="run by a worker"):
        t.whoami(1)      # its first run asks for a retry: only a worker can retry


def test_self_retry_with_countdown_n_times_then_success_with_automatic_retry_off(
        app: App) -> None:
    with start(app) as w:
        h = t.countdown_retry.delay("c", 3)
        assert h.get(timeout=30) == 3, w.output()[-2000:]
    starts = _starts(app, "c")
    assert len(starts) == 4
    assert all(b - a >= 400 for a, b in zip(starts, starts[1:])), starts


def test_max_retries_exceeded_goes_dead_with_the_exception_given_or_max_retries_error(
        app: App) -> None:
    with start(app) as w:
        with_exc, bare = t.exhaust.delay("e", True), t.exhaust.delay("b", False)
        with pytest.raises(TaskFailed) as failed:
            with_exc.get(timeout=20)
        assert "ValueError: boom e" in failed.value.error, w.output()[-2000:]
        assert "max_retries reached" in failed.value.error
        with pytest.raises(TaskFailed, match="MaxRetriesExceededError"):
            bare.get(timeout=20)
        # a retry() that lowers max_retries ends the job early (2 runs, not 6)
        with pytest.raises(TaskFailed, match="MaxRetriesExceededError"):
            t.lowered.delay("l").get(timeout=20)
    assert _tries(app, "e") == 3 and _tries(app, "b") == 3 and _tries(app, "l") == 2


# -- autoretry_for / max_retries / default_retry_delay / retry_backoff -----------------------
def test_autoretry_for_retries_only_those_max_retries_times(app: App) -> None:
    assert t.autoretry.spec.max_attempts == 4 and t.autoretry.spec.retry_delay == 0.05
    with start(app) as w:
        with pytest.raises(TaskFailed, match="KeyError"):
            t.autoretry.delay("k", "key").get(timeout=20)
        with pytest.raises(TaskFailed) as failed:
            t.autoretry.delay("v", "value").get(timeout=20)
        assert "outside retry_for" in failed.value.error
        assert _tries(app, "k") == 4 and _tries(app, "v") == 1, w.output()[-2000:]


def test_retry_backoff_as_celery_spells_it(app: App) -> None:
    # retry_backoff=0.3, no jitter, max 0.6: Celery's 0.3 * 2^retries, capped: .3 .6 .6
    with start(app) as w:
        with pytest.raises(TaskFailed):
            t.backoff.delay("bo").get(timeout=30)
        starts = _starts(app, "bo")
        assert len(starts) == 4, w.output()[-2000:]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    for gap, want in zip(gaps, [300, 600, 600]):
        assert want <= gap < want + 1000, gaps


# -- soft_time_limit -----------------------------------------------------------------------
@pytest.mark.parametrize("extra", [(), ("--async-concurrency", "2")])
def test_a_soft_time_limit_is_raised_in_the_task_which_may_catch_it(
        app: App, extra: tuple[str, ...]) -> None:
    with start(app, *extra) as w:
        began = time.monotonic()
        sync, coro = t.soft.delay("s"), t.soft_async.delay("a")
        assert sync.get(timeout=20) == "caught", w.output()[-3000:]
        assert coro.get(timeout=20) == "caught", w.output()[-3000:]
        assert t.soft_async_alone.delay().get(timeout=20) == "caught alone"
        assert time.monotonic() - began < 5        # not the 8 s sleep, nor the hard limit
        with pytest.raises(TaskFailed, match="SoftTimeLimitExceeded"):
            t.soft_uncaught.delay().get(timeout=20)
        # a job that ends in time is not hit later by its alarm, nor is the next job
        assert [t.quick_soft.delay().get(timeout=20) for _ in range(3)] == ["quick"] * 3
        time.sleep(0.5)
        assert t.add.delay(1, 2).get(timeout=20) == 3


# -- rate_limit ----------------------------------------------------------------------------
def test_rate_limit_is_a_rate_of_the_tasks_own_group_across_workers(app: App) -> None:
    assert t.rated.spec.group == "api.rated" and t.rated.spec.rate == (2, 1.0)
    with start(app, concurrency=2) as w1, start(app, concurrency=2) as w2:
        handles = t.rated.map([(i,) for i in range(6)])
        for h in handles:
            h.get(timeout=30)
        starts = sorted(_starts(app, "rated"))
        assert len(starts) == 6, w1.output()[-2000:] + w2.output()[-2000:]
    # 2 per second over both workers: starts 3 and 4 a second after the first two, ...
    assert starts[2] - starts[0] >= 950 and starts[4] - starts[2] >= 950, starts


@pytest.mark.parametrize("text, rate", [("10/m", (10, 60.0)), ("5/s", (5, 1.0)),
                                        ("100/h", (100, 3600.0)), ("7", (7, 1.0)),
                                        (3, (3, 1.0)), ("0.5/s", (1, 2.0)), (None, None)])
def test_rate_limit_strings(text: Any, rate: Any) -> None:
    assert parse_rate(text) == rate


# -- ignore_result, acks_late ---------------------------------------------------------------
def test_ignore_result_keeps_no_result(app: App) -> None:
    assert t.ignored.spec.result_ttl == 0
    with start(app) as w:
        h = t.ignored.delay(9)
        with pytest.raises(TaskFailed, match="result_ttl=0"):
            h.get(timeout=20)
        assert app.client.lrange(key(app, "ignored"), 0, -1) == ["9"], w.output()[-2000:]
    assert app.job(h.id) is None


# -- apply_async: task_id=, queue=, link=, link_error= ---------------------------------------
def test_apply_async_task_id_queue_and_links(app: App) -> None:
    other = f"{app.settings.queue}-b"
    with start(app) as w, WorkerProc(app.settings.redis_url, other,
                                     modules=("task_api_tasks",)) as wb:
        wb.wait_ready()
        h = t.add.apply_async((1, 2), queue=other, task_id="on-b")
        assert h.id == "on-b" and h.get(timeout=20) == 3
        assert app.job("on-b") is None and app.queue(other).job("on-b")["state"] == "done"
        # link: the callback gets the result; the handle is the task's own job
        linked = t.add.apply_async((2, 3), link=t.record.s(), task_id="linked-1")
        assert linked.id == "linked-1" and linked.get(timeout=20) == 5
        assert linked.workflow.get(timeout=20) == 5, w.output()[-2000:]
        # a list of links: each gets the result
        many = t.add.apply_async((10, 1), link=[t.record.s(), t.record.s()])
        assert many.workflow.get(timeout=20) == [11, 11]
        recorded = [json.loads(x) for x in app.client.lrange(key(app, "record"), 0, -1)]
        assert sorted(recorded) == [5, 11, 11]
        # link_error: runs with the failed job's id when the task goes dead
        bad = t.fail.apply_async((1,), link=t.record.s(), link_error=t.record.s())
        with pytest.raises(TaskFailed, match="fail 1"):
            bad.get(timeout=20)
        lerr = bad.workflow.info()["link_error"]
        assert lerr is not None
        JobHandle(app.queue(), lerr, app=app).get(timeout=20)
        recorded = [json.loads(x) for x in app.client.lrange(key(app, "record"), 0, -1)]
        assert bad.id in recorded
    app.queue(other).purge()


def test_apply_async_refuses_what_a_linked_call_cannot_take(app: App) -> None:
    with pytest.raises(InvalidArgument, match="queue="):
        t.add.apply_async((1, 2), link=t.record.s(), queue="elsewhere")
    with pytest.raises(InvalidArgument, match="not both"):
        t.add.apply_async((1, 2), job_id="a", task_id="b")


# -- options checked at decoration ------------------------------------------------------------
@pytest.mark.parametrize("options, match", [
    ({"max_retries": -1}, "max_retries"),
    ({"max_retries": 2, "max_attempts": 3}, "not both"),
    ({"autoretry_for": (KeyError,), "retry_for": (KeyError,)}, "not both"),
    ({"rate_limit": "ten per minute"}, "rate_limit"),
    ({"rate_limit": "0/s"}, "above 0"),
    ({"rate_limit": "5/m", "group": lambda x: "g"}, "set_group_rate"),
    ({"acks_late": False}, "after its run"),
    ({"ignore_result": True, "result_ttl": 60}, "result_ttl=0"),
    ({"soft_time_limit": 5, "time_limit": 2}, "below time_limit"),
    ({"serializer": "pickle"}, "JSON"),
    ({"typing": False}, "typing="),
    ({"throws": (KeyError,)}, "dont_retry_for"),
])
def test_bad_or_meaningless_options_are_refused_at_decoration(options: dict[str, Any],
                                                               match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        App().task(name="api.refused", **options)(lambda x: x)


def test_celery_options_map_onto_ours() -> None:
    app = App()
    forever = app.task(name="api.forever", max_retries=None)(lambda: None)
    assert forever.spec.max_attempts == 1_000_000
    late = app.task(name="api.late", acks_late=True, max_retries=0)(lambda: None)
    assert late.spec.max_attempts == 1 and late.spec.result_ttl == 86_400
    plain = app.task(name="api.plain")(lambda: None)       # our own defaults unchanged
    assert plain.spec.max_attempts == 3 and plain.spec.policy.retry_for == (Exception,)
    ticking = app.task(name="api.ticking", bind=True, schedule=60)(lambda self: self.name)
    assert "api.ticking" in app.declared_schedules and ticking() == "api.ticking"
    with pytest.raises(InvalidArgument, match="first positional parameter"):
        app.task(name="api.nobind", bind=True)(lambda: None)


def test_the_errors_are_exported() -> None:
    assert errors.SoftTimeLimitExceeded is SoftTimeLimitExceeded
    assert errors.MaxRetriesExceededError is MaxRetriesExceededError
    assert Retry(1.0, exc=ValueError("x")).exc is not None
    assert task_decorator is not None
