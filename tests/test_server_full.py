"""A full server (issue 24, item 6): used memory over ``maxmemory`` with the policy
``noeviction``. What settles, frees or moves work still runs — ack, retry, release, extend,
reap, promote, claim — on the native module as on the scripts; what adds work (enqueue) is
refused with ServerFull and writes nothing; a worker acks what it ran and says so once.

Each test takes a server of its own (it fills it) and runs on the path the suite runs
(``EMQ_NATIVE``); the differential test compares the two paths on a full server."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from faults import Rec, summary, wait_until
from helpers import assert_invariants, expire_now, make_task, new_job
from redis.exceptions import OutOfMemoryError
from workerproc import WorkerProc

from emqtasks import App, EmqError, chain
from emqtasks._dev.localserver import LocalRedis
from emqtasks.errors import ServerFull
from emqtasks.store.queue import Queue
from emqtasks.worker.resilience import FullServer

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def server() -> Iterator[LocalRedis]:
    with LocalRedis(extra=("--maxmemory-policy", "noeviction")) as srv:
        yield srv


def fill(client: Any) -> None:
    """The server is full from now on: any maxmemory under what it uses."""
    client.config_set("maxmemory", 1)


def room(client: Any) -> None:
    client.config_set("maxmemory", 0)


def everything(client: Any, queue: Queue) -> dict[str, Any]:
    """Every key of the queue with its type and value (what 'nothing written' compares)."""
    out: dict[str, Any] = {}
    for key in sorted(client.scan_iter(match=queue.keys.all_pattern)):
        kind = client.type(key)
        value = {"hash": client.hgetall, "zset": lambda k: client.zrange(k, 0, -1,
                                                                         withscores=True),
                 "list": lambda k: client.lrange(k, 0, -1), "set": client.smembers,
                 "string": client.get}[kind](key)
        out[key] = (kind, value)
    return out


@pytest.mark.parametrize("fairness", ["turns", "time"])
def test_the_verbs_that_settle_free_or_move_work_run_on_a_full_server(
        server: LocalRedis, queue_name: str, fairness: str) -> None:
    # Given leases in flight, an expired one, a due retry and waiting work
    app = App(redis_url=server.url, queue=queue_name)
    q = app.queue()
    q.set_fairness(fairness)
    t = make_task(app, max_attempts=3)
    t.map([(i,) for i in range(10)])
    leases = q.claim(6)
    expire_now(q, leases[5].id)
    admin = server.client()
    # When the server is full
    fill(admin)
    try:
        # Then every verb that settles a job, frees memory or moves work still runs
        assert q.ack(leases[0], '"ok"').verdict.name == "DONE"
        acked = q.ack(leases[1], '"ok"', claim_next=True)
        assert acked.verdict.name == "DONE" and acked.next is not None
        assert q.retry(leases[2], "boom", delay=0).name == "RETRIED"
        assert q.release(leases[3]).name == "RELEASED"
        assert [v.name for v in q.extend([leases[4]])] == ["EXTENDED"]
        assert q.reap() == (1, 0)
        assert q.promote()[0] == 1        # the retry, due now
        assert len(q.claim(2)) == 2
    finally:
        room(admin)
    assert_invariants(q)
    app.close()


def test_enqueue_on_a_full_server_raises_server_full_and_writes_nothing(
        server: LocalRedis, queue_name: str) -> None:
    app = App(redis_url=server.url, queue=queue_name)
    q = app.queue()
    t = make_task(app, group="g")
    first = t.delay(0)
    admin = server.client()
    before = everything(admin, q)
    fill(admin)
    try:
        # delay(), a countdown, map() and a workflow: each refused whole, with a named error
        for enqueue in (lambda: t.delay(1), lambda: t.apply_async((2,), countdown=5),
                        lambda: t.map([(3,), (4,)]),
                        lambda: chain(t.s(5), t.s()).delay()):
            with pytest.raises(ServerFull, match="maxmemory") as err:
                enqueue()
            assert isinstance(err.value, EmqError)
            assert isinstance(err.value, redis.exceptions.OutOfMemoryError)
        # ... while a batch that would write nothing (a duplicate) answers as with room
        assert [v.name for v in q.enqueue_many([new_job(first.id, "g")])] == ["DUPLICATE"]
    finally:
        room(admin)
    assert everything(admin, q) == before
    app.close()


def test_a_worker_on_a_full_server_acks_what_it_ran_and_says_so_once(
        server: LocalRedis, queue_name: str) -> None:
    # Given four jobs running on a worker (tick 0.1 s: forty ticks in the test's 4 s)
    app = App(redis_url=server.url, queue=queue_name)
    admin = server.client()
    rec = Rec(admin, queue_name)
    tags = [f"g{i}" for i in range(4)]
    with WorkerProc(server.url, queue_name, concurrency=4, tick=0.1,
                    modules=("limit_tasks",)) as w:
        w.wait_ready()
        handles = [app.send_task("lim.held", (tag,)) for tag in tags]
        wait_until(lambda: len(rec.all_starts()) == 4, 20, "the four jobs to start", w)
        # When the server turns full just as they return (the go tokens are pushed in the
        # same transaction: the tasks' one write left is their ack)
        pipe = admin.pipeline(transaction=True)
        pipe.config_set("maxmemory", 1)
        pipe.rpush(f"t:{queue_name}:go", *tags)
        pipe.execute()
        try:
            # Then every job is done, run once: its ack went through on the full server
            wait_until(lambda: all(app.queue().status(h.id) == "done" for h in handles), 20,
                       "the acks on the full server", w)
            w.wait_for(lambda: "server is full" in w.output(), 10, "the outage's log line")
            time.sleep(1.0)   # ten more ticks on the full server
        finally:
            room(admin)
        w.wait_for(lambda: "room again" in w.output(), 10, "the end of the outage")
        assert w.stop() == 0
        out = w.output()
    assert [h.get(timeout=5) for h in handles] == tags
    assert rec.all_starts() == {tag: 1 for tag in tags}
    assert summary(w)["died"] == 0
    # ... and the outage is one line when it starts and one when it ends, not one a tick
    assert "Traceback" not in out, out[-3000:]
    assert len(re.findall(r"server is full", out)) == 1, out[-3000:]
    assert len(re.findall(r"room again", out)) == 1, out[-3000:]
    app.close()


def test_the_full_server_line_says_so_once_whichever_write_was_refused(
        caplog: pytest.LogCaptureFixture) -> None:
    # Given the master's first refused write: a plain command's (redis-py's OutOfMemoryError)
    # or a verb's (ServerFull, whose own message begins "the server is full")
    reply = "command not allowed when used memory > 'maxmemory'."
    for exc in (OutOfMemoryError(reply), ServerFull.of(OutOfMemoryError(reply))):
        caplog.clear()
        full = FullServer(logging.getLogger("emqtasks.test_full"), "master")
        with caplog.at_level(logging.WARNING, "emqtasks.test_full"):
            full.refused(exc)
            full.refused(exc)     # said once while it lasts
        # Then one line, saying it once, with the server's own words
        (line,) = [r.getMessage() for r in caplog.records]
        assert line.count("server is full") == 1 and reply in line, line
