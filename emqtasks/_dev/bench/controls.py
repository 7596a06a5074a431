"""`emqtasks bench --controls`: what the fairness controls cost and how precise they are.

Claim cost with 10,000 groups all under a default limit and rate vs 10 plain groups (an
in-process claim -> ack-and-claim-next loop, Redis CPU per job); idle Redis commands per
second of a worker whose queue holds 1,000 rate-limited groups parked in gwait vs an empty
queue; and the rate-limit precision (most claims in any window / the rate allowed).
"""

from __future__ import annotations

import time

from .core import CHUNK, Bench, median, say
from .harness import bench_on, report
from .scenarios import Row

MANY = 10_000


def claim_cost(b: Bench, groups: int, controlled: bool, jobs: int,
               mode: str = "turns") -> dict[str, float]:
    """Claim and ack every job in one process: Redis CPU (us) and wall time per job, on a
    queue in the given fairness mode."""
    with b.queue() as (app, tasks):
        if mode != "turns":
            app.set_fairness(mode)
        if controlled:
            app.set_group_defaults(limit=5, rate=(1000, 1.0))
        counter = b.key(app, "cost")
        app.pause()
        b.enqueue_batch(tasks["noop"], counter, groups, jobs)
        app.resume()
        q = app.queue()
        before, began = b.meter.snapshot(), time.perf_counter()
        leases = q.claim(1)
        lease = leases[0] if leases else None
        done = 0
        while lease is not None:
            _, lease = q.ack(lease, "null", claim_next=True)
            done += 1
        seconds = time.perf_counter() - began
        d = b.meter.delta(before, b.meter.snapshot())
    return {"cpu_us": d["cpu"] * 1e6 / max(done, 1), "wall_us": seconds * 1e6 / max(done, 1),
            "jobs": float(done)}


def idle_with_parked_groups(b: Bench, parked: int) -> float:
    """Idle Redis commands/s of a parked worker whose queue holds ``parked`` groups waiting
    out their rate (two jobs each at 1 per hour: the first ran, the second waits)."""
    with b.queue() as (app, tasks):
        counter = b.key(app, "idle")
        if parked:
            app.set_group_defaults(rate=(1, 3600.0))
            calls = [(counter, f"g{i}") for i in range(parked) for _ in range(2)]
            for i in range(0, len(calls), CHUNK):
                tasks["noop"].map(calls[i:i + CHUNK])
        with b.worker(app) as w:
            b.wait_count(counter, parked, timeout=60)
            w.wait_up()
            time.sleep(0.5)
            before, began = b.meter.snapshot(), time.monotonic()
            time.sleep(b.sizes.idle_seconds)
            d = b.meter.delta(before, b.meter.snapshot())
            seconds = time.monotonic() - began
        if parked and app.stats()["groups"]["g0"]["state"] != "rate_limited":
            b.notes.append("the parked groups were not rate_limited during the idle window")
    return b.meter.calls(d) / seconds


def rate_precision(b: Bench, rate: int, jobs: int) -> float:
    """Drain ``jobs`` of one group held to ``rate`` per second: the most claims in any
    one-second window, over ``rate``."""
    with b.queue() as (app, tasks):
        counter = b.key(app, "precision")
        app.set_group_rate("g0", rate, per=1.0)
        app.pause()
        handles = tasks["noop"].map([(counter, "g0")] * jobs)
        with b.worker(app):
            app.resume()
            b.wait_count(counter, jobs, timeout=30 + 2 * jobs / rate)
        stamps = sorted(int((app.job(h.id) or {}).get("started") or 0) for h in handles)
    most = max(sum(1 for u in stamps[i:] if u < t + 1000) for i, t in enumerate(stamps))
    return most / rate


def measure(b: Bench, quick: bool) -> list[Row]:
    jobs = 4_000 if quick else 20_000
    runs = b.sizes.runs
    plain = [claim_cost(b, 10, False, jobs) for _ in range(runs)]
    many = [claim_cost(b, min(MANY, jobs), True, jobs) for _ in range(runs)]
    say("  idle with parked groups")
    idle_empty = [idle_with_parked_groups(b, 0) for _ in range(runs)]
    idle_parked = [idle_with_parked_groups(b, 200 if quick else 1_000) for _ in range(runs)]
    say("  rate precision")
    precision = [rate_precision(b, 20, 100 if quick else 200) for _ in range(runs)]
    cpu_plain = median([r["cpu_us"] for r in plain])
    cpu_many = median([r["cpu_us"] for r in many])
    ratio = cpu_many / cpu_plain if cpu_plain and cpu_many else None
    return [
        Row("claim_cpu_us_10_plain", "1  Redis CPU per claimed job, 10 plain groups",
            cpu_plain, "us/job", [r["cpu_us"] for r in plain], 1),
        Row("claim_cpu_us_many_controlled", f"1  Redis CPU per claimed job, {min(MANY, jobs):,}"
            " groups under a default limit + rate", cpu_many, "us/job",
            [r["cpu_us"] for r in many], 1),
        Row("claim_cost_ratio", "1    ratio (goal <= 1.5)", ratio, "x", [ratio], 2),
        Row("idle_cmds_empty", "2  idle Redis commands/s, empty queue", median(idle_empty),
            "cmds/s", list(idle_empty), 2),
        Row("idle_cmds_parked", "2  idle Redis commands/s, rate-limited groups parked",
            median(idle_parked), "cmds/s", list(idle_parked), 2),
        Row("rate_precision", "3  most claims in any 1 s window / rate allowed (20/s)",
            median(precision), "x", list(precision), 2),
    ]


def run(redis_url: str | None, concurrency: int, runs: int | None, quick: bool,
        as_json: bool) -> None:
    title = "emqtasks bench --controls"
    with bench_on(redis_url, concurrency, runs, quick, title) as (b, version):
        rows = measure(b, quick)
    report(b, rows, version, title, as_json)
