"""Batches of short jobs (issue 31 item 5): a child whose jobs run short acks its finished
jobs and claims the next few in one round trip (Queue.ack_claim); every item is its own
turn of the ring, lease and fence; a long job hands the ones held behind it on."""

from __future__ import annotations

import pytest
from helpers import make_task
from workerproc import WorkerProc

from emqtasks import App
from emqtasks.store.queue import NewJob
from emqtasks.verdicts import AckVerdict

pytestmark = pytest.mark.timeout(90)


def _k(app: App, name: str) -> str:
    return f"bt:{app.settings.queue}:{name}"



def test_ack_claim_acks_each_item_fenced_and_claims_each_from_its_own_turn(app, queue):
    # Given jobs in three groups, three claimed in one batch
    t = make_task(app, group=lambda g, *_: g, result_ttl=60)
    t.map([(g, i) for i in range(3) for g in ("A", "B", "C")])
    verdicts, batch = queue.ack_claim([], 3)
    # Then each is its own turn of the ring (one per group), lease, nonce and fence
    assert verdicts == [] and sorted(b.group for b in batch) == ["A", "B", "C"]
    assert len({b.nonce for b in batch}) == 3
    # When one item's lease is lost (handed back and claimed again by another holder)
    stale = batch[1]
    assert queue.release(stale)
    (again,) = [x for x in queue.claim(3) if x.id == stale.id] or [None]
    assert again is not None and again.nonce != stale.nonce
    # Then the batch's ack refuses that item alone: the others are done, the new holder's
    # lease is untouched, and the next batch comes in the same call
    verdicts, nxt = queue.ack_claim([(b, '"r"', None) for b in batch], 2)
    assert verdicts == [AckVerdict.DONE, AckVerdict.STALE, AckVerdict.DONE]
    assert queue.status(stale.id) == "active"
    assert queue.client.zscore(queue.keys.active, again.id) is not None
    assert len(nxt) == 2
    assert queue.ack(again)[0] is AckVerdict.DONE


def test_a_batch_never_exceeds_a_group_limit(app, queue):
    # Given a group limited to 2 in flight, and another without a limit, short jobs in each
    app.set_group_limit("lim", 2)
    queue.enqueue_many([NewJob(f"{g}-{i}", "bt.short", f'{{"v":1,"a":["{g}:{i}"],"k":{{}}}}',
                               g, 3, 30_000, 50, 3600)
                        for i in range(300) for g in ("lim", "free")])
    # When a pool of 4 drains them (its children batch: the jobs run under a ms)
    with WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=4,
                    modules=("batch_tasks",)) as w:
        w.wait_ready()
        _wait_order(app, 600)
        w.stop()
    # Then the limited group never had more than 2 in flight (held or running), however
    # many a batch claimed
    assert int(app.client.get(_k(app, "max:lim")) or 0) == 2
    assert app.stats()["pending"] == 0


def test_short_jobs_finish_while_a_long_one_runs_on_two_children(app, queue):
    def shorts(group: str, n: int) -> list[NewJob]:
        return [NewJob(f"{group}-{i}", "bt.short", f'{{"v":1,"a":["{group}:{i}"],"k":{{}}}}',
                       group, 3, 30_000, 50, 3600) for i in range(n)]

    # Given a pool of 2 draining short jobs (so its children claim them in batches)
    with WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=2,
                    modules=("batch_tasks",)) as w:
        w.wait_ready()
        queue.enqueue_many(shorts("s", 300))
        _wait_order(app, 60)
        # When a 5 s job and 100 short ones of another group arrive mid-drain (a batch
        # claims the long one with short ones behind it)
        queue.enqueue_many([NewJob("long-1", "bt.long", '{"v":1,"a":[5],"k":{}}', "long", 3,
                                   30_000, 50, 3600)])
        queue.enqueue_many(shorts("t", 100))
        # Then every short one finishes while the long one runs: none waits behind it
        order = _wait_order(app, 400 + 2)
        w.stop()
    assert order[-1] == "long:end", order[-5:]
    assert sum(1 for x in order if x.startswith(("s:", "t:"))) == 400


@pytest.mark.parametrize("setting", [None, "0"], ids=["default", "off"])
def test_a_worker_claims_short_jobs_in_batches_by_default(app, queue, monkeypatch, setting):
    # Given 200 no-op jobs waiting, and batched claims left as they are by default, or
    # turned off (EMQ_BATCH_CLAIMS=0)
    if setting is None:
        monkeypatch.delenv("EMQ_BATCH_CLAIMS", raising=False)
    else:
        monkeypatch.setenv("EMQ_BATCH_CLAIMS", setting)
    ids = [f"n-{i:03d}" for i in range(200)]
    queue.enqueue_many([NewJob(i, "bt.noop", '{"v":1,"a":[],"k":{}}', "n", 3, 30_000, 50, 3600)
                        for i in ids])
    # When one child drains them
    with WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=1,
                    modules=("batch_tasks",)) as w:
        w.wait_ready()
        while not all(queue.status(i) == "done" for i in ids[-1:] + ids):
            app.client.blpop([_k(app, "never")], timeout=0.05)   # bounded: the timeout
        w.stop()
    # Then the claim calls that leased them are counted by their nonces (a call's prefix,
    # ':<i>' per job of a claim of several): INFO commandstats cannot tell them, as an ack
    # that claims the next job (EMQ.ACK / the ack function with a next nonce) is one too
    calls = {queue.client.hget(queue.keys.job(i), "nonce").split(":")[0] for i in ids}
    if setting is None:
        assert len(calls) < len(ids) / 3, len(calls)     # batches (1, 2, 4, then 8)
    else:
        assert len(calls) == len(ids)                    # one claim per job


def _wait_order(app: App, n: int) -> list[str]:
    """The finish order, once n entries are in (bounded: the test's timeout)."""
    key = _k(app, "order")
    while app.client.llen(key) < n:
        app.client.blpop([_k(app, "never")], timeout=0.05)   # a 50 ms pause, blocked
    return [x.decode() if isinstance(x, bytes) else x for x in app.client.lrange(key, 0, -1)]
