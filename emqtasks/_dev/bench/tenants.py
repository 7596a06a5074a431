"""`emqtasks bench --fairness`, its tenants part: two-level lanes against groups only.

The flood: tenant A spreads its jobs over many groups (one per user), then tenant B sends a
few jobs in one group; the claims are driven in one process with the pool's number of jobs
in flight (claim until that many are leased, ack the oldest, again), so the figure is a
count of claims, free of timing noise. Then the claim cost per job at many groups under
many tenants against a few groups in one tenant (Redis CPU per job of a claim ->
ack-and-claim-next loop, as --controls measures it). Then time mode with tenants (a real
worker): tenant A's jobs 20 times longer than B's, A's spread over 10 groups, both
backlogged; each tenant's worker time as the server measures it (claim to ack), the goal
1:1 within 10%.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from ...producer.app import App
from ...store.queue import NewJob, Queue
from . import tasks as bench_tasks
from .core import CHUNK as SEND_CHUNK
from .core import Bench, median, say
from .scenarios import Row

POOL = 4
CHUNK = 5_000


def _send(q: Queue, jobs: list[tuple[str, str, str | None]]) -> None:
    for i in range(0, len(jobs), CHUNK):
        part = jobs[i:i + CHUNK]
        q.enqueue_many([NewJob(j, "bench.tenant", "{}", g, 1, 60_000, 0, 0) for j, g, _ in part],
                       None, [t for _, _, t in part])


def _drive(q: Queue, claims: int) -> list[str]:
    """The ids of up to ``claims`` claims, POOL jobs in flight."""
    flight: deque[Any] = deque()
    order: list[str] = []
    while len(order) < claims:
        while len(flight) < POOL and len(order) < claims:
            got = q.claim(1)
            if not got:
                break
            flight.append(got[0])
            order.append(got[0].id)
        if not flight:
            break
        q.ack(flight.popleft())
    return order


def jain(xs: list[float]) -> float:
    """Jain's fairness index: 1 when every x is equal, 1/n when one takes all."""
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if any(xs) else 1.0


def flood(b: Bench, tenants: bool, a_jobs: int, a_groups: int) -> dict[str, float]:
    """B's 10 jobs behind A's flood: the claims (after B's arrival) until B's first and last
    job started, and the Jain index of the first 20 claims after it."""
    with b.queue() as (app, _):
        q = app.queue()
        _send(q, [(f"a{i}", f"user{i % a_groups}", "A" if tenants else None)
                  for i in range(a_jobs)])
        _drive(q, 100)
        _send(q, [(f"b{i}", "b-user", "B" if tenants else None) for i in range(10)])
        order = _drive(q, a_jobs + 10)
        at = [n + 1 for n, job in enumerate(order) if job.startswith("b")]
        b_first20 = sum(1 for job in order[:20] if job.startswith("b"))
    return {"first": float(at[0]), "last": float(at[-1]),
            "jain": jain([20.0 - b_first20, float(b_first20)])}


def claim_cost(b: Bench, groups: int, tenants: int, jobs: int) -> float:
    """Redis CPU (us) per claimed and acked job, ``jobs`` over ``groups`` groups spread over
    ``tenants`` tenants."""
    with b.queue() as (app, _):
        q = app.queue()
        app.pause()
        _send(q, [(f"j{i}", f"g{i % groups}", f"t{(i % groups) % tenants}")
                  for i in range(jobs)])
        app.resume()
        before = b.meter.snapshot()
        leases = q.claim(1)
        lease = leases[0] if leases else None
        done = 0
        while lease is not None:
            _, lease = q.ack(lease, "null", claim_next=True)
            done += 1
        d = b.meter.delta(before, b.meter.snapshot())
    return float(d["cpu"] * 1e6 / max(done, 1))


#: Time mode with tenants: A's jobs (over A_GROUPS groups) and B's (one group), ms each.
A_MS, B_MS, A_GROUPS = 100.0, 5.0, 10


def _tenant_of_call(counter: str, group: str = "default", ms: float = 1.0) -> str:
    """A bench job's tenant in the time-mode measurement: its group's first letter."""
    return group[:1].upper()


def time_shares(b: Bench, window: float) -> dict[str, float]:
    """Server-measured worker seconds of tenants A and B over ``window`` s (after a first
    second the estimates learn in), in time mode, POOL children, both backlogged; and
    ``dry``: 1.0 when a tenant ran out of jobs in the window."""
    with b.queue() as (app, _):
        app.set_fairness("time")
        # the same task name as the worker's, with a tenant by the call (this App only)
        own = App(redis_url=b.url, queue=app.settings.queue)
        try:
            work = own.task(bench_tasks.work, name=f"{bench_tasks.__name__}.work",
                            group=bench_tasks._group_arg, tenant=_tenant_of_call,
                            max_attempts=3, retry_delay=1.0)
            counter = b.key(app, "twork")
            app.pause()
            n = {"A": int(window * POOL * 1000 / A_MS) + 100,
                 "B": int(window * POOL * 1000 / B_MS) + 1000}
            ids: dict[str, list[str]] = {"A": [], "B": []}
            calls = {"A": [(counter, f"a{i % A_GROUPS}", A_MS) for i in range(n["A"])],
                     "B": [(counter, "b", B_MS)] * n["B"]}
            for t in ("A", "B"):
                for i in range(0, n[t], SEND_CHUNK):
                    ids[t] += [h.id for h in work.map(calls[t][i:i + SEND_CHUNK])]
            with b.worker(app, concurrency=POOL):
                app.resume()
                time.sleep(1.0)
                secs, micros = b.client.time()
                start = int(secs) * 1000 + int(micros) // 1000
                time.sleep(window)
                secs, micros = b.client.time()
                end = int(secs) * 1000 + int(micros) // 1000
                left = {t: app.tenant(t)["waiting"] for t in ids}
            out: dict[str, float] = {"dry": 0.0 if all(left.values()) else 1.0}
            for t, tids in ids.items():
                pipe = b.client.pipeline(transaction=False)
                for job_id in tids:
                    pipe.hmget(app.queue().keys.job(job_id), "started", "finished")
                held = 0
                for started, finished in pipe.execute():
                    if started and finished and int(started) < end and int(finished) > start:
                        held += min(int(finished), end) - max(int(started), start)
                out[t] = held / 1000
        finally:
            own.close()
    return out


def measure(b: Bench, quick: bool) -> tuple[list[Row], list[str]]:
    a_jobs, a_groups = (2_000, 200) if quick else (10_000, 1_000)
    table = [f"tenant A: {a_jobs:,} jobs over {a_groups:,} groups; then tenant B: 10 jobs in "
             f"one group; {POOL} in flight", f"{'lanes':<12} {'B first':>8} {'B last':>8} "
             f"{'Jain (20 claims)':>17}"]
    rows: list[Row] = []
    for two in (True, False):
        say(f"  tenants flood, {'two levels' if two else 'groups only'}")
        began = time.perf_counter()
        got = flood(b, two, a_jobs, a_groups)
        name = "two_level" if two else "groups_only"
        table.append(f"{'two levels' if two else 'groups only':<12} {got['first']:>8.0f} "
                     f"{got['last']:>8.0f} {got['jain']:>17.2f}")
        rows.append(Row(f"tenant_flood_last_b_{name}", f"3  claims until B's 10 jobs all "
                        f"started, {name.replace('_', ' ')}", got["last"], "claims",
                        [got["last"]], 0))
        rows.append(Row(f"tenant_flood_jain_{name}", f"3    Jain index, first 20 claims, "
                        f"{name.replace('_', ' ')}", got["jain"], "x", [got["jain"]], 2))
        say(f"    {time.perf_counter() - began:.1f}s")
    many, under = (10_000, 100) if quick else (100_000, 1_000)
    jobs = many
    costs: dict[str, float | None] = {}
    for label, groups, tenants in (("few", 10, 1), ("many", many, under)):
        say(f"  claim cost, {groups:,} groups under {tenants:,} tenants")
        samples = [claim_cost(b, groups, tenants, jobs) for _ in range(b.sizes.runs)]
        costs[label] = median(samples)
        rows.append(Row(f"tenant_claim_cpu_us_{label}", f"3  Redis CPU per claimed job, "
                        f"{groups:,} groups under {tenants:,} tenants", costs[label], "us/job",
                        list(samples), 1))
    lo, hi = costs["few"], costs["many"]
    rows.append(Row("tenant_claim_cost_ratio", f"3    {many:,} groups / 10 (goal <= 1.2)",
                    hi / lo if lo and hi else None, "x", [hi / lo if lo and hi else None], 2))
    window = 3.0 if quick else 10.0
    say(f"  time mode with tenants, {window:g} s")
    got = time_shares(b, window)
    ratio = got["A"] / got["B"] if got["B"] else None
    met = ratio is not None and abs(ratio - 1) <= 0.10 and not got["dry"]
    table += ["", f"time mode, {POOL} in flight over {window:g} s: tenant A's jobs {A_MS:g} ms "
              f"over {A_GROUPS} groups, tenant B's {B_MS:g} ms in one (20x shorter)",
              f"worker time (server: claim to ack): A {got['A']:.2f} s, B {got['B']:.2f} s, "
              f"A:B {'-' if ratio is None else f'{ratio:.2f}'} (goal 1:1 within 10%: "
              f"{'met' if met else 'not met'}{', a tenant ran dry' if got['dry'] else ''})"]
    rows.append(Row("tenant_time_ratio", "3  time mode: worker time A:B, A's jobs 20x longer "
                    "(goal 1.00 +-0.10)", ratio, "x", [ratio], 2))
    return rows, table
