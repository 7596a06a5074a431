"""``emqtasks bench --cluster``: do independent queues scale with shards?

Drains 1, 2 and 3 queues at once, one ``emqtasks worker`` per queue, first on one
``redis-server``, then on a 3-master Redis Cluster with each queue on a shard of its own.
Both are private servers on loopback unless ``--redis-url`` names a cluster
(``redis+cluster://...``), which then replaces the private one. Reported per number of
queues: jobs/s of all queues together, the Redis CPU each job cost, and how busy the
busiest Redis process was (percent of one core) -- the figure that says whether a server
or a shard was the bottleneck, or the workers were.

Each job is the bench's ``noop`` (one INCR of a counter in its queue's slot); the workers
and the servers share the machine, so on a box with few cores the workers' CPU, not
Redis, caps the totals: the table says how many cores there were.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import click
import redis

from ...errors import EmqError
from ...producer.app import App
from ...store.cluster import is_cluster, is_cluster_url
from ...store.connection import connect
from ...store.keys import QueueKeys
from ..localcluster import LocalCluster
from ..localserver import LocalRedis
from . import tasks as bench_tasks
from .core import CHUNK, BenchError, WorkerProcess, median, say

QUEUE_COUNTS = (1, 2, 3)


class Target:
    """One deployment under test: its URL, a client, and a plain client per master."""

    def __init__(self, label: str, url: str) -> None:
        self.label = label
        self.url = url
        self.client = connect(url)
        if is_cluster(self.client):
            self.masters = [n.redis_connection for n in self.client.get_primaries()]
        else:
            self.masters = [self.client]

    def names(self, k: int) -> list[str]:
        """k fresh queue names; on a cluster each on a different master."""
        out: list[str] = []
        seen: set[str] = set()
        while len(out) < k:
            name = f"benchc-{uuid.uuid4().hex[:10]}"
            owner = self.node_name(name)
            if owner not in seen or len(seen) >= len(self.masters):
                seen.add(owner)
                out.append(name)
        return out

    def node_name(self, queue: str) -> str:
        if not is_cluster(self.client):
            return "server"
        return str(self.client.get_node_from_key(QueueKeys(queue).ring).name)

    def node_client(self, queue: str) -> Any:
        """A plain client of the server holding the queue (for CLIENT LIST and INFO)."""
        if not is_cluster(self.client):
            return self.client
        return self.client.get_node_from_key(QueueKeys(queue).ring).redis_connection

    def cpu(self) -> list[float]:
        out = []
        for m in self.masters:
            info = m.info("cpu")
            out.append(float(info["used_cpu_sys"]) + float(info["used_cpu_user"]))
        return out

    def close(self) -> None:
        self.client.close()


def drain(t: Target, k: int, jobs: int, concurrency: int, log_dir: Any) -> dict[str, Any]:
    """k queues, ``jobs`` each, k workers started, then all resumed at once and timed."""
    names = t.names(k)
    apps = [App(redis_url=t.url, queue=n) for n in names]
    workers: list[WorkerProcess] = []
    try:
        counters = []
        for app in apps:
            noop = bench_tasks.bind(app)["noop"]
            counter = f"{app.queue().keys.base}bench:done"
            counters.append((app, counter))
            app.pause()
            calls = [(counter, f"g{i % 10}") for i in range(jobs)]
            for i in range(0, jobs, CHUNK):
                noop.map(calls[i:i + CHUNK])
        for name in names:
            workers.append(WorkerProcess(t.url, name, concurrency, t.node_client(name),
                                         log_dir))
        for w in workers:
            w.wait_up()
        cpu0 = t.cpu()
        began = time.monotonic()
        for app in apps:
            app.resume()
        deadline = began + 60 + k * jobs / 200
        while True:
            done = [int(app.client.get(c) or 0) for app, c in counters]
            if all(d >= jobs for d in done):
                break
            if time.monotonic() > deadline:
                raise BenchError(f"{t.label}: {k} queue(s) did not drain ({done} of {jobs} "
                                 f"each); worker log:\n{workers[0].output()}")
            time.sleep(0.01)
        seconds = time.monotonic() - began
        cpu = [b - a for a, b in zip(cpu0, t.cpu())]
        return {"jobs_s": k * jobs / seconds,
                "redis_cpu_us_per_job": sum(cpu) * 1e6 / (k * jobs),
                "busiest_redis_pct": max(cpu) * 100 / seconds,
                "shards_used": len({t.node_name(n) for n in names})}
    finally:
        # SIGTERM to all at once, then each exit: a master's stop waits for its park thread
        # (up to a tick, 1 s at most), so stopping them one after another took that each.
        for w in workers:
            if w.proc.poll() is None:
                w.signal(signal.SIGTERM)
        for w in workers:
            w.stop()
        for app in apps:
            try:
                app.purge()
            finally:
                app.close()


def run(redis_url: str | None, concurrency: int, jobs: int, runs: int, as_json: bool) -> None:
    if redis_url and not is_cluster_url(redis_url):
        raise BenchError("--cluster with --redis-url needs a redis+cluster:// URL")
    log_dir = Path(tempfile.mkdtemp(prefix="emq-bench-cluster-"))
    server: LocalRedis | None = None
    cluster: LocalCluster | None = None
    targets: list[Target] = []
    results: dict[str, dict[int, list[dict[str, Any]]]] = {}
    began = time.monotonic()
    try:
        try:
            server = LocalRedis().start()
            if redis_url is None:
                cluster = LocalCluster(masters=3, replicas=0).start()
        except EmqError as exc:
            raise BenchError(f"cannot start the private servers: {exc}") from None
        targets = [Target("one server", server.url),
                   Target("cluster", redis_url or cluster.url)]  # type: ignore[union-attr]
        say(f"emqtasks bench --cluster: {jobs:,} jobs per queue, one worker (-c "
            f"{concurrency}) per queue, {runs} run(s), {os.cpu_count()} CPUs; cluster of "
            f"{len(targets[1].masters)} masters; worker logs in {log_dir}")
        for t in targets:
            results[t.label] = {}
            for k in QUEUE_COUNTS:
                results[t.label][k] = []
                for r in range(runs):
                    say(f"  {t.label}: {k} queue(s), run {r + 1}/{runs}")
                    results[t.label][k].append(drain(t, k, jobs, concurrency, log_dir))
    except redis.exceptions.RedisError as exc:
        raise BenchError(f"Redis error during the bench: {exc}") from None
    finally:
        for t in targets:
            t.close()
        if server is not None:
            server.close()
        if cluster is not None:
            cluster.close()

    rows = table(results)
    report(rows, results, jobs, concurrency, runs, time.monotonic() - began, as_json)


def table(results: dict[str, dict[int, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """One row per queue count: medians of both targets, side by side."""

    def fig(label: str, k: int, field: str) -> float | None:
        return median([r[field] for r in results[label][k]])

    rows = []
    for k in QUEUE_COUNTS:
        one, clu = fig("one server", k, "jobs_s"), fig("cluster", k, "jobs_s")
        rows.append({
            "queues": k, "one_server_jobs_s": one, "cluster_jobs_s": clu,
            "cluster_vs_one_server": clu / one if one and clu else None,
            "one_server_busiest_redis_pct": fig("one server", k, "busiest_redis_pct"),
            "cluster_busiest_shard_pct": fig("cluster", k, "busiest_redis_pct"),
            "one_server_redis_cpu_us_per_job": fig("one server", k, "redis_cpu_us_per_job"),
            "cluster_redis_cpu_us_per_job": fig("cluster", k, "redis_cpu_us_per_job"),
            "cluster_shards_used": results["cluster"][k][0]["shards_used"],
        })
    return rows


def report(rows: list[dict[str, Any]], results: dict[str, Any], jobs: int, concurrency: int,
           runs: int, elapsed: float, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"jobs_per_queue": jobs, "concurrency": concurrency,
                               "runs": runs, "cpus": os.cpu_count(),
                               "elapsed_s": round(elapsed, 1), "rows": rows,
                               "all_runs": results}, indent=2, default=str))
        return
    click.echo(f"emqtasks bench --cluster: {jobs:,} jobs per queue, one worker -c "
               f"{concurrency} per queue, median of {runs} run(s), {os.cpu_count()} CPUs, "
               f"{elapsed:.0f}s")
    click.echo(f"{'queues':>6}  {'one server':>12}  {'cluster':>12}  {'ratio':>6}  "
               f"{'busiest Redis, % of a core':>27}  {'Redis CPU us/job':>17}")
    click.echo(f"{'':>6}  {'jobs/s':>12}  {'jobs/s':>12}  {'':>6}  "
               f"{'server / busiest shard':>27}  {'server / cluster':>17}")

    def f(v: float | None, d: int = 0) -> str:
        return "n/a" if v is None else f"{v:,.{d}f}"

    for row in rows:
        busiest = (f"{f(row['one_server_busiest_redis_pct'])} / "
                   f"{f(row['cluster_busiest_shard_pct'])}")
        per_job = (f"{f(row['one_server_redis_cpu_us_per_job'], 1)} / "
                   f"{f(row['cluster_redis_cpu_us_per_job'], 1)}")
        click.echo(f"{row['queues']:>6}  {f(row['one_server_jobs_s']):>12}  "
                   f"{f(row['cluster_jobs_s']):>12}  {f(row['cluster_vs_one_server'], 2):>6}  "
                   f"{busiest:>27}  {per_job:>17}")
