"""Producers in many threads (issue 24, item 2): an App's connections stay bounded whatever
the number of threads, on the native wire as on the scripts, and a caller that finds every
connection busy waits for one (within its timeout) instead of failing.

Each test takes a server of its own, so CLIENT LIST counts only its connections; it runs on
the path the suite runs (``EMQ_NATIVE``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from emqtasks import App, ResultTimeout
from emqtasks._dev.localserver import LocalRedis
from emqtasks.store.connection import POOL_SIZE

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def server() -> Iterator[LocalRedis]:
    with LocalRedis() as srv:
        yield srv


#: The client name of the App whose connections a test counts (Peak's ``name``).
PRODUCER = "pool-producer"


def clients(admin: Any, name: str | None = None) -> int:
    """Connections the server holds, less the admin's own; with ``name``, those of that
    client name only."""
    if name is not None:
        return sum(1 for c in admin.client_list() if c.get("name") == name)
    return len(admin.client_list()) - 1


class Peak:
    """The most connections the server held while it ran (CLIENT LIST, every 20 ms); with
    ``name``, of that client name only."""

    def __init__(self, admin: Any, name: str | None = None) -> None:
        self.admin, self.name, self.most = admin, name, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self.done.wait(0.02):
            self.most = max(self.most, clients(self.admin, self.name))

    def __enter__(self) -> Peak:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(5)
        self.most = max(self.most, clients(self.admin, self.name))


def test_three_thousand_short_lived_producer_threads_all_enqueue(server: LocalRedis,
                                                                 queue_name: str) -> None:
    # Given one App and a thread per request, as a threaded web server runs them
    app = App(redis_url=server.url, queue=queue_name)
    t = app.task(lambda i: i, name="t.request")
    admin = server.client()
    errors: list[BaseException] = []
    ids: list[str] = []

    def request(i: int) -> None:
        try:
            ids.append(t.delay(i).id)
        except BaseException as exc:
            errors.append(exc)

    # When 3,000 threads each enqueue one job and end, up to 300 alive at once
    with Peak(admin) as peak:
        for start in range(0, 3000, 300):
            wave = [threading.Thread(target=request, args=(i,))
                    for i in range(start, start + 300)]
            for th in wave:
                th.start()
            for th in wave:
                th.join(60)
    # Then every enqueue succeeded, and the server never held more than the pool's size
    assert errors == [], f"{len(errors)} failed, first: {errors[:1]!r}"
    assert len(set(ids)) == 3000 and app.stats()["pending"] == 3000
    print(f"3,000 threads: at most {peak.most} connections")
    assert peak.most <= POOL_SIZE, peak.most
    # ... and an idle App keeps at most its pool
    assert clients(admin) <= POOL_SIZE
    app.close()


def test_five_hundred_concurrent_gets_each_get_a_value_or_result_timeout(
        server: LocalRedis, queue_name: str) -> None:
    # Given 500 jobs, and a thread per job waiting for its result (more threads than the
    # App's pool holds connections; its connections named, so the consumer's are not counted)
    app = App(redis_url=f"{server.url}?client_name={PRODUCER}", queue=queue_name)
    t = app.task(lambda i: i, name="t.echo")
    handles = t.map([(i,) for i in range(500)])
    got: dict[int, Any] = {}
    started = threading.Barrier(501, timeout=30)

    def wait(i: int) -> None:
        started.wait()
        try:
            got[i] = handles[i].get(timeout=10)
        except BaseException as exc:
            got[i] = exc

    admin = server.client()
    with Peak(admin, PRODUCER) as peak:
        threads = [threading.Thread(target=wait, args=(i,)) for i in range(500)]
        for th in threads:
            th.start()
        started.wait()
        # When a consumer (its own connection) runs every job while they wait
        consumer = App(redis_url=server.url, queue=queue_name)
        q = consumer.queue()
        while (leases := q.claim(50)):
            for lease in leases:
                q.ack(lease, lease.payload[len('{"v":1,"a":['):-len('],"k":{}}')])
        for th in threads:
            th.join(60)
        consumer.close()
    # Then each got its value or a ResultTimeout, never a connection error
    others = [v for v in got.values() if isinstance(v, BaseException)
              and not isinstance(v, ResultTimeout)]
    assert others == [], f"{len(others)} failed, first: {others[:1]!r}"
    values = {i: v for i, v in got.items() if not isinstance(v, BaseException)}
    assert all(values[i] == i for i in values)
    assert len(values) == 500   # every job ran well within the waits' 10 s
    print(f"500 gets: at most {peak.most} connections")
    assert peak.most <= POOL_SIZE, peak.most
    app.close()


def test_a_get_that_finds_the_pool_busy_times_out_within_its_timeout(
        server: LocalRedis, queue_name: str) -> None:
    # Given an App whose every connection is held by a get() that waits 2 s
    app = App(redis_url=f"{server.url}?max_connections=2", queue=queue_name)
    t = app.task(lambda i: i, name="t.never")
    slow = t.map([(i,) for i in range(3)])
    outcomes: list[BaseException] = []

    def hold(h: Any) -> None:
        try:
            h.get(timeout=2)
        except BaseException as exc:
            outcomes.append(exc)

    holders = [threading.Thread(target=hold, args=(h,)) for h in slow[:2]]
    for th in holders:
        th.start()
    admin = server.client()
    wait_until_blocked(admin, 2)
    # When a third get() has a timeout of 0.5 s, then it raises ResultTimeout in about that
    began = time.monotonic()
    with pytest.raises(ResultTimeout):
        slow[2].get(timeout=0.5)
    assert time.monotonic() - began < 2.0
    for th in holders:
        th.join(10)
    assert [type(e) for e in outcomes] == [ResultTimeout, ResultTimeout]
    app.close()


def wait_until_blocked(admin: Any, n: int) -> None:
    """Until n clients sit in a blocking command (BLPOP)."""
    deadline = time.monotonic() + 10
    while int(admin.info("clients")["blocked_clients"]) < n:
        assert time.monotonic() < deadline, "the holders never blocked"
        time.sleep(0.01)
