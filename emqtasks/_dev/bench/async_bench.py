"""``emqtasks bench --async``: async jobs that await I/O, many at once per child.

1,000 jobs (``--jobs``) that each ``await asyncio.sleep(0.2)``, waiting in a paused queue,
drained by ``emqtasks worker -c 2 --async-concurrency 100`` from ``resume`` to the last
completion: wall time, jobs/s, and the most jobs seen running at once (the jobs count it).
"""

from __future__ import annotations

import json
import time
from typing import Any

import click

from .core import CHUNK, FEW_GROUPS, Bench, Sizes, median, say
from .harness import open_server

CHILDREN, PER_CHILD, NAP = 2, 100, 0.2


def run(redis_url: str | None, jobs: int | None, runs: int | None, as_json: bool,
        quick: bool) -> None:
    n = jobs or 1_000
    sizes = Sizes.of(CHILDREN, n, runs or (1 if quick else 3), quick)
    server, url, version = open_server(redis_url)
    try:
        b = Bench(url, sizes, shared=server is None)
        say(f"emqtasks bench --async: redis {version}, {n} jobs x sleep({NAP}), "
            f"-c {CHILDREN} --async-concurrency {PER_CHILD}, {sizes.runs} run(s)")
        results = [drain_async(b, n) for _ in range(sizes.runs)]
        b.client.close()
    finally:
        if server is not None:
            server.close()
    report(results, n, version, as_json, b)


def drain_async(b: Bench, n: int) -> dict[str, Any]:
    with b.queue() as (app, tasks):
        counter = b.key(app, "naps")
        app.pause()
        calls = [(counter, f"g{i % FEW_GROUPS}", NAP) for i in range(n)]
        for i in range(0, n, CHUNK):
            tasks["nap"].map(calls[i:i + CHUNK])
        with b.worker(app, "--async-concurrency", str(PER_CHILD), concurrency=CHILDREN) as w:
            cpu0, began = w.cpu(), time.monotonic()
            app.resume()
            done, _ = b.wait_count(counter, n, timeout=60 + n * NAP)
            cpu1 = w.cpu()
        peak = int(b.client.get(f"{counter}:peak") or 0)
        wall = None if done is None else done - began
        return {"queue": app.settings.queue, "wall_s": wall,
                "jobs_s": None if not wall else n / wall, "max_concurrent": peak,
                "worker_cpu_us": (cpu1 - cpu0) * 1e6 / n}


def report(results: list[dict[str, Any]], n: int, version: str, as_json: bool,
           b: Bench) -> None:
    figures = {k: median([r[k] for r in results])
               for k in ("wall_s", "jobs_s", "max_concurrent", "worker_cpu_us")}
    if as_json:
        click.echo(json.dumps({"redis_version": version, "jobs": n, "children": CHILDREN,
                               "async_concurrency": PER_CHILD, "sleep_s": NAP,
                               "figures": figures, "runs": results, "notes": b.notes,
                               "worker_problems": b.worker_problems[:50]}, indent=2))
        return
    ideal = n * NAP / (CHILDREN * PER_CHILD)
    click.echo(f"emqtasks bench --async: redis {version}, {n} jobs x await sleep({NAP}), "
               f"-c {CHILDREN} --async-concurrency {PER_CHILD}, median of {len(results)}")
    for r in results:
        click.echo(f"  queue {r['queue']}: wall {_f(r['wall_s'], 2)} s, "
                   f"{_f(r['jobs_s'], 0)} jobs/s, {r['max_concurrent']} at once")
    click.echo(f"wall time          {_f(figures['wall_s'], 2)} s (ideal {ideal:.2f} s)")
    click.echo(f"throughput         {_f(figures['jobs_s'], 0)} jobs/s")
    click.echo(f"max concurrent     {_f(figures['max_concurrent'], 0)} jobs "
               f"(of {CHILDREN * PER_CHILD} slots)")
    click.echo(f"worker CPU per job {_f(figures['worker_cpu_us'], 0)} us")
    for note in b.notes + b.worker_problems[:10]:
        click.echo(f"note: {note}")


def _f(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"
