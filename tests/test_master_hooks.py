"""Hooks of the jobs a master settles: a child that died (WorkerLost), a job killed at its
time limit (TimeLimitExceeded). They fire once per attempt, in the master, with the job's
context (tests/tasks/day2_tasks.py records every hook call in Redis)."""

from __future__ import annotations

from typing import Any

import day2_tasks as d2
import pytest
from day2 import cleanup, json_list, start, wait_until

from emqtasks import App
from emqtasks.errors import WorkerLost
from emqtasks.producer.hooks import Hooks
from emqtasks.verdicts import RetryVerdict
from emqtasks.worker import settled

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _clean(app: App):  # type: ignore[no-untyped-def]
    yield
    cleanup(app)


def _failures(app: App, job_id: str) -> list[dict[str, Any]]:
    return [e for e in json_list(app, "hooks")
            if e["id"] == job_id and e["event"] in ("task_retried", "task_dead")]


def _run_to_dead(app: App, task: Any, tag: str, raising: str) -> tuple[str, list[dict[str, Any]],
                                                                         int, str]:
    env = {"D2_HOOKS": "1", "D2_HOOKS_RAISE": raising}
    with start(app, concurrency=1, env=env) as w:
        h = app.send_task(task, (tag,))
        with pytest.raises(Exception, match="failed"):  # TaskFailed
            h.get(timeout=20)
        wait_until(lambda: len(_failures(app, h.id)) >= 2, 10, "both hooks", w.output)
        assert w.stop() == 0
        return h.id, _failures(app, h.id), w.pid, w.output()


@pytest.mark.parametrize("raising", ["0", "1"])
def test_a_child_killed_mid_job_fires_retried_then_dead_with_worker_lost(
        app: App, raising: str) -> None:
    job_id, fired, master, log = _run_to_dead(app, d2.kills_its_child, "lost", raising)
    assert [e["event"] for e in fired] == ["task_retried", "task_dead"]   # once per attempt
    assert [e["attempts"] for e in fired] == [1, 2] and [e["fence"] for e in fired] == [1, 2]
    for e in fired:
        assert e["exc"] == "WorkerLost" and "signal 9" in e["msg"] and "died" in e["msg"]
        assert e["pid"] == master                       # in the master, not a child
        assert e["task"] == "d2.kills_its_child" and e["group"] == "lost"
        assert e["current"] == job_id                   # current_job() works in the hook
    assert "WorkerLost" in (app.job(job_id) or {})["error"]
    if raising == "1":   # a hook that raises is logged; the master went on settling
        assert "raises on purpose" in log and "carrying on" in log


def test_a_job_killed_at_its_time_limit_fires_the_hooks_with_time_limit_exceeded(
        app: App) -> None:
    job_id, fired, master, _ = _run_to_dead(app, d2.ignores_its_limit, "slow", "0")
    assert [e["event"] for e in fired] == ["task_retried", "task_dead"]
    for e in fired:
        assert e["exc"] == "TimeLimitExceeded" and e["pid"] == master
        assert e["msg"] == "ran past its time limit of 0.2s"
        assert e["task"] == "d2.ignores_its_limit" and e["group"] == "limited"
    assert (app.job(job_id) or {})["error"].startswith("TimeLimitExceeded: ran past")


def test_the_master_fires_only_for_a_failure_it_wrote(app: App) -> None:
    """A stale verdict (the child wrote the failure before it died, and fired the hook) fires
    nothing; a written one fires its hook, an async hook run to its end, with the row's
    context."""
    q = app.queue()
    app.send_task(d2.once_fails, ("x", "dead"))
    lease = q.claim(1)[0]
    seen: list[tuple[str, str, str, int, str]] = []

    async def retried(job: Any) -> None:
        seen.append(("retried", job.task, job.group, job.fence, type(job.exception).__name__))

    hooks = Hooks()
    hooks.add("task_retried", retried)
    hooks.add("task_dead", lambda job: seen.append(("dead", job.task, "", 0, "")))
    slot = lease._replace(task="", payload="", group="", fence=0)   # what a slot knows
    exc = WorkerLost("child pid 1 died (signal 9) while running the job")
    settled.fire(hooks, RetryVerdict.STALE, q, slot, exc, lambda fn, *a: fn(*a))
    assert seen == []
    settled.fire(hooks, RetryVerdict.RETRIED, q, slot, exc, lambda fn, *a: fn(*a))
    assert seen == [("retried", "d2.once_fails", "hooks", 1, "WorkerLost")]
