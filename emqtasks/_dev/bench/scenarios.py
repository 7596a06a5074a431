"""The emqtasks scenarios of `emqtasks bench`: enqueue, drain, wake latency, idle cost, fairness."""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from ...producer.app import App
from .core import CHUNK, FEW_GROUPS, Bench, BenchError, median, percentile, say, tree_pss_mb


# -- the scenarios ----------------------------------------------------------------------------
def scenario_enqueue_one_by_one(b: Bench) -> float:
    with b.queue() as (app, tasks):
        counter, noop = b.key(app, "done"), tasks["noop"]
        n = b.sizes.one_by_one
        groups = [f"g{i % FEW_GROUPS}" for i in range(n)]
        began = time.perf_counter()
        for g in groups:
            noop.delay(counter, g)
        return n / (time.perf_counter() - began)


def scenario_drain(b: Bench, groups: int, history: bool = True) -> dict[str, float | None]:
    """Enqueue into a paused queue, start the worker, resume, time the drain (with the
    verbs' history counters off when ``history`` is False)."""
    n = b.sizes.jobs
    with b.queue() as (app, tasks):
        counter = b.key(app, "done")
        if not history:
            app.set_history(0)
        app.pause()
        enqueue_rate = b.enqueue_batch(tasks["noop"], counter, groups, n)
        with b.worker(app) as w:
            before, cpu0 = b.meter.snapshot(), w.cpu()
            began = time.monotonic()
            app.resume()
            done, polls = b.wait_count(counter, n, timeout=30 + n / 200)
            after, cpu1 = b.meter.snapshot(), w.cpu()
            if done is None:
                b.notes.append(f"drain of {n} jobs over {groups} groups did not finish; "
                               f"stats: {_short_stats(app)}")
                return {"enqueue": enqueue_rate, "drain": None, "cmds": None,
                        "scripts": None, "cpu_us": None, "worker_cpu_us": None}
            d = b.meter.delta(before, after, own={"get": polls})
        return {
            "enqueue": enqueue_rate,
            "drain": n / (done - began),
            "cmds": b.meter.calls(d) / n,
            "scripts": b.meter.scripts(d) / n,
            "cpu_us": d["cpu"] * 1e6 / n,
            "worker_cpu_us": (cpu1 - cpu0) * 1e6 / n,
        }


def scenario_latency_and_idle(b: Bench) -> dict[str, float | None]:
    """Wake latency of single jobs on an idle pool, then the cost of staying idle."""
    s = b.sizes
    with b.queue() as (app, tasks), b.worker(app) as w:
        key, stamp = b.key(app, "stamps"), tasks["stamp"]
        # Warm up: a burst wakes every child, so each opens its task connection untimed.
        warm = 4 * s.concurrency
        stamp.map([(key,)] * warm)
        for _ in range(warm):
            if b.client.blpop([key], timeout=10) is None:
                raise BenchError("the warm-up jobs of the wake-latency scenario did not run:\n"
                                 + w.output())
        time.sleep(0.2)
        latencies: list[float] = []
        before = b.meter.snapshot()
        for _ in range(s.latency_samples):
            sent = time.time()
            stamp.delay(key)
            reply = b.client.blpop([key], timeout=5)
            if reply is None:
                b.notes.append("a wake-latency job did not start within 5s")
                continue
            latencies.append((float(reply[1]) - sent) * 1000)
            time.sleep(0.02)
        after = b.meter.snapshot()
        d = b.meter.delta(before, after, own={"blpop": s.latency_samples})
        per_job = b.meter.calls(d) / max(len(latencies), 1)
        scripts_per_job = b.meter.scripts(d) / max(len(latencies), 1)

        time.sleep(0.5)   # let every child report idle and the master park
        before, cpu0, began = b.meter.snapshot(), w.cpu(), time.monotonic()
        time.sleep(s.idle_seconds)
        after, cpu1, seconds = b.meter.snapshot(), w.cpu(), time.monotonic() - began
        d = b.meter.delta(before, after)
        pss = tree_pss_mb(w.proc.pid)
    return {
        "idle_pss_mb": pss,
        "p50": statistics.median(latencies) if latencies else None,
        "p90": percentile(latencies, 0.9) if latencies else None,
        "max": max(latencies) if latencies else None,
        "cmds_per_single_job": per_job,
        "scripts_per_single_job": scripts_per_job,
        "idle_cmds": b.meter.calls(d) / seconds,
        "idle_round_trips": (b.meter.scripts(d) + d.get("blpop", 0.0)) / seconds,
        "idle_worker_cpu_ms": (cpu1 - cpu0) * 1000 / seconds,
    }


def scenario_fairness(b: Bench) -> dict[str, float | None]:
    """A flood in one group, then one job of a quiet group: how many flood jobs go first.

    Backlog: flood and quiet both wait in a paused queue, then the pool starts on both;
    counted: flood jobs that started before the quiet one. Live: the pool is already
    draining the flood when the quiet job arrives; counted: flood jobs that started after
    the quiet job's row existed and before it started (exact, see bench_tasks.seq).
    Each run does ``trials`` of each on one worker and keeps the median.
    """
    backlog: list[float | None] = []
    leased: list[float | None] = []
    live: list[float | None] = []
    with b.queue() as (app, tasks), b.worker(app):
        seq = tasks["seq"]
        # Warm up: every child opens its task connection before anything is timed.
        warm = b.key(app, "seq-warm")
        seq.map([(warm, "warm")] * (4 * b.sizes.concurrency))
        b.wait_count(warm, 4 * b.sizes.concurrency, timeout=30)
        for trial in range(b.sizes.trials):
            started, claimed = fairness_drill(b, app, seq, f"backlog-{trial}", True)
            backlog.append(started)
            leased.append(claimed)
            live.append(fairness_drill(b, app, seq, f"live-{trial}", False)[0])
    return {"backlog": median(backlog), "leased": median(leased), "live": median(live)}


def fairness_drill(b: Bench, app: App, seq: Any, name: str,
                    paused: bool) -> tuple[int | None, int | None]:
    """One drill: (flood jobs started before the quiet one or after it came, and, for the
    backlog drill, flood jobs leased in an earlier millisecond than the quiet one)."""
    flood, key = b.sizes.flood, b.key(app, f"seq-{name}")
    q = app.queue()
    quiet_id = f"bench-quiet-{uuid.uuid4().hex[:12]}"
    mark = "" if paused else q.keys.job(quiet_id)
    if paused:
        app.pause()
    ids: list[str] = []
    for i in range(0, flood, CHUNK):
        ids += [h.id for h in seq.map([(key, "flood", mark)] * min(CHUNK, flood - i))]
    quiet = seq.apply_async(args=(key, "quiet"), job_id=quiet_id)
    if paused:
        app.resume()
    figure: int | None = None
    try:
        number, after_mark = quiet.get(timeout=30)
        figure = number - 1 if paused else after_mark
        if not paused and number > flood:
            b.notes.append(f"fairness ({name}): the flood drained before the quiet job came")
    except Exception as exc:
        b.notes.append(f"fairness ({name}): the quiet job did not finish: {exc!r}; "
                       f"{_short_stats(app)}")
    if b.wait_count(key, flood + 1, timeout=30 + flood / 200)[0] is None:
        b.notes.append(f"fairness ({name}): the flood did not drain; {_short_stats(app)}")
        return figure, None
    if not paused or figure is None:
        return figure, None
    # The lease order, from the rows' claim times (server ms): tells the ring's order
    # apart from the OS scheduling the children that hold the leases.
    pipe = b.client.pipeline(transaction=False)
    for job_id in [quiet_id, *ids]:
        pipe.hget(q.keys.job(job_id), "started")
    stamps = pipe.execute()
    if any(v is None for v in stamps):
        return figure, None
    quiet_ms = int(stamps[0])
    return figure, sum(1 for v in stamps[1:] if int(v) < quiet_ms)


def _short_stats(app: App) -> str:
    try:
        s = app.stats()
    except redis.exceptions.RedisError as exc:
        return f"(stats failed: {exc})"
    return (f"pending {s['pending']}, active {s['active']}, delayed {s['delayed']}, "
            f"dead {s['dead']}, ring {s['ring']}, paused {s['paused']}")


# -- running and reporting -----------------------------------------------------------------
@dataclass
class Row:
    key: str
    scenario: str
    figure: float | None
    unit: str
    runs: list[float | None]
    digits: int = 0


def measure_all(b: Bench) -> dict[str, list[Any]]:
    """Every scenario, ``runs`` times each: scenario name -> the result of each run."""
    s = b.sizes
    scenarios: dict[str, tuple[str, Callable[[], Any]]] = {
        "one": ("enqueue 1-by-1", lambda: scenario_enqueue_one_by_one(b)),
        "few": (f"drain, {FEW_GROUPS} groups", lambda: scenario_drain(b, FEW_GROUPS)),
        "nohist": (f"drain, {FEW_GROUPS} groups, history off",
                   lambda: scenario_drain(b, FEW_GROUPS, history=False)),
        "single": ("drain, 1 group", lambda: scenario_drain(b, 1)),
        "many": (f"drain, {s.many_groups} groups", lambda: scenario_drain(b, s.many_groups)),
        "idle": ("wake latency + idle", lambda: scenario_latency_and_idle(b)),
        "fair": ("fairness", lambda: scenario_fairness(b)),
    }
    results: dict[str, list[Any]] = {}
    for name, (label, fn) in scenarios.items():
        results[name] = []
        for r in range(s.runs):
            say(f"  {label}: run {r + 1}/{s.runs}")
            results[name].append(fn())
    return results


def row_specs(b: Bench) -> list[tuple[str, str, str, str | None, str, int]]:
    """(key, label, scenario, field of its result or None, unit, digits) per table row."""
    s = b.sizes
    c, n, mg, few = s.concurrency, s.jobs, f"{s.many_groups:,}", FEW_GROUPS
    return [
        ("enqueue_one_jobs_s", f"1  enqueue 1-by-1 (delay, {s.one_by_one:,} jobs)",
         "one", None, "jobs/s", 0),
        ("enqueue_batch_jobs_s", f"2  enqueue batch (map x{CHUNK}, {n:,} jobs)",
         "few", "enqueue", "jobs/s", 0),
        ("drain_10_groups_jobs_s", f"3  drain -c {c}, {n:,} jobs in {few} groups",
         "few", "drain", "jobs/s", 0),
        ("drain_1_group_jobs_s", f"3  drain -c {c}, {n:,} jobs in 1 group",
         "single", "drain", "jobs/s", 0),
        ("drain_cmds_per_job", f"4  Redis commands per job (drain, {few} groups, "
         "incl. the task's INCR)", "few", "cmds", "cmds/job", 1),
        ("drain_scripts_per_job", "4    of which verb calls (FCALL, EVALSHA or EMQ.*)",
         "few", "scripts", "calls/job", 2),
        ("drain_cpu_us_per_job", f"4  Redis CPU per job (drain, {few} groups)",
         "few", "cpu_us", "us/job", 1),
        ("drain_no_history_cpu_us_per_job", f"4  Redis CPU per job (drain, {few} groups, "
         "history off)", "nohist", "cpu_us", "us/job", 1),
        ("drain_1_group_cpu_us_per_job", "4  Redis CPU per job (drain, 1 group)",
         "single", "cpu_us", "us/job", 1),
        ("drain_worker_cpu_us_per_job", f"4  worker CPU per job (master + {c} children)",
         "few", "worker_cpu_us", "us/job", 0),
        ("wake_latency_p50_ms", "5  wake latency, idle pool, p50", "idle", "p50", "ms", 2),
        ("wake_latency_p90_ms", "5  wake latency, idle pool, p90", "idle", "p90", "ms", 2),
        ("single_job_cmds", "5  Redis commands per lone job (idle pool, incl. its enqueue)",
         "idle", "cmds_per_single_job", "cmds/job", 1),
        ("single_job_scripts", "5    of which verb calls (FCALL, EVALSHA or EMQ.*)",
         "idle", "scripts_per_single_job", "calls/job", 1),
        ("idle_cmds_per_s", f"6  idle Redis commands per second, 1 master "
         f"({s.idle_seconds:g}s)", "idle", "idle_cmds", "cmds/s", 1),
        ("idle_round_trips_per_s", "6    of which round trips (EVALSHA + BLPOP)",
         "idle", "idle_round_trips", "calls/s", 1),
        ("idle_worker_cpu_ms_per_s", "6  idle worker CPU (master + children)",
         "idle", "idle_worker_cpu_ms", "ms/s", 1),
        ("idle_pss_mb", f"6  memory of master + {c} idle children (PSS)",
         "idle", "idle_pss_mb", "MB", 1),
        ("fairness_flood_before_quiet", f"7  flood jobs started before quiet ({s.flood:,} "
         "backlog, target < 10)", "fair", "backlog", "jobs", 0),
        ("fairness_flood_leased_before_quiet", "7    flood jobs leased in an earlier ms "
         "than quiet", "fair", "leased", "jobs", 0),
        ("fairness_live_flood_between", "7  flood jobs started between quiet enqueue and "
         "start (live)", "fair", "live", "jobs", 0),
        ("enqueue_batch_many_groups_jobs_s", f"8  enqueue batch, {n:,} jobs in {mg} groups",
         "many", "enqueue", "jobs/s", 0),
        ("drain_many_groups_jobs_s", f"8  drain -c {c}, {n:,} jobs in {mg} groups",
         "many", "drain", "jobs/s", 0),
        ("drain_many_groups_cmds_per_job", f"8  Redis commands per job (drain, {mg} groups)",
         "many", "cmds", "cmds/job", 1),
        ("drain_many_groups_cpu_us_per_job", f"8  Redis CPU per job (drain, {mg} groups)",
         "many", "cpu_us", "us/job", 1),
    ]


def run_all(b: Bench) -> list[Row]:
    results = measure_all(b)
    rows = []
    for key, label, scenario, field, unit, digits in row_specs(b):
        runs = [r if field is None else r[field] for r in results[scenario]]
        rows.append(Row(key, label, median(runs), unit, runs, digits))
    by_key = {r.key: r.figure for r in rows}
    mg = f"{b.sizes.many_groups:,}"
    for what, many_key, few_key in (
            ("enqueue", "enqueue_batch_many_groups_jobs_s", "enqueue_batch_jobs_s"),
            ("drain", "drain_many_groups_jobs_s", "drain_10_groups_jobs_s")):
        hi, lo = by_key[many_key], by_key[few_key]
        ratio = hi / lo if hi and lo else None
        rows.append(Row(f"ratio_{what}_many_vs_few_groups",
                        f"8  {what} ratio, {mg} groups / {FEW_GROUPS} groups", ratio, "x",
                        [ratio], 2))
    return rows


def render(rows: list[Row], header: str) -> str:
    def fmt(r: Row) -> str:
        return "n/a" if r.figure is None else f"{r.figure:,.{r.digits}f}"

    width = max(len(r.scenario) for r in rows)
    lines = [header, f"{'scenario':<{width}}  {'figure':>10}  unit", "-" * (width + 24)]
    lines += [f"{r.scenario:<{width}}  {fmt(r):>10}  {r.unit}" for r in rows]
    return "\n".join(lines)


