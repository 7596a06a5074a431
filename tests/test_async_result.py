"""AsyncResult (issue 27): a job followed by its id, with Celery's states, on a real worker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import result_tasks as rt
from workerproc import WorkerProc

from emqtasks import (
    App,
    AsyncResult,
    InvalidArgument,
    ResultTimeout,
    TaskFailed,
    chain,
    chord,
    group,
    states,
)
from emqtasks.verdicts import AbortVerdict, CancelVerdict

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def ar_app(app: App) -> Iterator[App]:
    yield app
    for key in app.client.scan_iter(match=f"ar:{app.settings.queue}:*"):
        app.client.delete(key)


def _worker(app: App) -> WorkerProc:
    w = WorkerProc(app.settings.redis_url, app.settings.queue, modules=("result_tasks",))
    w.wait_ready()
    return w


def test_a_job_reads_pending_started_then_success(ar_app: App) -> None:
    app = ar_app
    job_id = app.send_task(rt.hold, ("h1",)).id
    res = AsyncResult(job_id, app)
    # Given a job nobody runs yet: PENDING, not ready, no result
    assert (res.state, res.status, res.ready(), res.result) == (states.PENDING,) * 2 + (
        False, None)
    with pytest.raises(ResultTimeout):
        res.get(timeout=0.2)
    with _worker(app) as w:
        # When a worker starts it: STARTED
        assert app.client.blpop([f"ar:{app.settings.queue}:started"], timeout=20)
        assert res.state == states.STARTED and not res.ready()
        app.client.rpush(f"ar:{app.settings.queue}:go", "1")
        # Then its value, SUCCESS
        assert res.get(timeout=20) == "h1"
        assert w.stop() == 0
    assert res.state == states.SUCCESS and res.ready() and res.successful()
    assert not res.failed() and res.result == "h1" and res.traceback is None
    # forget(): the row goes; the id reads as an unknown one
    res.forget()
    assert app.job(job_id) is None and res.state == states.PENDING
    res.forget()                                    # an unknown id: nothing to do


def test_a_failed_job_reads_failure_with_its_error(ar_app: App) -> None:
    app = ar_app
    res = AsyncResult(app.send_task(rt.fails, ("bad input",)).id, app)
    with _worker(app) as w:
        # get() re-raises the task's own class (a builtin here), with its message, and the
        # TaskFailed carrying the remote traceback as its cause
        with pytest.raises(ValueError, match="^bad input$") as raised:
            res.get(timeout=20)
        assert isinstance(raised.value.__cause__, TaskFailed)
        assert "Traceback" in raised.value.__cause__.error
        err = res.get(timeout=20, propagate=False)
        assert type(err) is ValueError and str(err) == "bad input"
        assert w.stop() == 0
    assert res.state == states.FAILURE and res.failed() and res.ready()
    assert not res.successful()
    assert type(res.result) is ValueError and str(res.result) == "bad input"
    assert res.traceback is not None
    assert res.traceback.startswith("Traceback (most recent call last):")
    assert res.traceback.rstrip().endswith("ValueError: bad input")
    # forget() of a dead job takes it out of `dead` too
    res.forget()
    assert app.dead_jobs(10) == [] and res.state == states.PENDING


def test_get_re_raises_the_tasks_own_class_else_task_failed(ar_app: App) -> None:
    app = ar_app
    own = AsyncResult(app.send_task(rt.declined, (12,)).id, app)
    two = AsyncResult(app.send_task(rt.needs_two).id, app)
    hidden = AsyncResult(app.send_task(rt.local_class).id, app)
    with _worker(app) as w:
        # Given a task's own exception class importable here: that class, its message
        with pytest.raises(rt.PaymentDeclined) as raised:
            own.get(timeout=20)
        assert str(raised.value) == "card refused for 12"
        assert type(own.result) is rt.PaymentDeclined
        assert str(own.result) == "card refused for 12"
        # a class whose constructor refuses one message, one that does not import: TaskFailed
        with pytest.raises(TaskFailed, match="NeedsTwo: 402 no funds"):
            two.get(timeout=20)
        with pytest.raises(TaskFailed, match="Hidden: defined in the task"):
            hidden.get(timeout=20)
        assert w.stop() == 0
    assert isinstance(two.result, TaskFailed) and isinstance(hidden.result, TaskFailed)
    assert all(r.state == states.FAILURE for r in (own, two, hidden))
    assert own.traceback is not None and "PaymentDeclined: card refused" in own.traceback


def test_an_unknown_id_reads_pending(ar_app: App) -> None:
    res = AsyncResult("never-sent", ar_app)
    assert (res.state, res.ready(), res.result, res.traceback) == (
        states.PENDING, False, None, None)


def test_a_failed_attempt_waiting_for_its_retry_reads_retry(ar_app: App) -> None:
    # (the consumer API plays the worker: a retry's delay holds the job in RETRY for as long
    # as the test looks, with no race against a worker's clock)
    app = ar_app
    res = AsyncResult(app.send_task(rt.add, (1, 2)).id, app)
    q = app.queue()
    (lease,) = q.claim(1)
    assert res.state == states.STARTED
    q.retry(lease, "Traceback ...\nValueError: flaky", delay=60)
    assert res.state == states.RETRY and not res.ready() and res.result is None
    assert res.traceback is not None and "flaky" in res.traceback
    # a job waiting for its retry is revoked as a pending one
    assert res.revoke() == CancelVerdict.CANCELLED
    assert res.state == states.REVOKED


def test_revoke_a_pending_job(ar_app: App) -> None:
    app = ar_app
    res = AsyncResult(app.send_task(rt.add, (1, 2), countdown=60).id, app)
    assert res.state == states.PENDING
    with pytest.raises(InvalidArgument, match="revoke"):
        res.forget()                                   # not finished: not forgotten
    assert res.revoke() == CancelVerdict.CANCELLED
    assert res.state == states.REVOKED and res.ready() and not res.failed()
    assert isinstance(res.result, TaskFailed)
    with pytest.raises(TaskFailed, match="cancelled"):
        res.get(timeout=5)
    assert AsyncResult("no-such-job", app).revoke() == CancelVerdict.MISSING
    # terminate=True aborts (test_abort.py: a running job): one not started is cancelled
    other = AsyncResult(app.send_task(rt.add, (1, 2), countdown=60).id, app)
    assert other.revoke(terminate=True) == AbortVerdict.CANCELLED
    assert other.state == states.REVOKED


def test_an_expired_job_reads_revoked(ar_app: App) -> None:
    app = ar_app
    res = AsyncResult(app.send_task(rt.add, (1, 2), expires=0).id, app)
    assert res.state == states.PENDING
    with _worker(app) as w:
        with pytest.raises(TaskFailed, match="expired"):
            res.get(timeout=20)
        assert w.stop() == 0
    assert res.state == states.REVOKED and res.ready()


def test_children_and_parent_of_workflow_steps(ar_app: App) -> None:
    app = ar_app
    h = chain(rt.add.s(1, 2), rt.add.s(10), rt.add.s(100)).apply_async(app=app)
    s0, s1, s2 = (AsyncResult(s["id"], app) for s in app.workflow(h.id).steps())
    assert s0.children == [s1] and s1.children == [s2] and s2.children == []
    assert s0.parent is None and s1.parent == s0 and s2.parent == s1
    c = chord(group(rt.add.s(i, i) for i in range(3)), rt.add.s()).apply_async(app=app)
    *members, callback = (AsyncResult(s["id"], app) for s in app.workflow(c.id).steps())
    assert callback.parents == members and callback.parent is None
    assert all(m.children == [callback] for m in members)
    plain = AsyncResult(app.send_task(rt.add, (1,)).id, app)
    assert plain.children == [] and plain.parent is None and plain.parents == []
    with _worker(app) as w:
        assert AsyncResult(s2.id, app).get(timeout=20) == 113
        assert w.stop() == 0


def test_the_states_are_celerys_and_a_handle_converts(ar_app: App) -> None:
    assert {"SUCCESS", "FAILURE", "REVOKED"} == states.READY_STATES
    assert {states.PENDING, states.STARTED, states.RETRY} <= states.UNREADY_STATES
    assert {"FAILURE", "REVOKED"} == states.PROPAGATE_STATES
    h = ar_app.send_task(rt.add, (2, 3))
    res = AsyncResult.of(h)
    assert res == AsyncResult(h.id, ar_app) and str(res) == h.id
    assert repr(res) == f"<AsyncResult: {h.id}>" and res.state == states.PENDING
