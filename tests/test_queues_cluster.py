"""Several queues per worker on a Redis Cluster: the queues live on different shards, so
the master parks once per queue (and listens for aborts once per queue); jobs of either are
served, woken for and aborted."""

from __future__ import annotations

import time

import abort_tasks as at
import day2_tasks as d2
import pytest
from cluster import ClusterServers, module_cluster
from day2 import cleanup, enqueue, key, start, wait_until
from workerproc import WorkerProc

from emqtasks import App
from emqtasks.errors import TaskFailed

pytestmark = pytest.mark.timeout(180)


cluster = pytest.fixture(scope="module", name="cluster")(module_cluster)


def test_one_worker_serves_queues_on_two_shards(cluster: ClusterServers) -> None:
    a, b = cluster.queues_on_every_shard("cq2")[:2]
    assert cluster.master_of_queue(a) != cluster.master_of_queue(b)
    app = App(redis_url=cluster.url, queue=a)
    try:
        enqueue(app, d2.sync_record, [(f"a:{i}",) for i in range(20)], queue=a)
        enqueue(app, d2.sync_record, [(f"b:{i}",) for i in range(20)], queue=b)
        order = key(app, "order", a)
        with start(app, concurrency=1, queues=f"{a},{b}") as w:
            wait_until(lambda: app.client.llen(order) >= 40, 30, "40 jobs", w.output)
            tags = app.client.lrange(order, 0, -1)
            assert [t[0] for t in tags] == ["a"] * 20 + ["b"] * 20   # strict, across shards
            time.sleep(0.5)   # both park threads parked
            for i, q in enumerate([b, a, b]):
                sent = time.monotonic()
                enqueue(app, d2.sync_record, [(f"w:{i}",)], queue=q)
                wait_until(lambda i=i: app.client.llen(order) > 40 + i, 5, f"wake {i}",
                           w.output)
                assert time.monotonic() - sent < 2.0
            assert w.stop() == 0
    finally:
        for q in (a, b):
            app.queue(q).purge()
        cleanup(app)
        app.close()


def test_abort_of_a_job_on_the_second_shard(cluster: ClusterServers) -> None:
    # Given a worker serving queues on two shards, running a job of the second one (its
    # abort listener for that queue blocks on that shard)
    a, b = cluster.queues_on_every_shard("cqa")[:2]
    app = App(redis_url=cluster.url, queue=a)
    try:
        with WorkerProc(cluster.url, f"{a},{b}", concurrency=1,
                        modules=("abort_tasks",)) as w:
            w.wait_ready()
            h = app.send_task(at.busy, ("k1",), queue=b)
            got = app.client.blpop([f"t:{a}:started"], timeout=15)
            assert got is not None and got[1] == "k1"
            # When it is aborted through the cluster, Then it stops within a second
            sent = time.monotonic()
            assert app.abort(h.id, queue=b) == "aborting"
            with pytest.raises(TaskFailed, match="aborted"):
                h.get(timeout=10)
            assert time.monotonic() - sent < 1.0
            assert app.queue(b).status(h.id) == "aborted"
            assert w.stop() == 0
    finally:
        for q in (a, b):
            app.queue(q).purge()
        for k in app.client.scan_iter(match=f"t:{a}:*"):
            app.client.delete(k)
        app.close()
