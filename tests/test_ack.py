"""Ack: a job done with its result, the next lease in the same call, rows without a result ttl
deleted; and the result read back through JobHandle.get (the wait verb)."""

from __future__ import annotations

import time

import pytest
from helpers import assert_invariants, make_task

from emqtasks.verdicts import AckVerdict


def test_ack_with_claim_next_returns_the_next_lease_in_the_same_call(app, queue):
    # Given two lanes with work
    t = make_task(app, group=lambda g, *_: g, result_ttl=60)
    t.map([("A", 1), ("A", 2), ("B", 1)])
    (first,) = queue.claim()
    # When the first job is acknowledged asking for the next
    done, nxt = queue.ack(first, '{"ok":true}', claim_next=True)
    # Then it is done with its result, and the next lease came from the next turn
    assert done is AckVerdict.DONE
    assert queue.status(first.id) == "done"
    assert app.job(first.id)["result"] == '{"ok":true}'
    assert 0 < queue.client.ttl(queue.keys.job(first.id)) <= 60
    assert nxt is not None and nxt.group == "B" and nxt.attempts == 1
    assert queue.client.zscore(queue.keys.active, nxt.id) is not None
    # And draining with claim_next ends with None
    _, last = queue.ack(nxt, claim_next=True)
    assert last is not None and last.group == "A"
    assert queue.ack(last, claim_next=True) == (True, None)
    assert queue.client.zcard(queue.keys.active) == 0
    assert_invariants(queue)


def test_ack_with_no_result_ttl_deletes_the_row(app, queue):
    make_task(app, result_ttl=0).delay(1)
    (lease,) = queue.claim()
    assert queue.ack(lease)[0] is AckVerdict.DONE
    assert not queue.client.exists(queue.keys.job(lease.id))


# -- results through JobHandle.get -------------------------------------------------------

def test_handle_get_returns_the_result_once_acknowledged(app, queue):
    h = make_task(app).delay(1)
    (lease,) = queue.claim()
    assert h.status() == "active"
    assert queue.ack(lease, '{"total":3}')[0] is AckVerdict.DONE
    assert h.status() == "done"
    assert h.get(timeout=1) == {"total": 3}


def test_handle_get_times_out_on_a_job_nobody_runs(app):
    h = make_task(app).delay(1)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        h.get(timeout=0.1)
    assert time.monotonic() - started < 2
