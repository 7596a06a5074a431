"""Celery's user-facing scenarios (issue 27, item 9) as our own tests, on one real worker
shared by the module: canvas (chains passing results, chains of groups, chords fed by a
group, failing members and link_error, an errback on a chord's body, nested chords, .si,
Celery's call forms, apply_async(args=..., countdown=...)), the retry API (self.retry with
a countdown, max_retries exceeded, autoretry_for with retry_backoff), results
(AsyncResult.get with a timeout, the task's own exception, children / parent), revoke and
expires, a soft time limit caught by the task, link= / link_error=, ignore_result and
task_id=. Each asserts the outcome Celery gives (or what the README says differs)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import celery_scenario_tasks as t
import pytest
from workerproc import WorkerProc

from emqtasks import (
    App,
    AsyncResult,
    MaxRetriesExceededError,
    ResultTimeout,
    TaskFailed,
    WorkflowError,
    chain,
    chord,
    group,
    states,
)
from emqtasks.producer.app import pointed_at
from emqtasks.verdicts import CancelVerdict

pytestmark = pytest.mark.timeout(30)

#: the longest a scenario waits for a result (each takes well under 3 s)
WAIT = 10


@pytest.fixture(scope="module")
def app(redis_url: str) -> Iterator[App]:
    """One queue and one worker for the whole module; the tasks' own App (the default)
    sends to it too."""
    queue = f"t-{uuid.uuid4().hex[:12]}"
    application = App(redis_url=redis_url, queue=queue)
    with pointed_at(redis_url, queue):
        worker = WorkerProc(redis_url, queue, concurrency=3, tick=0.1,
                            modules=("celery_scenario_tasks",))
        with worker:
            worker.wait_ready()
            yield application
            assert worker.stop() == 0, worker.output()[-3000:]
    for k in application.client.scan_iter(match=f"cs:{queue}:*"):
        application.client.delete(k)
    application.purge()
    application.close()


def _stamps(app: App, tag: str) -> list[int]:
    return [int(x) for x in app.client.lrange(t.key(f"at:{tag}", app.settings.queue), 0, -1)]


def _ran(app: App, tag: str) -> list[str]:
    return list(app.client.lrange(t.key(f"ran:{tag}", app.settings.queue), 0, -1))


def _recorded(app: App) -> list[Any]:
    """What record (a link / link_error callback) was given and nobody took yet."""
    return [json.loads(x) for x in app.client.lrange(t.key("record", app.settings.queue), 0, -1)]


def _next_record(app: App) -> Any:
    got = app.client.blpop([t.key("record", app.settings.queue)], timeout=WAIT)
    assert got is not None, "the callback did not run"
    return json.loads(got[1])


def _gaps(stamps: list[int]) -> list[int]:
    return [b - a for a, b in zip(stamps, stamps[1:])]


# -- canvas ---------------------------------------------------------------------------------
def test_a_chain_passes_each_result_along(app: App) -> None:
    # Celery: (add.s(2, 2) | add.s(4) | add.s(8))().get() == 16
    assert (t.add.s(2, 2) | t.add.s(4) | t.add.s(8)).apply_async().get(timeout=WAIT) == 16


def test_partial_arguments_come_after_the_parents_result(app: App) -> None:
    # sub.s(3) receives the parent's result first: sub(10, 3)
    assert (t.add.s(4, 6) | t.sub.s(3)).apply_async().get(timeout=WAIT) == 7


def test_a_chain_of_groups(app: App) -> None:
    # each member of the second group receives the first group's list
    canvas = t.add.s(1, 1) | group(t.add.s(10), t.add.s(20)) | group(t.tsum.s(), t.ident.s())
    assert canvas.apply_async().get(timeout=WAIT) == [34, [12, 22]]


def test_a_group_in_a_chain_feeds_a_chord(app: App) -> None:
    # a group followed by a step in a chain is a chord onto it, as Celery upgrades it
    implicit = t.add.s(1, 1) | group(t.add.s(1), t.add.s(2)) | t.tsum.s()
    explicit = t.add.s(1, 1) | chord([t.add.s(1), t.add.s(2)], t.tsum.s())
    assert implicit.apply_async().get(timeout=WAIT) == 3 + 4
    assert explicit.apply_async().get(timeout=WAIT) == 3 + 4


def test_a_group_piped_into_a_signature_is_a_chord(app: App) -> None:
    h = (group(t.add.s(i, i) for i in range(4)) | t.tsum.s()).apply_async()
    assert h.get(timeout=WAIT) == 0 + 2 + 4 + 6
    *members, callback = (AsyncResult(s["id"], app) for s in h.steps())
    assert callback.parents == members and all(m.children == [callback] for m in members)


def test_a_one_member_chord_hands_its_callback_a_list(app: App) -> None:
    # the bug issue 27 found: chord([add.s(2, 5)], ident.s()) gave 7, Celery gives [7]
    assert chord([t.add.s(2, 5)], t.ident.s()).apply_async().get(timeout=WAIT) == [7]
    assert (group([t.add.s(2, 5)]) | t.ident.s()).apply_async().get(timeout=WAIT) == [7]


def test_a_group_of_chains(app: App) -> None:
    canvas = group(t.add.s(1, 1) | t.add.s(1), t.add.s(2, 2) | t.add.s(2), t.add.s(3, 3))
    assert canvas.apply_async().get(timeout=WAIT) == [3, 6, 6]


def test_nested_chords(app: App) -> None:
    canvas = chord([chord([t.add.s(1, 1), t.add.s(2, 2)], t.tsum.s()),
                    chord([t.add.s(3, 3)], t.tsum.s()),
                    t.add.s(4, 4)], t.tsum.s())
    assert canvas.apply_async().get(timeout=WAIT) == 6 + 6 + 8


def test_immutable_signatures_ignore_the_parents_result(app: App) -> None:
    assert (t.add.s(1, 2) | t.add.si(5, 5) | t.add.s(1)).apply_async().get(timeout=WAIT) == 11
    # a chord's body as .si: it runs after the header, with its own arguments only
    assert chord([t.add.s(1, 1), t.add.s(2, 2)], t.add.si(7, 7)).apply_async().get(
        timeout=WAIT) == 14


def test_chain_apply_async_args_go_to_the_first_step(app: App) -> None:
    # Celery prepends them to the first step's partial arguments: sub(5, 1), then + 10
    h = (t.sub.s(1) | t.add.s(10)).apply_async(args=(5,))
    assert h.get(timeout=WAIT) == 14
    assert chain(t.add.s(), t.add.s(100)).apply_async((1, 2)).get(timeout=WAIT) == 103


def test_a_canvas_apply_async_countdown_delays_its_first_steps(app: App) -> None:
    # Celery: chain(...).apply_async(countdown=N) / group(...).apply_async(countdown=N)
    began = time.monotonic()
    h = (t.add.s(1, 1) | t.add.s(1)).apply_async(countdown=0.5)
    g = group(t.add.s(1), t.add.si(2, 2)).apply_async((10,), countdown=0.5)
    assert h.get(timeout=WAIT) == 3 and g.get(timeout=WAIT) == [11, 4]
    assert time.monotonic() - began >= 0.5


def test_calling_a_chain_or_a_group_sends_it(app: App) -> None:
    # Celery's call forms: chain(...)(), (a | b)(args), group(...)(); chord(header)(body)
    assert chain(t.add.s(4, 4), t.add.s(8))().get(timeout=WAIT) == 16
    assert (t.sub.s(1) | t.add.s(10))(5).get(timeout=WAIT) == 14
    assert group(t.add.s(1), t.add.s(2))(10).get(timeout=WAIT) == [11, 12]
    assert chord([t.add.s(1, 1), t.add.s(2, 2)])(t.tsum.s()).get(timeout=WAIT) == 6


def test_a_chord_with_a_failing_member_runs_its_link_error_not_its_body(app: App) -> None:
    canvas = chord([t.add.s(1, 1), t.boom.s(2).set(job_id=f"boom-{uuid.uuid4().hex[:8]}")],
                   t.record.s())
    h = canvas.on_error(t.record.s()).apply_async()
    with pytest.raises(TaskFailed, match="RuntimeError: boom 2") as failed:
        h.get(timeout=WAIT)
    # the errback runs once, given the failed member's id (Celery's gets the request);
    # the body never runs: its only record is the errback's
    assert _next_record(app) == failed.value.job_id
    assert h.status() == "failed"
    body = h.steps()[-1]
    assert body["task"] == "cs.record" and body["state"] == "cancelled"
    assert _recorded(app) == []


def test_an_errback_on_a_chords_body_as_celerys_docs_write_it(app: App) -> None:
    # Celery's docs: group(...) | xsum.s().on_error(on_chord_error.s()): the body's errback
    # runs when a member fails (the body never will); it is the workflow's errback here
    canvas = group(t.add.s(1, 1), t.boom.s(5)) | t.tsum.s().on_error(t.record.s())
    h = canvas.apply_async()
    with pytest.raises(TaskFailed, match="boom 5") as failed:
        h.get(timeout=WAIT)
    assert _next_record(app) == failed.value.job_id
    # chord(header, body.on_error(...)) the same, the errback kept through .set()
    body = t.tsum.s().on_error(t.record.s()).set(job_id=f"body-{uuid.uuid4().hex[:8]}")
    h = chord([t.boom.s(6)], body).apply_async()
    with pytest.raises(TaskFailed, match="boom 6") as failed:
        h.get(timeout=WAIT)
    assert _next_record(app) == failed.value.job_id
    # an errback on a step in a chain would not be Celery's workflow errback: refused
    with pytest.raises(WorkflowError, match="link_error"):
        (t.add.s(1, 1) | t.add.s(1).on_error(t.record.s()) | t.add.s(1)).apply_async()


def test_a_chain_with_a_failing_step_stops_there_and_runs_link_error(app: App) -> None:
    h = (t.add.s(1, 1) | t.boom.s() | t.add.s(1)).on_error(t.record.s()).apply_async()
    with pytest.raises(TaskFailed, match="boom 2"):
        h.get(timeout=WAIT)
    first, failed, after = h.steps()
    assert _next_record(app) == failed["id"]
    assert (first["state"], failed["state"], after["state"]) == ("done", "dead", "cancelled")


# -- retries --------------------------------------------------------------------------------
def test_self_retry_with_a_countdown_n_times_then_success(app: App) -> None:
    tag = uuid.uuid4().hex[:8]
    res = AsyncResult.of(t.retry_n.delay(tag, 3, 0.25))
    assert res.get(timeout=WAIT) == 3 and res.state == states.SUCCESS
    stamps = _stamps(app, tag)
    assert len(stamps) == 4                               # the first run and 3 retries
    assert all(gap >= 250 for gap in _gaps(stamps)), stamps


def test_max_retries_exceeded_re_raises_the_exc_given(app: App) -> None:
    tag = uuid.uuid4().hex[:8]
    res = AsyncResult.of(t.always_retry.delay(tag, True))
    # Celery: retry(exc=exc) past max_retries raises exc; the state is FAILURE
    with pytest.raises(LookupError, match=f"^not there yet: {tag}$"):
        res.get(timeout=WAIT)
    assert res.state == states.FAILURE and len(_stamps(app, tag)) == 3   # 1 + max_retries=2
    assert (res.traceback or "").rstrip().endswith(f"LookupError: not there yet: {tag}")


def test_max_retries_exceeded_without_exc_raises_max_retries_exceeded_error(
        app: App) -> None:
    tag = uuid.uuid4().hex[:8]
    res = AsyncResult.of(t.always_retry.delay(tag, False))
    with pytest.raises(MaxRetriesExceededError):
        res.get(timeout=WAIT)
    assert res.state == states.FAILURE and res.failed() and len(_stamps(app, tag)) == 3


def test_autoretry_for_with_retry_backoff(app: App) -> None:
    tag = uuid.uuid4().hex[:8]
    # retry_backoff=0.2 without jitter: Celery's 0.2 * 2^retries, so 0.2 s then 0.4 s
    assert t.flaky_io.delay(tag, 2).get(timeout=WAIT) == f"{tag} ok"
    gaps = _gaps(_stamps(app, tag))
    assert len(gaps) == 2 and gaps[0] >= 200 and gaps[1] >= 400, gaps


def test_autoretry_for_does_not_retry_other_exceptions(app: App) -> None:
    tag = uuid.uuid4().hex[:8]
    res = AsyncResult.of(t.wrong_kind.delay(tag))
    with pytest.raises(ValueError, match=f"{tag}: not retried"):
        res.get(timeout=WAIT)
    assert len(_stamps(app, tag)) == 1 and res.state == states.FAILURE


# -- results --------------------------------------------------------------------------------
def test_get_with_a_timeout_raises_a_timeout_error(app: App) -> None:
    res = AsyncResult.of(t.add.apply_async((1, 2), countdown=30))
    with pytest.raises(TimeoutError) as waited:
        res.get(timeout=0.2)
    # Celery raises celery.exceptions.TimeoutError; ours is ResultTimeout, a TimeoutError
    assert isinstance(waited.value, ResultTimeout)
    assert res.state == states.PENDING and not res.ready()
    assert res.revoke() == CancelVerdict.CANCELLED


def test_a_failure_reads_as_celerys(app: App) -> None:
    res = AsyncResult.of(t.boom.delay(7))
    with pytest.raises(RuntimeError, match="^boom 7$"):
        res.get(timeout=WAIT)
    assert res.state == states.FAILURE and res.ready() and not res.successful()
    assert str(res.result) == "boom 7" and type(res.result) is RuntimeError
    assert res.traceback is not None and res.traceback.rstrip().endswith(
        "RuntimeError: boom 7")
    assert isinstance(res.get(timeout=WAIT, propagate=False), RuntimeError)


def test_an_unknown_id_is_pending(app: App) -> None:
    res = AsyncResult(f"never-{uuid.uuid4().hex}", app)
    assert (res.state, res.status, res.ready(), res.result) == (
        states.PENDING, states.PENDING, False, None)


def test_children_and_parent_of_a_chain(app: App) -> None:
    h = (t.add.s(1, 2) | t.add.s(10) | t.add.s(100)).apply_async()
    assert h.get(timeout=WAIT) == 113
    first, second, third = (AsyncResult(s["id"], app) for s in h.steps())
    assert first.children == [second] and second.children == [third]
    assert third.children == [] and first.parent is None
    assert third.parent == second and second.parent == first
    assert [r.get(timeout=WAIT) for r in (first, second, third)] == [3, 13, 113]


def test_task_id_names_the_job(app: App) -> None:
    task_id = f"order-{uuid.uuid4().hex[:8]}"
    h = t.whoami.apply_async((5,), task_id=task_id)
    assert h.id == task_id
    assert AsyncResult(task_id, app).get(timeout=WAIT) == [task_id, 0, "cs.whoami", 5]


def test_ignore_result_runs_and_keeps_nothing(app: App) -> None:
    h = t.fire_and_forget.delay(21)
    got = app.client.blpop([t.key("forgotten", app.settings.queue)], timeout=WAIT)
    assert got is not None and got[1] == "21"
    # Celery's result stays PENDING for ever; ours: the row is gone, get() says so at once
    with pytest.raises(TaskFailed, match="result_ttl=0"):
        h.get(timeout=WAIT)
    assert AsyncResult(h.id, app).state == states.PENDING


# -- revoke, expires ------------------------------------------------------------------------
def test_revoke_of_a_pending_task(app: App) -> None:
    tag = uuid.uuid4().hex[:8]
    res = AsyncResult.of(t.ran.apply_async((tag,), countdown=0.8))
    assert res.revoke() == CancelVerdict.CANCELLED
    assert res.state == states.REVOKED and res.ready() and not res.failed()
    with pytest.raises(TaskFailed, match="cancelled"):
        res.get(timeout=WAIT)
    # a job sent later than the revoked one was due has run: the revoked one never did
    assert t.ran.apply_async((f"{tag}-later",), countdown=1.0).get(timeout=WAIT)
    assert _ran(app, tag) == [] and len(_ran(app, f"{tag}-later")) == 1


@pytest.mark.parametrize("expires", [0.1, "datetime"])
def test_expires_the_task_never_runs_and_reads_revoked(app: App, expires: Any) -> None:
    tag = uuid.uuid4().hex[:8]
    when = datetime.now(timezone.utc) + timedelta(seconds=0.1) if expires == "datetime" \
        else expires
    # due after its expiry (a countdown): the claim meets it expired
    res = AsyncResult.of(t.ran.apply_async((tag,), countdown=0.4, expires=when))
    with pytest.raises(TaskFailed, match="expired"):
        res.get(timeout=WAIT)
    assert res.state == states.REVOKED and _ran(app, tag) == []


# -- time limits ----------------------------------------------------------------------------
def test_a_soft_time_limit_caught_by_the_task(app: App) -> None:
    tag = uuid.uuid4().hex[:8]
    res = AsyncResult.of(t.slow.delay(tag))
    assert res.get(timeout=WAIT) == f"{tag}: cleaned up" and res.state == states.SUCCESS


# -- link= / link_error= on apply_async -----------------------------------------------------
def test_link_gets_the_result(app: App) -> None:
    h = t.add.apply_async((2, 2), link=t.record.s())
    assert h.get(timeout=WAIT) == 4                   # the handle is the task's own job
    assert _next_record(app) == 4


def test_link_error_gets_the_failed_tasks_id(app: App) -> None:
    h = t.boom.apply_async((3,), link=t.record.s(), link_error=t.record.s())
    with pytest.raises(TaskFailed, match="boom 3"):
        h.get(timeout=WAIT)
    # ours is given the failed job's id (Celery's: the request, exc and traceback)
    assert _next_record(app) == h.id
    assert _recorded(app) == []                       # link= never ran
