"""An ack sent again by the holder that sent it (its reply was lost: a cut connection, a
socket timeout, a server restart; the worker's Outage sends it again) is answered done, not
stale: the first one was applied and stored this holder's result. Found by the chaos soak's
history checker (a "stale write": a holder told its ack was stale whose result is the stored
one; the worker then logged "this run's result was not stored" and skipped the
task_succeeded hook of a job that succeeded). Another holder's ack stays stale."""

from __future__ import annotations

import pytest
from helpers import new_job

from emqtasks._dev.localserver import LocalRedis
from emqtasks.observe.lanes import stats as queue_stats
from emqtasks.store.queue import Queue
from emqtasks.verdicts import AckVerdict


@pytest.mark.timeout(30)
def test_the_same_holders_ack_sent_again_is_done_and_another_holders_is_stale(
        private_redis: LocalRedis, queue_name: str) -> None:
    q = Queue(private_redis.client(), queue_name)
    q.enqueue_many([new_job("j1", lease_ms=100), new_job("j2")])
    (held,) = q.claim()
    assert held.id == "j1"
    # Given the holder's ack applied (its reply lost on the way back)
    assert q.ack(held, '"first"').verdict == AckVerdict.DONE
    # When it sends the same ack again, Then it is told done, and nothing changes
    again = q.ack(held, '"again"')
    assert again.verdict == AckVerdict.DONE
    row = q.job("j1")
    assert row is not None and row["state"] == "done" and row["result"] == '"first"'
    assert queue_stats(q)["stale_acks"] == 0
    # and an ack of a holder that is not the one whose ack was applied is stale, counted
    other = held._replace(nonce="someone-else")
    assert q.ack(other, '"other"').verdict == AckVerdict.STALE
    assert queue_stats(q)["stale_acks"] == 1
    row = q.job("j1")
    assert row is not None and row["result"] == '"first"'
