"""Several queues per worker on a Redis Cluster: the queues live on different shards, so
the master parks once per queue; jobs of either are served and woken for."""

from __future__ import annotations

import time

import day2_tasks as d2
import pytest
from cluster import ClusterServers, module_cluster
from day2 import cleanup, enqueue, key, start, wait_until

from emqtasks import App

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
