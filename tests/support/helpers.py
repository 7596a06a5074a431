"""Small shared helpers for the queue-core tests: key counts, forced expiry, invariants."""

from __future__ import annotations

from collections import Counter
from typing import Any

from emqtasks import App, Task
from emqtasks.store.queue import NewJob, Queue


def noop(*args: Any, **kwargs: Any) -> None:
    """The body of the tasks these tests enqueue; nothing here runs a worker."""
    return None


def make_task(app: App, name: str = "tests.helpers.noop", **options: Any) -> Task:
    """Register ``noop`` on an app under a name with the given task options."""
    return app.task(noop, name=name, **options)


def flood(app: App, group: str, n: int) -> None:
    """n pending jobs in one lane, one round trip."""
    make_task(app, name=f"tests.flood.{group}", group=group).map([(i,) for i in range(n)])


def new_job(job_id: str, group: str = "default", payload: str = '{"v":1,"a":[],"k":{}}',
            max_attempts: int = 3, lease_ms: int = 30_000, delay_ms: int = 1_000,
            ttl: int = 3_600, countdown_ms: int = 0) -> NewJob:
    return NewJob(job_id, "tests.helpers.noop", payload, group, max_attempts, lease_ms,
                  delay_ms, ttl, countdown_ms)


def count_keys(queue: Queue) -> int:
    # SCAN of the server holding the queue (KEYS on a cluster client asks one random node)
    return len(list(queue.scan(queue.keys.all_pattern)))


def data_keys(queue: Queue) -> int:
    """count_keys less the observability keys: the minutes of history (``h:<minute>``) and
    the workers' heartbeats, which live their own lives (expiry after the retention, or a
    few ticks), and the queue's clock mark and tally, which last as long as the queue."""
    skip = tuple(queue.keys.base + k for k in ("h:", "worker:", "workers", "clock", "tally"))
    return sum(1 for key in queue.scan(queue.keys.all_pattern) if not key.startswith(skip))


def server_ms(queue: Queue) -> int:
    secs, micros = queue.client.time()
    return int(secs) * 1000 + int(micros) // 1000


def expire_now(queue: Queue, job_id: str) -> None:
    """Make a lease already expired: its active score (the deadline, ms) goes into the past."""
    queue.client.zadd(queue.keys.active, {job_id: server_ms(queue) - 1_000}, xx=True)


def due_now(queue: Queue, job_id: str) -> None:
    """Make a delayed entry due: its score (the due time, ms) goes into the past."""
    queue.client.zadd(queue.keys.delayed, {job_id: server_ms(queue) - 1_000}, xx=True)


def ring(queue: Queue) -> list[str]:
    """The serviceable groups: the ring in turns order, or a time-fair queue's `gvt` by
    virtual time (the other one is empty)."""
    return [*queue.client.lrange(queue.keys.ring, 0, -1),
            *queue.client.zrange(queue.keys.gvt, 0, -1)]


def drain_wake(queue: Queue) -> None:
    queue.client.delete(queue.keys.wake)


def wake_tokens(queue: Queue) -> int:
    """Readiness tokens saying work is claimable ('1'); other kinds are not counted."""
    return queue.client.lrange(queue.keys.wake, 0, -1).count("1")


def assert_invariants(queue: Queue) -> None:
    """The design's invariants: gactive equals `active` per group; the ring holds each
    serviceable group exactly once (non-empty lane, not paused, under its limit), no other."""
    c, k = queue.client, queue.keys
    active_ids = c.zrange(k.active, 0, -1)
    pipe = c.pipeline(transaction=False)
    for job_id in active_ids:
        pipe.hget(k.job(job_id), "group")
    in_flight = Counter(pipe.execute())
    gactive = {g: int(n) for g, n in c.hgetall(k.gactive).items() if int(n) != 0}
    assert gactive == dict(in_flight), f"gactive {gactive} != active {dict(in_flight)}"

    groups = sorted(queue.groups())
    pipe = c.pipeline(transaction=False)
    for g in groups:
        pipe.zcard(k.lane(g))
    sizes = pipe.execute()
    limits = {g: int(v) for g, v in c.hgetall(k.glimit).items()}
    paused = c.smembers(k.gpaused)
    serviceable = {
        g for g, n in zip(groups, sizes)
        if n > 0 and g not in paused and (g not in limits or gactive.get(g, 0) < limits[g])
    }
    members = ring(queue)
    assert len(members) == len(set(members)), "a group stands on the ring twice"
    assert set(members) == serviceable, (
        f"ring {sorted(set(members))[:10]} != serviceable {sorted(serviceable)[:10]}")
