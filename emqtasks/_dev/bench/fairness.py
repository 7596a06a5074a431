"""`emqtasks bench --fairness`: turns against time, the share of the pool each group gets.

The share table: two groups backlogged on one queue, ``heavy`` running 100 ms jobs and
``light`` 1 ms jobs, a 4-child pool, in ``turns`` mode then in ``time`` mode. Over a window
(after a first second the estimates learn in) each group's jobs run, its worker time as the
server measures it (claim to ack, what the time mode shares) and as the tasks measure it
(their own sleep), and its share of the pool. Then the claim cost per job in time mode
against turns, at 10 and 10,000 groups (an in-process claim -> ack-and-claim-next loop,
Redis CPU per job, as in --controls). Then tenants (bench/tenants.py): a flood spread over
many groups by one tenant against another's few jobs, two-level lanes against groups only,
and the claim cost at many groups under many tenants.
"""

from __future__ import annotations

import time

from .controls import claim_cost
from .core import CHUNK, Bench, median, say
from .harness import bench_on, report
from .scenarios import Row

POOL = 4
HEAVY_MS, LIGHT_MS = 100.0, 1.0


def _server_ms(b: Bench) -> int:
    secs, micros = b.client.time()
    return int(secs) * 1000 + int(micros) // 1000


def shares(b: Bench, mode: str, window: float) -> dict[str, dict[str, float]]:
    """Per group over the window: jobs, server-measured seconds, task-measured seconds."""
    with b.queue() as (app, tasks):
        app.set_fairness(mode)
        counter = b.key(app, "work")
        app.pause()
        n_heavy = int(window * POOL * 1000 / HEAVY_MS) + 200
        n_light = int(window * POOL * 1000 / LIGHT_MS) + 2000
        ids: dict[str, list[str]] = {"heavy": [], "light": []}
        for group, ms, n in (("heavy", HEAVY_MS, n_heavy), ("light", LIGHT_MS, n_light)):
            calls = [(counter, group, ms)] * n
            for i in range(0, n, CHUNK):
                ids[group] += [h.id for h in tasks["work"].map(calls[i:i + CHUNK])]
        with b.worker(app, concurrency=POOL):
            app.resume()
            time.sleep(1.0)
            start = _server_ms(b)
            before = b.client.hgetall(f"{counter}:task"), b.client.hgetall(f"{counter}:jobs")
            time.sleep(window)
            end = _server_ms(b)
            after = b.client.hgetall(f"{counter}:task"), b.client.hgetall(f"{counter}:jobs")
            left = {g: app.lane(g)["pending"] for g in ids}
        if not all(left.values()):
            b.notes.append(f"{mode}: a group ran dry during the window ({left})")
        out: dict[str, dict[str, float]] = {}
        for group, group_ids in ids.items():
            pipe = b.client.pipeline(transaction=False)
            for job_id in group_ids:
                pipe.hmget(app.queue().keys.job(job_id), "started", "finished")
            held = 0
            for started, finished in pipe.execute():
                if started and finished and int(started) < end and int(finished) > start:
                    held += min(int(finished), end) - max(int(started), start)
            out[group] = {
                "jobs": float(after[1].get(group, 0)) - float(before[1].get(group, 0)),
                "server_s": held / 1000,
                "task_s": float(after[0].get(group, 0)) - float(before[0].get(group, 0)),
            }
    return out


def measure(b: Bench, quick: bool) -> tuple[list[Row], list[str]]:
    window = 2.0 if quick else 10.0
    table: list[str] = [f"share of a {POOL}-child pool over {window:g} s, both groups "
                        f"backlogged (server: claim to ack; task: the job's own time)",
                        f"{'mode':<6} {'group':<18} {'jobs':>7} {'server s':>9} "
                        f"{'share':>6} {'task s':>8} {'share':>6}"]
    rows: list[Row] = []
    for mode in ("turns", "time"):
        say(f"  shares, {mode} mode")
        got = shares(b, mode, window)
        total_server = sum(v["server_s"] for v in got.values()) or 1.0
        total_task = sum(v["task_s"] for v in got.values()) or 1.0
        for group, ms in (("heavy", HEAVY_MS), ("light", LIGHT_MS)):
            v = got[group]
            table.append(f"{mode:<6} {f'{group} ({ms:g} ms jobs)':<18} {v['jobs']:>7.0f} "
                         f"{v['server_s']:>9.2f} {v['server_s'] / total_server:>6.0%} "
                         f"{v['task_s']:>8.2f} {v['task_s'] / total_task:>6.0%}")
        share = got["light"]["server_s"] / total_server
        rows.append(Row(f"light_share_{mode}", f"1  light's share of the pool, {mode} mode",
                        share, "x", [share], 2))
    jobs = 2_000 if quick else 20_000
    runs = b.sizes.runs
    cost: dict[tuple[str, int], float | None] = {}
    for mode in ("turns", "time"):
        for groups in (10, min(10_000, jobs)):
            say(f"  claim cost, {mode} mode, {groups:,} groups")
            samples = [claim_cost(b, groups, False, jobs, mode) for _ in range(runs)]
            cost[(mode, groups)] = median([s["cpu_us"] for s in samples])
            rows.append(Row(f"claim_cpu_us_{mode}_{groups}", f"2  Redis CPU per claimed job, "
                            f"{mode} mode, {groups:,} groups", cost[(mode, groups)], "us/job",
                            [s["cpu_us"] for s in samples], 1))
    many = min(10_000, jobs)
    for mode in ("turns", "time"):
        lo, hi = cost[(mode, 10)], cost[(mode, many)]
        ratio = hi / lo if lo and hi else None
        rows.append(Row(f"claim_cost_ratio_{mode}", f"2    {mode}: {many:,} / 10 groups "
                        f"(goal <= 1.5)", ratio, "x", [ratio], 2))
    lo, hi = cost[("turns", 10)], cost[("time", 10)]
    rows.append(Row("claim_cost_time_vs_turns", "2    time / turns, 10 groups",
                    hi / lo if lo and hi else None, "x", [hi / lo if lo and hi else None], 2))
    return rows, table


def run(redis_url: str | None, concurrency: int, runs: int | None, quick: bool,
        as_json: bool) -> None:
    from . import tenants

    title = "emqtasks bench --fairness"
    with bench_on(redis_url, concurrency, runs, quick, title) as (b, version):
        rows, table = measure(b, quick)
        more, lines = tenants.measure(b, quick)
        rows += more
        table += ["", *lines]
    report(b, rows, version, title, as_json, extra={"shares": table}, before=table)
