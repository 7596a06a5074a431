"""The `emqtasks bench` command: pick the bench, run it, print the table or JSON."""

from __future__ import annotations

import json
import shutil
import signal
import time
from dataclasses import asdict
from typing import Any

import click
import redis

from ...cli.common import AdminCommand, Seconds
from ...config import redacted
from ...store.cluster import is_cluster_url
from ..localserver import LocalRedis
from .core import Bench, BenchError, Sizes, median, say
from .harness import exit_on_signal, open_server
from .scenarios import Row, render, run_all


@click.command(cls=AdminCommand)
@click.option("--redis-url", default=None,
              help="benchmark this server (default: a private redis-server on a free port)")
@click.option("-c", "--concurrency", type=click.IntRange(1, 512), default=8, show_default=True,
              help="worker children for the drains, latency and fairness scenarios")
@click.option("--jobs", type=click.IntRange(100), default=None,
              help="jobs per drain and batch enqueue [default: 20000; 2000 with --quick]")
@click.option("--runs", type=click.IntRange(1), default=None,
              help="runs per scenario, medians reported [default: 3; 1 with --quick]")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output on stdout")
@click.option("--quick", is_flag=True, help="small sizes: a smoke test of ~15 s")
@click.option("--cluster", is_flag=True,
              help="only the shard scaling: 1, 2, 3 queues drained at once on one server vs "
                   "a 3-master Redis Cluster (-c 4 per worker unless given; 10000 jobs per "
                   "queue; --redis-url may name a redis+cluster:// cluster)")
@click.option("--controls", is_flag=True,
              help="only the fairness controls: claim cost of 10,000 groups under a default "
                   "limit and rate vs 10 plain groups, idle cost with rate-limited groups "
                   "parked, rate-limit precision")
@click.option("--fairness", is_flag=True,
              help="only turns vs time fairness: the share of a 4-child pool two groups "
                   "(100 ms and 1 ms jobs) get in each mode, and claim cost per job in time "
                   "vs turns mode at 10 and 10,000 groups")
@click.option("--workflows", is_flag=True,
              help="chains and chords: round trips per step, 1,000 chains of 5, a chord of "
                   "10,000")
@click.option("--dashboard", "dashboard_", is_flag=True,
              help="only the dashboard: its pages' response times with 10,000 groups and "
                   "200,000 dead jobs (20,000 with --quick)")
@click.option("--peers", is_flag=True,
              help="the same workloads on Huey and Dramatiq too, side by side, where they "
                   "are installed (pip install 'emqtasks[peers]'); ratios emqtasks/peer")
@click.option("--async", "async_", is_flag=True,
              help="only async jobs: 1,000 (--jobs) that each await sleep(0.2), on -c 2 "
                   "--async-concurrency 100: wall time, jobs/s, most at once")
@click.option("--loop-lag", "loop_lag", is_flag=True,
              help="only the async producers: an ASGI app on uvicorn, rounds (--runs, "
                   "default 5) of 200 concurrent requests that await task.adelay() and "
                   "handle.aget(), then the same with .delay().get(), then none: requests/s, "
                   "p50/p99, and the server loop's lag (needs uvicorn and httpx)")
@click.option("--tracing", "tracing_", is_flag=True,
              help="only what OpenTelemetry costs a worker: drain jobs/s and worker CPU per "
                   "job with it not importable, with the API and no SDK, and with the SDK "
                   "and a batch span processor to an in-memory exporter (needs "
                   "emqtasks[otel] and opentelemetry-sdk)")
@click.option("--chaos", "chaos_seconds", type=Seconds(5, 3600), default=None,
              metavar="SECONDS",
              help="instead of the figures, the chaos soak for SECONDS: jobs keep coming "
                   "while children, masters, connections and a private AOF server are "
                   "killed, poisoned rows written, the server filled, stalled and its "
                   "clock stepped, a master frozen and a pool partitioned; checks no job "
                   "is lost and the history of every operation (exit 1 if a promise "
                   "broke)")
@click.option("--seed", type=int, default=None, help="with --chaos: the seed of its schedule")
@click.option("--sentinel", "sentinel_", is_flag=True,
              help="with --chaos: the soak on a primary, two replicas and three sentinels "
                   "(redis+sentinel://, durable replicas=1), its faults failovers (SIGKILL "
                   "of the primary) and the workers' kills and freezes")
@click.option("--durable", "durable_", is_flag=True,
              help="only durable writes: enqueue p50/p99 and jobs/s, delay() and map() of "
                   "100, with durable off, replicas=1 and aof=True (Valkey), on a private "
                   "primary + replica")
@click.option("--server-cpu", "server_cpu", is_flag=True,
              help="only the Redis server's CPU per enqueue and per drained job, on both "
                   "paths (the module's and the scripts' on a stock server, each a private "
                   "server), with the floor (PING, empty EVALSHA, empty verb) and the split "
                   "per command from INFO commandstats")
def bench(redis_url: str | None, concurrency: int, jobs: int | None, runs: int | None,
          as_json: bool, quick: bool, cluster: bool, controls: bool, fairness: bool,
          peers: bool, async_: bool, chaos_seconds: float | None, seed: int | None,
          workflows: bool = False, dashboard_: bool = False, loop_lag: bool = False,
          tracing_: bool = False, durable_: bool = False, sentinel_: bool = False,
          server_cpu: bool = False) -> None:
    """Measure enqueue and drain throughput, Redis cost, wake latency, idle cost, fairness."""
    if server_cpu:   # its own private servers, one per path: see servercpu.py
        if redis_url:
            raise BenchError("--server-cpu starts a private server per path: it takes no "
                             "--redis-url")
        from . import servercpu as bench_servercpu

        bench_servercpu.run(concurrency, jobs, runs, quick, as_json)
        return
    if durable_:   # its own servers, scenarios and report: see durable.py
        if redis_url:
            raise BenchError("--durable starts a primary and a replica of its own: it takes "
                             "no --redis-url")
        from . import durable as bench_durable

        bench_durable.run(runs, quick, as_json)
        return
    if tracing_:   # its own scenarios and report: see tracing.py
        from . import tracing as bench_tracing

        bench_tracing.run(redis_url, concurrency, jobs, runs, as_json, quick)
        return
    if loop_lag:   # its own scenarios and report: see looplag.py
        from . import looplag

        looplag.run(redis_url, 200, runs or (2 if quick else 5), as_json)
        return
    if dashboard_:   # its own scenarios and report: see dashboard.py
        from . import dashboard as bench_dashboard

        bench_dashboard.run(redis_url, runs, quick, as_json)
        return
    if workflows:   # its own scenarios and report: see workflows.py
        from . import workflows as bench_workflows

        bench_workflows.run(redis_url, concurrency, runs, quick, as_json)
        return
    if controls:   # its own scenarios and report: see controls.py
        from . import controls as bench_controls

        bench_controls.run(redis_url, concurrency, runs, quick, as_json)
        return
    if fairness:   # its own scenarios and report: see fairness.py
        from . import fairness as bench_fairness

        bench_fairness.run(redis_url, concurrency, runs, quick, as_json)
        return
    if sentinel_ and chaos_seconds is None:
        raise BenchError("--sentinel is a mode of the chaos soak: give --chaos SECONDS too")
    if chaos_seconds is not None:
        if redis_url or cluster or peers:
            raise BenchError("--chaos kills and restarts a private server of its own: it "
                             "takes no --redis-url, --cluster or --peers")
        source = click.get_current_context().get_parameter_source("concurrency")
        run_chaos(chaos_seconds, None if source is click.core.ParameterSource.DEFAULT
                  else concurrency, seed, as_json, sentinel_)
        return
    if async_:
        if peers or cluster:
            raise BenchError("--async, --peers and --cluster are separate benches: give one")
        run_async(redis_url, jobs, runs, as_json, quick)
        return
    if peers:   # its own scenarios and report: see bench_peers.py
        if cluster:
            raise BenchError("--peers and --cluster are separate benches: give one")
        from . import peers_run as bench_peers

        bench_peers.run(redis_url, concurrency, jobs, runs, as_json, quick)
        return
    if cluster:
        run_cluster(redis_url, concurrency, jobs, runs, as_json, quick)
        return
    if redis_url and is_cluster_url(redis_url):
        raise BenchError("a redis+cluster:// URL takes --cluster: the other scenarios meter "
                         "one server (INFO, CLIENT LIST)")
    sizes = Sizes.of(concurrency, jobs, runs, quick)
    began = time.monotonic()
    # SIGTERM unwinds like Ctrl-C, so the worker, the queue and the server are cleaned up.
    old_term = signal.signal(signal.SIGTERM, exit_on_signal)
    try:
        b, version, rows = _measure(redis_url, sizes)
    finally:
        signal.signal(signal.SIGTERM, old_term)
    elapsed = time.monotonic() - began
    if b.shared:
        b.notes.insert(0, "--redis-url given: INFO commandstats / cpu count every client of "
                          "that server, so other traffic inflates the Redis-side figures")
    if not b.notes and not b.worker_problems:
        shutil.rmtree(b.log_dir, ignore_errors=True)
    starts, stops = median(list(b.worker_starts)), median(list(b.worker_stops))
    if as_json:
        click.echo(json.dumps({
            "redis_version": version, "private_server": not b.shared,
            "sizes": asdict(sizes), "elapsed_s": round(elapsed, 2),
            "figures": {r.key: r.figure for r in rows},
            "rows": [{"key": r.key, "scenario": r.scenario.split("  ", 1)[-1].strip(),
                      "figure": r.figure, "unit": r.unit, "runs": r.runs} for r in rows],
            "worker_start_s": starts, "worker_stop_s": stops,
            "notes": b.notes, "worker_problems": b.worker_problems[:50],
        }, indent=2))
        return
    click.echo(render(rows, f"emqtasks bench: redis {version}, -c {concurrency}, "
                            f"median of {sizes.runs} run(s), {elapsed:.0f}s"))
    click.echo(f"worker start (to parked) median {starts or 0:.2f}s, "
               f"stop (SIGTERM to exit) median {stops or 0:.2f}s")
    for note in b.notes:
        click.echo(f"note: {note}")
    if b.worker_problems:
        click.echo(f"the workers logged {len(b.worker_problems)} warning(s)/error(s) "
                   f"(logs in {b.log_dir}); the first ones:")
        for line in b.worker_problems[:10]:
            click.echo(f"  {line}")


def run_cluster(redis_url: str | None, concurrency: int, jobs: int | None, runs: int | None,
                as_json: bool, quick: bool) -> None:
    """Its own scenario and report: see bench_cluster.py."""
    from . import cluster as bench_cluster

    source = click.get_current_context().get_parameter_source("concurrency")
    bench_cluster.run(redis_url, 4 if source is click.core.ParameterSource.DEFAULT
                      else concurrency, jobs or (1_000 if quick else 10_000),
                      runs or (1 if quick else 3), as_json)


def run_async(redis_url: str | None, jobs: int | None, runs: int | None, as_json: bool,
              quick: bool) -> None:
    """Its own scenario and report: see async_bench.py."""
    from . import async_bench

    async_bench.run(redis_url, jobs, runs, as_json, quick)
def run_chaos(seconds: float, concurrency: int | None, seed: int | None,
              as_json: bool, sentinel: bool = False) -> None:
    """The chaos soak (see emqtasks/_dev/chaos.py): its report, exit 1 if it failed."""
    from .. import chaos

    options: dict[str, Any] = {"seed": seed, "say": say, "sentinel": sentinel}
    if concurrency is not None:
        options["concurrency"] = concurrency
    old_term = signal.signal(signal.SIGTERM, exit_on_signal)
    try:
        report = chaos.run(seconds, **options)
    finally:
        signal.signal(signal.SIGTERM, old_term)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        for line in report.lines():
            click.echo(line)
    if not report.ok:
        raise SystemExit(1)


def _measure(redis_url: str | None, sizes: Sizes) -> tuple[Bench, str, list[Row]]:
    """Every scenario on the given server, or on a private one started and stopped here."""
    server: LocalRedis | None = None
    try:
        server, url, version = open_server(redis_url)
        b = Bench(url, sizes, shared=server is None)
        say(f"emqtasks bench: redis {version} at {redacted(url)}"
            f"{'' if b.shared else ' (private)'}, -c {sizes.concurrency}, {sizes.jobs} jobs, "
            f"{sizes.runs} run(s); worker logs in {b.log_dir}")
        try:
            return b, version, run_all(b)
        except redis.exceptions.RedisError as exc:
            raise BenchError(f"Redis error during the bench: {exc}") from None
        finally:
            b.client.close()
    finally:
        if server is not None:
            server.close()
