"""Limits on what a job may carry and on how long it may wait (issue 24, items 5 and 7): a
result over its size limit fails the attempt by the retry policy; an ack the server refuses
is not retried for ever; back-off options are finite and in range, and a computed delay is
one the verbs take; a failure its child could not write is written by the master, with its
own reason."""

from __future__ import annotations

import math
import time

import limit_tasks  # noqa: F401 - its tasks' options (attempts, groups) for send_task
import pytest
from faults import start_worker, wait_until
from helpers import make_task

from emqtasks import App, EmqError, InvalidArgument
from emqtasks._dev.localserver import LocalRedis
from emqtasks.errors import ResultTooLarge
from emqtasks.producer.retry_policy import RetryPolicy
from emqtasks.serialization import dumps_result
from emqtasks.validate import MAX_DURATION, YEAR
from emqtasks.worker.child import Runner

pytestmark = pytest.mark.timeout(120)


def _worker(app: App, **kw: object):  # type: ignore[no-untyped-def]
    return start_worker(app.settings.redis_url, app.settings.queue, module="limit_tasks",
                        **kw)   # type: ignore[arg-type]


def _ended(app: App, job_id: str) -> bool:
    return app.queue().status(job_id) in ("done", "dead")


# -- 5. results: a size limit, and no ack retried for ever -----------------------------------

def test_a_result_over_the_limit_is_refused_naming_its_size() -> None:
    # The limit counts the result's JSON bytes (UTF-8), as the payload's does
    assert dumps_result("é" * 10, limit=22) == '"' + "é" * 10 + '"'
    with pytest.raises(ResultTooLarge, match=r"result of 23 bytes is over the 22-byte limit "
                                              r"\(max_result_bytes\)") as err:
        dumps_result("é" * 10 + "x", limit=22)
    assert isinstance(err.value, EmqError)


def test_max_result_bytes_is_checked_where_it_is_set() -> None:
    for bad in (0, -1, 2.0, True, "1000", 2**40):
        with pytest.raises(InvalidArgument, match="max_result_bytes"):
            App(max_result_bytes=bad)   # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="max_result_bytes"):
            App().task(lambda: None, name="t.bad", max_result_bytes=bad)   # type: ignore[arg-type]


def test_a_result_over_the_limit_fails_the_attempt_by_the_retry_policy(app: App) -> None:
    # Given a worker, and jobs whose results are just over and under the default 1 MB limit
    with _worker(app) as w:
        over = app.send_task("lim.sized", (1_000_000,))           # 1,000,002 bytes of JSON
        under = app.send_task("lim.sized", (999_998,))            # 1,000,000 bytes
        own = app.send_task("lim.sized_big", (3_000_000,))        # its task allows 64 MB
        # Then the one over it fails each attempt (2) and goes dead, naming its size
        wait_until(lambda: _ended(app, over.id), 30, "the oversized result to end", w)
        row = app.job(over.id)
        assert row is not None and row["state"] == "dead" and row["attempts"] == 2
        assert row["error"].startswith("ResultTooLarge: result of 1000002 bytes is over the "
                                       "1000000-byte limit (max_result_bytes)"), row["error"]
        # ... while the others are stored whole
        assert under.get(timeout=30) == "x" * 999_998
        assert own.get(timeout=30) == "x" * 3_000_000
        assert w.stop() == 0


@pytest.mark.parametrize("size", [2_000_000, 40_000_000])
def test_an_ack_the_server_refuses_is_settled_not_retried_for_ever(queue_name: str,
                                                                   size: int) -> None:
    # Given a server that takes no argument over 1 MB, and a task allowed 64 MB results:
    # 2 MB is answered "Protocol error" (and the connection closed), 40 MB has the
    # connection closed while it is being sent
    with LocalRedis(extra=("--proto-max-bulk-len", "1mb")) as srv:
        app = App(redis_url=srv.url, queue=queue_name)
        try:
            with _worker(app) as w:
                # When a job returns a result the server refuses to take
                big = app.send_task("lim.sized_big", (size,))
                # Then the attempt fails with the reason (2 attempts: dead), the job is not
                # left active with its child retrying the ack for ever
                wait_until(lambda: _ended(app, big.id), 40, "the refused ack to settle", w)
                row = app.job(big.id)
                assert row is not None and row["state"] == "dead", row
                assert row["error"].startswith("AckRefused: "), row["error"]
                # ... and the pool goes on with the next job
                assert app.send_task("lim.sized_big", (10,)).get(timeout=20) == "x" * 10
                assert w.stop() == 0
        finally:
            app.close()


# -- 7. back-off caps: finite, in range; a delay the verbs take; the master settles -------------

@pytest.mark.parametrize("option,value", [
    ("retry_backoff_max", math.nan), ("retry_backoff_max", math.inf),
    ("retry_backoff_max", -1.0), ("retry_backoff_max", 2 * YEAR),
    ("retry_backoff_max", "60"), ("retry_backoff_max", True),
    ("retry_backoff", math.inf), ("retry_backoff", math.nan), ("retry_backoff", 2 * YEAR),
    ("retry_backoff", -1),
])
def test_back_off_options_are_checked_like_every_number(app: App, option: str,
                                                         value: object) -> None:
    with pytest.raises(InvalidArgument, match=option) as err:
        make_task(app, name=f"t.backoff.{option}", **{option: value})
    assert repr(value)[:20] in str(err.value)


def test_the_longest_back_off_is_a_delay_the_verbs_take(app: App) -> None:
    # Given the largest options accepted: a base and a cap of one year, no jitter
    policy = RetryPolicy.of(retry_backoff=YEAR, retry_backoff_max=YEAR, retry_jitter=False)
    # Then the delay after any attempt is at most a year (what retry accepts)
    assert [policy.delay(n) for n in (1, 2, 64, 10**6)] == [MAX_DURATION] * 4
    t = make_task(app, name="t.backoff.year", max_attempts=3, retry_backoff=YEAR,
                  retry_backoff_max=YEAR, retry_jitter=False)
    t.delay()
    lease = app.queue().claim(1)[0]
    assert app.queue().retry(lease, "boom", delay=t.spec.policy.delay(5)).outcome == "retry"
    due = app.client.zscore(app.queue().keys.delayed, lease.id)
    assert due / 1000 - time.time() == pytest.approx(YEAR, abs=60)


def test_a_failure_whose_text_cannot_be_sent_is_still_written(
        app: App, caplog: pytest.LogCaptureFixture) -> None:
    # Given a task whose error message holds a lone surrogate (no UTF-8 encoding exists)
    def broken() -> None:
        raise ValueError("bad \ud800 text")

    t = app.task(broken, name="t.lone_surrogate", max_attempts=1)
    t.delay()
    # When a runner runs it, then the failure is written (not a crash of the child), with
    # the character escaped
    outcome = Runner(app.queue(), app.registry).run_once()
    assert outcome is not None and outcome.verdict == "dead"
    row = app.job(outcome.job_id)
    assert row is not None and row["error"].startswith("ValueError: bad \\ud800 text")
    # and its log line too can be written by a handler that writes UTF-8
    lines = [r.getMessage() for r in caplog.records if outcome.job_id in r.getMessage()]
    assert lines and all(line.encode("utf-8") for line in lines)
    assert "\\ud800" in lines[0]


def test_a_job_its_child_cannot_settle_is_settled_by_the_master_with_its_reason(
        app: App) -> None:
    # Given a task that fails and whose child dies while writing that failure
    with _worker(app) as w:
        h = app.send_task("lim.dies_settling", ("a",))
        # Then the master writes it (twice: 2 attempts) with the task's own error, never as
        # a lost worker, and the job is not left active
        wait_until(lambda: _ended(app, h.id), 30, "the master to settle the job", w)
        row = app.job(h.id)
        assert row is not None and row["state"] == "dead" and row["attempts"] == 2, row
        assert row["error"].startswith("ValueError: the real reason of a"), row["error"]
        assert "WorkerLost" not in row["error"]
        assert "died (signal 9) while writing this failure" in row["error"]
        assert w.stop() == 0
