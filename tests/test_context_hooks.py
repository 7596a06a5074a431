"""The job's own context (current_job, fence, still_holds), the log fields, and hooks."""

from __future__ import annotations

import json
import logging
import time

import day2_tasks as d2
import pytest
from day2 import cleanup, json_list, key, start, wait_until

from emqtasks import App, InvalidArgument, JobLogFilter, NoCurrentJob, current_job, on
from emqtasks.producer.hooks import Hooks

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _clean(app: App):  # type: ignore[no-untyped-def]
    yield
    cleanup(app)


def test_current_job_outside_a_task_is_a_clear_error() -> None:
    with pytest.raises(NoCurrentJob, match="only available inside a task"):
        current_job()


def test_the_context_inside_a_task_and_across_retries(app: App) -> None:
    with start(app):
        before = time.time()
        h = app.send_task(d2.whoami, ("w", 2))   # fails twice, then succeeds
        final = h.get(timeout=30)
    seen = json_list(app, "ctx:w")
    assert [s["attempts"] for s in seen] == [1, 2, 3]
    assert [s["fence"] for s in seen] == [1, 2, 3]
    for s in seen:
        assert s["id"] == h.id and s["task"] == "d2.whoami" and s["group"] == "ctx"
        assert s["queue"] == app.settings.queue and s["max_attempts"] == 4 and s["holds"]
        assert before - 5 < s["enqueued_at"] < time.time() + 5
    assert final == seen[-1]


def test_the_context_of_an_async_task(app: App) -> None:
    with start(app, "--async-concurrency", "4"):
        handles = [app.send_task(d2.async_whoami, (f"a{i}",)) for i in range(4)]
        results = [h.get(timeout=20) for h in handles]
    assert [r["id"] for r in results] == [h.id for h in handles]   # each its own
    assert all(r["fence"] == 1 and r["holds"] for r in results)


def test_the_fence_grows_when_a_requeue_resets_attempts(app: App) -> None:
    with start(app):
        h = app.send_task(d2.whoami, ("r", 9))   # always fails: dead after 4
        with pytest.raises(Exception):  # noqa: B017 - TaskFailed
            h.get(timeout=30)
        app.requeue_dead(h.id)
        wait_until(lambda: len(json_list(app, "ctx:r")) >= 8, 30, "4 more attempts")
    seen = json_list(app, "ctx:r")
    assert [s["attempts"] for s in seen] == [1, 2, 3, 4, 1, 2, 3, 4]
    assert [s["fence"] for s in seen] == list(range(1, 9))


def test_still_holds_turns_false_once_the_lease_was_reaped_and_reclaimed(app: App) -> None:
    q = app.queue()
    with start(app, concurrency=2) as w:
        h = app.send_task(d2.outlives, ("o",))
        fences = key(app, "fences:o")
        wait_until(lambda: app.client.llen(fences) >= 1, 15, "the first run", w.output)
        # the lease expires (score into the past) and the reaper hands the job on
        returned = 0
        deadline = time.monotonic() + 10
        while not returned and time.monotonic() < deadline:
            secs, micros = app.client.time()
            app.client.zadd(q.keys.active, {h.id: int(secs) * 1000 - 10_000}, xx=True)
            returned = q.reap()[0]
        assert returned == 1
        wait_until(lambda: app.client.llen(fences) >= 2, 15, "the second claim", w.output)
        app.client.rpush(key(app, "go:o"), "1", "1")
        wait_until(lambda: app.client.llen(key(app, "holds:o")) >= 2, 15, "both answers")
        h.get(timeout=15)
    answers = sorted(json.loads(x) for x in app.client.lrange(key(app, "holds:o"), 0, -1))
    assert answers == [[1, False], [2, True]]


def test_log_records_of_a_task_carry_its_job_id(app: App) -> None:
    with start(app):
        h = app.send_task(d2.logs, ("l",))
        assert h.get(timeout=15)[:2] == [h.id, "d2.logs"]
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    assert JobLogFilter().filter(record)
    assert record.emq_job_id == "-"  # type: ignore[attr-defined]


def _hooks(app: App) -> list[dict]:
    return json_list(app, "hooks")


@pytest.mark.parametrize("raising", ["0", "1"])
def test_each_hook_fires_once_per_event_with_the_right_job(app: App, raising: str) -> None:
    env = {"D2_HOOKS": "1", "D2_HOOKS_RAISE": raising}
    with start(app, concurrency=2, env=env) as w:
        wait_until(lambda: sum(e["event"] == "child_started" for e in _hooks(app)) >= 2, 15,
                   "child_started twice", w.output)
        ok = app.send_task(d2.once_fails, ("ok", "ok"))
        again = app.send_task(d2.once_fails, ("again", "retry_then_ok"))
        dead = app.send_task(d2.once_fails, ("dead", "dead"))
        assert ok.get(timeout=20) == "ok" and again.get(timeout=20) == "again"
        with pytest.raises(Exception):  # noqa: B017 - TaskFailed
            dead.get(timeout=20)
        time.sleep(0.3)
        assert w.stop() == 0
        log = w.output()
    events = _hooks(app)
    by = {(e["event"], e["id"]): 0 for e in events}
    for e in events:
        by[(e["event"], e["id"])] += 1
    assert sum(e["event"] == "child_started" for e in events) == 2
    assert sum(e["event"] == "worker_stopping" for e in events) == 1
    assert by[("task_started", ok.id)] == 1 and by[("task_succeeded", ok.id)] == 1
    assert by[("task_started", again.id)] == 2 and by[("task_retried", again.id)] == 1
    assert by[("task_succeeded", again.id)] == 1
    assert by[("task_started", dead.id)] == 2 and by[("task_retried", dead.id)] == 1
    assert by[("task_dead", dead.id)] == 1 and ("task_succeeded", dead.id) not in by
    assert {e["exc"] for e in events if e["event"] in ("task_retried", "task_dead")} == \
        {"ValueError"}
    if raising == "1":
        assert "raises on purpose" in log and "carrying on" in log
        assert ", 0 died" in log


def test_hooks_are_checked_at_registration(app: App) -> None:
    with pytest.raises(InvalidArgument, match="unknown hook event"):
        app.on("task_exploded")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="unknown hook event"):
        on("nope")  # type: ignore[arg-type]
    fired: list[str] = []
    h = Hooks()
    h.add("task_started", lambda job: fired.append(job))
    h.add("task_started", lambda job: 1 / 0)
    h.fire("task_started", "j")   # the raising one is logged, not raised
    assert fired == ["j"]
