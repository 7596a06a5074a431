"""``emqtasks bench --peers``: the same workloads on emqtasks, Huey and Dramatiq, side by side.

One private ``redis-server`` (or ``--redis-url``), one run, each system in turn, so the
ratios compare figures measured minutes apart on the same machine, not against a number
from another day. Huey and Dramatiq are not dependencies of emqtasks: each runs only where
it is importable (``pip install 'emqtasks[peers]'``); a missing one is skipped with a line
saying how to install it.

Per system, with its own worker as a subprocess (emqtasks ``worker -c 8``; Huey
``huey_consumer -w 8 -k process``; Dramatiq ``--processes 2 --threads 4``: concurrency 8
each, library defaults otherwise) and the task bodies of :mod:`emqtasks.bench_tasks` /
:mod:`emqtasks.bench_peer_tasks` (a no-op job does one INCR to count itself):

1. enqueue 1-by-1: ``delay()`` / calling the Huey task / ``send()``, no worker running;
2. enqueue in bulk: emqtasks ``map()`` (1,000 jobs per round trip); Huey ``map()`` and
   Dramatiq ``group().run()``, which have no batch API (one round trip per job);
3. drain: the bulk jobs wait while the worker starts and warms up, are released at once,
   and the time from the release to the last job's INCR is the drain. emqtasks waits in
   a paused queue (``resume()`` releases it); the peers have no pause, so their jobs are
   enqueued with the library's own API under a staging name (another Huey name / Dramatiq
   namespace) and moved into the worker's queue keys with one MULTI/RENAMENX/EXEC.
   Redis commands and CPU per job come from ``INFO`` deltas over the drain (the bench's
   own polls and the release subtracted); worker CPU from /proc;
4. wake latency of an idle pool: a job enqueued, its start time read back. Dramatiq's
   consumers poll with a backoff of up to 1 s, so its samples are 1.5 s apart (an idle
   pool, as the others' are, whose blocking pops do not depend on the gap);
5. idle cost: commands/s and worker CPU over 5 s of an idle worker (emqtasks: 2 of its
   ticks, so the periodic housekeeping is counted once per tick);
6. quiet tenant: a flood of 5,000 ``seq`` jobs then one quiet job are queued before the
   pool sees them; counted: jobs that started before the quiet one. emqtasks puts the
   quiet job in a group of its own; Huey and Dramatiq have no groups, one FIFO queue.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import click
import redis

from .bench import (
    CHUNK,
    FEW_GROUPS,
    STOP_TIMEOUT,
    UP_TIMEOUT,
    Bench,
    BenchError,
    LoggedProcess,
    Sizes,
    _exit_on_signal,
    _fairness_drill,
    _redacted,
    median,
    open_server,
    percentile,
    say,
    scenario_drain,
    scenario_enqueue_one_by_one,
    scenario_latency_and_idle,
    tree_cpu,
    tree_pss_mb,
    with_client_name,
)
from .cluster import is_cluster_url
from .localserver import LocalRedis

PEERS = ("huey", "dramatiq")
INSTALL = {"huey": "pip install huey", "dramatiq": "pip install 'dramatiq[redis]'"}
PEER_IDLE_SECONDS = (5.0, 2.0)        # full, quick
LATENCY_SAMPLES = (10, 6)             # per run: full (3 runs by default), quick (1 run)
FULL_RUNS = 3


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    unit: str
    digits: int
    better: str   # "higher" or "lower"
    ratio: bool = True   # False where emqtasks/peer compares unlike things


def rows_for(s: Sizes) -> list[Row]:
    c = s.concurrency
    return [
        Row("enqueue_one_jobs_s", f"enqueue 1-by-1 ({s.one_by_one:,} jobs)", "jobs/s", 0,
            "higher"),
        Row("enqueue_bulk_jobs_s", f"enqueue bulk ({s.jobs:,} jobs, API below)", "jobs/s", 0,
            "higher"),
        Row("drain_jobs_s", f"drain {s.jobs:,} no-op jobs, concurrency {c}", "jobs/s", 0,
            "higher"),
        Row("drain_cmds_per_job", "Redis commands per job (drain, incl. INCR)", "cmds/job",
            1, "lower"),
        Row("drain_scripts_per_job", "  of which script calls (EVALSHA)", "calls/job", 2,
            "lower", ratio=False),
        Row("drain_redis_cpu_us_per_job", "Redis CPU per job (drain)", "us/job", 1, "lower"),
        Row("drain_worker_cpu_us_per_job", "worker CPU per job (all its processes)", "us/job",
            0, "lower"),
        Row("wake_latency_p50_ms", "wake latency, idle pool, p50", "ms", 2, "lower"),
        Row("wake_latency_p90_ms", "wake latency, idle pool, p90", "ms", 2, "lower"),
        Row("idle_cmds_per_s", "idle Redis commands per second", "cmds/s", 1, "lower"),
        Row("idle_worker_cpu_ms_per_s", "idle worker CPU", "ms/s", 1, "lower"),
        Row("idle_pss_mb", "idle worker memory (PSS, all its processes)", "MB", 1, "lower"),
        Row("flood_before_quiet", f"quiet tenant: jobs started before it ({s.flood:,} "
            "flood first)", "jobs", 0, "lower"),
    ]


# -- which peers are here -------------------------------------------------------------------
def installed() -> tuple[dict[str, str], list[str]]:
    """(name -> version of each importable peer, a line for each skipped one)."""
    found: dict[str, str] = {}
    skipped: list[str] = []
    for name in PEERS:
        if importlib.util.find_spec(name) is None:
            skipped.append(f"{name} not installed: {INSTALL[name]}")
            continue
        try:
            __import__(name)
            if name == "dramatiq":
                __import__("dramatiq.brokers.redis")
        except Exception as exc:   # installed but broken: say so, measure the rest
            skipped.append(f"{name} does not import ({exc!r}): {INSTALL[name]}")
            continue
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "?"
    return found, skipped


# -- a peer's worker subprocess -------------------------------------------------------------
class PeerWorker(LoggedProcess):
    """A peer's worker command in a session of its own, with bounded start and stop."""

    PROBLEMS = ("ERROR", "CRITICAL", "Traceback")   # the peers log a WARNING per retry

    def __init__(self, label: str, cmd: list[str], env: dict[str, str],
                 log_path: Path) -> None:
        self.label = label
        self.log_path = log_path
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        self.start_seconds: float | None = None

    def wait_up(self, ready: Callable[[], bool], timeout: float = UP_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None:
                raise BenchError(f"the {self.label} worker exited with {self.proc.returncode} "
                                 f"at start:\n{self.output()}")
            if time.monotonic() > deadline:
                raise BenchError(f"the {self.label} worker was not up within {timeout:.0f}s:"
                                 f"\n{self.output()}")
            time.sleep(0.05)
        self.start_seconds = time.monotonic() - self.started

    def cpu(self) -> float:
        return tree_cpu(self.proc.pid)

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM to the main process, a bounded wait, then SIGKILL to whatever is left of
        its process group (its own session: nothing else is in it)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                say(f"  ! the {self.label} worker ignored SIGTERM for {timeout:.0f}s; "
                    "killing it")
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)   # stragglers (forked children)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self.log.close()
        return self.proc.returncode


# -- the peers ------------------------------------------------------------------------------
class Peer:
    """One peer library, on keys of its own (a fresh name per run)."""

    name = ""
    wake_gap = 0.02        # seconds between wake-latency samples
    bulk_api = ""

    def __init__(self, b: Bench, run_id: str) -> None:
        self.b = b
        self.run_id = run_id
        self.worker_name = f"emqpeer-{self.name}-{run_id}"

    def key(self, what: str) -> str:
        return f"emqpeer:{self.run_id}:{self.name}:{what}"

    def worker_env(self, name: str) -> dict[str, str]:
        from . import bench_peer_tasks as t

        env = {k: v for k, v in os.environ.items() if k not in ("EMQ_REDIS_URL", "EMQ_QUEUE")}
        env[t.URL_ENV] = with_client_name(self.b.url, self.worker_name)
        env[t.NAME_ENV] = name
        return env

    def release(self, pairs: list[tuple[str, str]]) -> dict[str, int]:
        """Move the staged keys onto the worker's, atomically; the commands it took.

        The worker's keys must be gone (every earlier job popped and acknowledged): waits
        for that up to 5 s, as RENAMENX will not overwrite them."""
        deadline, looks = time.monotonic() + 5, 1
        while self.b.client.exists(*[dst for _, dst in pairs]):
            looks += 1
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name}: the worker's queue keys are not empty: "
                                 f"{[dst for _, dst in pairs]}")
            time.sleep(0.05)
        pipe = self.b.client.pipeline(transaction=True)
        for src, dst in pairs:
            pipe.renamenx(src, dst)
        try:
            replies = pipe.execute()
        except redis.exceptions.ResponseError as exc:
            raise BenchError(f"{self.name}: cannot release the staged jobs: {exc}") from None
        if not all(replies):
            raise BenchError(f"{self.name}: the worker's queue was not empty at the release")
        return {"exists": looks, "renamenx": len(pairs), "multi": 1, "exec": 1}

    def forget(self, *patterns: str) -> None:
        for pattern in (f"emqpeer:{self.run_id}:*", *patterns):
            keys = list(self.b.client.scan_iter(match=pattern, count=1000))
            for i in range(0, len(keys), 500):
                self.b.client.delete(*keys[i:i + 500])

    # -- what each peer provides
    def stage_one(self, kind: str, args: tuple[Any, ...]) -> None:
        """Enqueue one job under the staging name (no worker sees it)."""
        raise NotImplementedError

    def stage_many(self, kind: str, calls: list[tuple[Any, ...]]) -> None:
        """Enqueue many jobs under the staging name with the library's many-jobs call."""
        raise NotImplementedError

    def discard_staged(self) -> None:
        raise NotImplementedError

    def release_staged(self) -> dict[str, int]:
        """Hand every staged job to the worker at once (see :meth:`release`)."""
        raise NotImplementedError

    def send(self, kind: str, args: tuple[Any, ...]) -> None:
        """Enqueue one job on the worker's queue."""
        raise NotImplementedError

    def start_worker(self) -> PeerWorker:
        raise NotImplementedError

    def ready(self) -> bool:
        """Every worker process is polling its queue."""
        raise NotImplementedError

    def cleanup(self) -> None:
        """Delete this run's keys."""
        raise NotImplementedError


class HueyPeer(Peer):
    name = "huey"
    bulk_api = "map(): no batch API, one LPUSH per job"

    def __init__(self, b: Bench, run_id: str) -> None:
        super().__init__(b, run_id)
        from .bench_peer_tasks import huey_app

        self.qname = f"emqpeer_{run_id}"
        self.live, self.tasks = huey_app(b.url, self.qname)
        self.staged, self.staged_tasks = huey_app(b.url, f"{self.qname}_staged")

    def stage_one(self, kind: str, args: tuple[Any, ...]) -> None:
        self.staged_tasks[kind](*args)

    def stage_many(self, kind: str, calls: list[tuple[Any, ...]]) -> None:
        self.staged_tasks[kind].map(calls)

    def discard_staged(self) -> None:
        self.b.client.delete(self.staged.storage.queue_key)

    def release_staged(self) -> dict[str, int]:
        return self.release([(self.staged.storage.queue_key, self.live.storage.queue_key)])

    def send(self, kind: str, args: tuple[Any, ...]) -> None:
        self.tasks[kind](*args)

    def start_worker(self) -> PeerWorker:
        c = self.b.sizes.concurrency
        cmd = [sys.executable, "-m", "huey.bin.huey_consumer", "emqtasks.bench_peer_tasks.huey",
               "-w", str(c), "-k", "process"]
        return PeerWorker("huey", cmd, self.worker_env(self.qname),
                          self.b.log_dir / f"huey-{self.run_id}.log")

    def ready(self) -> bool:
        """Every worker process blocked in BRPOP on the queue."""
        blocked = [c for c in self.b.client.client_list()
                   if c.get("name") == self.worker_name and c.get("cmd") == "brpop"
                   and "b" in c.get("flags", "")]
        return len(blocked) >= self.b.sizes.concurrency

    def cleanup(self) -> None:
        self.forget(f"huey.*.{self.qname}*")


class DramatiqPeer(Peer):
    name = "dramatiq"
    wake_gap = 1.5      # its consumers' idle poll backs off to 1 s: sample an idle pool
    bulk_api = "group().run(): no batch API, one EVALSHA per job"

    def __init__(self, b: Bench, run_id: str) -> None:
        super().__init__(b, run_id)
        from .bench_peer_tasks import dramatiq_app

        self.processes, self.threads = dramatiq_shape(b.sizes.concurrency)
        self.ns = f"emqpeer-{run_id}"
        self.live, self.actors = dramatiq_app(b.url, self.ns)
        self.staged, self.staged_actors = dramatiq_app(b.url, f"{self.ns}-staged")

    def _keys(self, ns: str) -> list[str]:
        return [f"{ns}:default", f"{ns}:default.msgs"]   # the id list, the message hash

    def stage_one(self, kind: str, args: tuple[Any, ...]) -> None:
        self.staged_actors[kind].send(*args)

    def stage_many(self, kind: str, calls: list[tuple[Any, ...]]) -> None:
        import dramatiq

        actor = self.staged_actors[kind]
        dramatiq.group([actor.message(*a) for a in calls], broker=self.staged).run()

    def discard_staged(self) -> None:
        self.b.client.delete(*self._keys(f"{self.ns}-staged"))

    def release_staged(self) -> dict[str, int]:
        return self.release(list(zip(self._keys(f"{self.ns}-staged"), self._keys(self.ns))))

    def send(self, kind: str, args: tuple[Any, ...]) -> None:
        self.actors[kind].send(*args)

    def start_worker(self) -> PeerWorker:
        cmd = [sys.executable, "-m", "dramatiq", "emqtasks.bench_peer_tasks:dramatiq_worker",
               "--processes", str(self.processes), "--threads", str(self.threads)]
        return PeerWorker("dramatiq", cmd, self.worker_env(self.ns),
                          self.b.log_dir / f"dramatiq-{self.run_id}.log")

    def ready(self) -> bool:
        """Every worker process has polled (its broker id is in the heartbeats set)."""
        ids = set(self.b.client.zrange(f"{self.ns}:__heartbeats__", 0, -1))
        return len(ids - {self.live.broker_id, self.staged.broker_id}) >= self.processes

    def cleanup(self) -> None:
        self.forget(f"{self.ns}*")


PEER_CLASSES: dict[str, type[Peer]] = {"huey": HueyPeer, "dramatiq": DramatiqPeer}


# -- the scenarios ------------------------------------------------------------------------------
@contextmanager
def peer_worker(b: Bench, peer: Peer) -> Iterator[PeerWorker]:
    """The peer's worker, up (every process polling) and warmed up (a burst drained)."""
    w = peer.start_worker()
    try:
        w.wait_up(peer.ready)
        warm, n = peer.key("warm"), 4 * b.sizes.concurrency
        for _ in range(n):
            peer.send("noop", (warm,))
        if b.wait_count(warm, n, timeout=30)[0] is None:
            raise BenchError(f"the {peer.name} warm-up jobs did not run:\n{w.output()}")
        assert w.start_seconds is not None
        b.worker_starts.append(w.start_seconds)
        time.sleep(0.5)
        yield w
    finally:
        began = time.monotonic()
        code = w.stop()
        b.worker_stops.append(time.monotonic() - began)
        problems = w.problems()
        if code not in (0, None, -signal.SIGTERM):
            problems.append(f"worker exited with {code}")
        b.worker_problems.extend(f"[{peer.name}] {p}" for p in problems)


def measure_peer(b: Bench, peer: Peer,
                 idle_seconds: float) -> tuple[dict[str, float | None], dict[str, float]]:
    """The figures, and the drain's Redis commands per job by command."""
    s = b.sizes
    out: dict[str, float | None] = {}
    mix: dict[str, float] = {}

    one = peer.key("one")
    began = time.perf_counter()
    for _ in range(s.one_by_one):
        peer.stage_one("noop", (one,))
    out["enqueue_one_jobs_s"] = s.one_by_one / (time.perf_counter() - began)
    peer.discard_staged()

    done = peer.key("done")
    calls = [(done,)] * s.jobs
    began = time.perf_counter()
    peer.stage_many("noop", calls)   # the drain's backlog, waiting under the staging name
    out["enqueue_bulk_jobs_s"] = s.jobs / (time.perf_counter() - began)

    with peer_worker(b, peer) as w:
        # drain
        before, cpu0 = b.meter.snapshot(), w.cpu()
        began = time.monotonic()
        own = peer.release_staged()
        finished, polls = b.wait_count(done, s.jobs, timeout=30 + s.jobs / 200)
        after, cpu1 = b.meter.snapshot(), w.cpu()
        if finished is None:
            b.notes.append(f"{peer.name}: the drain of {s.jobs} jobs did not finish")
        else:
            d = b.meter.delta(before, after, own={"get": polls, **own})
            mix = {k: round(v / s.jobs, 3) for k, v in sorted(d.items(), key=lambda kv: -kv[1])
                   if k != "cpu" and v / s.jobs >= 0.005}
            out["drain_jobs_s"] = s.jobs / (finished - began)
            out["drain_cmds_per_job"] = b.meter.calls(d) / s.jobs
            out["drain_scripts_per_job"] = b.meter.scripts(d) / s.jobs
            out["drain_redis_cpu_us_per_job"] = d["cpu"] * 1e6 / s.jobs
            out["drain_worker_cpu_us_per_job"] = (cpu1 - cpu0) * 1e6 / s.jobs

        # wake latency of an idle pool
        stamps, latencies = peer.key("stamps"), []
        for _ in range(s.latency_samples):
            time.sleep(peer.wake_gap)
            sent = time.time()
            peer.send("stamp", (stamps,))
            reply = b.client.blpop([stamps], timeout=5)
            if reply is None:
                b.notes.append(f"{peer.name}: a wake-latency job did not start within 5s")
                continue
            latencies.append((float(reply[1]) - sent) * 1000)
        if latencies:
            out["wake_latency_p50_ms"] = statistics.median(latencies)
            out["wake_latency_p90_ms"] = percentile(latencies, 0.9)

        # idle
        time.sleep(max(0.5, peer.wake_gap))
        before, cpu0, began = b.meter.snapshot(), w.cpu(), time.monotonic()
        time.sleep(idle_seconds)
        after, cpu1, seconds = b.meter.snapshot(), w.cpu(), time.monotonic() - began
        out["idle_cmds_per_s"] = b.meter.calls(b.meter.delta(before, after)) / seconds
        out["idle_worker_cpu_ms_per_s"] = (cpu1 - cpu0) * 1000 / seconds
        out["idle_pss_mb"] = tree_pss_mb(w.proc.pid)

        # quiet tenant: the flood, then the quiet job, queued before the pool sees them
        key, flood = peer.key("seq"), s.flood
        peer.stage_many("seq", [(key, "flood")] * flood)
        peer.stage_one("seq", (key, "quiet"))
        peer.release_staged()
        reply = b.client.blpop([f"{key}:quiet"], timeout=30 + flood / 200)
        if reply is None:
            b.notes.append(f"{peer.name}: the quiet job did not run")
        else:
            out["flood_before_quiet"] = int(reply[1]) - 1
        if b.wait_count(key, flood + 1, timeout=30 + flood / 200)[0] is None:
            b.notes.append(f"{peer.name}: the flood did not drain")
    return out, mix


def measure_emqtasks(b: Bench) -> dict[str, float | None]:
    """The same figures from emqtasks' own scenarios (bench.py), -c N, 10 groups."""
    out: dict[str, float | None] = {"enqueue_one_jobs_s": scenario_enqueue_one_by_one(b)}
    drain = scenario_drain(b, FEW_GROUPS)
    out.update({"enqueue_bulk_jobs_s": drain["enqueue"], "drain_jobs_s": drain["drain"],
                "drain_cmds_per_job": drain["cmds"], "drain_scripts_per_job": drain["scripts"],
                "drain_redis_cpu_us_per_job": drain["cpu_us"],
                "drain_worker_cpu_us_per_job": drain["worker_cpu_us"]})
    idle = scenario_latency_and_idle(b)
    out.update({"wake_latency_p50_ms": idle["p50"], "wake_latency_p90_ms": idle["p90"],
                "idle_cmds_per_s": idle["idle_cmds"],
                "idle_worker_cpu_ms_per_s": idle["idle_worker_cpu_ms"],
                "idle_pss_mb": idle["idle_pss_mb"]})
    with b.queue() as (app, tasks), b.worker(app):
        seq = tasks["seq"]
        warm = b.key(app, "seq-warm")
        seq.map([(warm, "warm")] * (4 * b.sizes.concurrency))
        b.wait_count(warm, 4 * b.sizes.concurrency, timeout=30)
        out["flood_before_quiet"] = _fairness_drill(b, app, seq, "peers", True)[0]
    return out


# -- running and reporting ----------------------------------------------------------------------
def run(redis_url: str | None, concurrency: int, jobs: int | None, runs: int | None,
        as_json: bool, quick: bool) -> None:
    if redis_url and is_cluster_url(redis_url):
        raise BenchError("--peers measures one server: not a redis+cluster:// URL")
    versions, skipped = installed()
    for line in skipped:
        say(line)
    if not versions:
        raise BenchError("--peers needs Huey and/or Dramatiq: pip install 'emqtasks[peers]'")
    base = Sizes.of(concurrency, jobs, runs or (1 if quick else FULL_RUNS), quick)
    sizes = replace(base, latency_samples=LATENCY_SAMPLES[quick])
    peer_idle = PEER_IDLE_SECONDS[quick]
    # emqtasks' idle window stays 2 of its ticks (20 s at the default 10 s tick)
    sizes = replace(sizes, idle_seconds=max(peer_idle, sizes.idle_seconds))
    names = ["emqtasks", *versions]
    versions = {"emqtasks": _version("emqtasks"), **versions}

    began, load_before = time.monotonic(), os.getloadavg()
    old_term = signal.signal(signal.SIGTERM, _exit_on_signal)
    server: LocalRedis | None = None
    results: dict[str, list[dict[str, float | None]]] = {n: [] for n in names}
    mixes: dict[str, dict[str, float]] = {}   # a peer's drain commands per job (last run)
    try:
        server, url, redis_version = open_server(redis_url)
        b = Bench(url, sizes, shared=server is None)
        say(f"emqtasks bench --peers: redis {redis_version} at {_redacted(url)}"
            f"{'' if b.shared else ' (private)'}, concurrency {concurrency}, {sizes.jobs:,} "
            f"jobs, {sizes.runs} run(s), {os.cpu_count()} CPUs; "
            + ", ".join(f"{n} {versions[n]}" for n in names) + f"; logs in {b.log_dir}")
        try:
            for r in range(sizes.runs):
                for name in names:
                    say(f"  {name}: run {r + 1}/{sizes.runs}")
                    if name == "emqtasks":
                        results[name].append(measure_emqtasks(b))
                        continue
                    peer = PEER_CLASSES[name](b, uuid.uuid4().hex[:10])
                    try:
                        found, mix = measure_peer(b, peer, peer_idle)
                        results[name].append(found)
                        mixes[name] = mix
                    finally:
                        peer.cleanup()
        except redis.exceptions.RedisError as exc:
            raise BenchError(f"Redis error during the bench: {exc}") from None
        finally:
            b.client.close()
    finally:
        signal.signal(signal.SIGTERM, old_term)
        if server is not None:
            server.close()
    elapsed, load_after = time.monotonic() - began, os.getloadavg()
    load = (f"load average {load_before[0]:.2f} at the start, {load_after[0]:.2f} at the end "
            f"(other work on the machine skews every column)")

    rows = rows_for(sizes)
    figures = {n: {r.key: median([x.get(r.key) for x in results[n]]) for r in rows}
               for n in names}
    peers = [n for n in names if n != "emqtasks"]
    ratios = {p: {r.key: _ratio(figures["emqtasks"][r.key], figures[p][r.key])
                  for r in rows if r.ratio} for p in peers}
    if b.shared:
        b.notes.insert(0, "--redis-url given: INFO counts every client of that server, so "
                          "other traffic inflates the Redis-side figures")
    if not b.notes and not b.worker_problems:
        shutil.rmtree(b.log_dir, ignore_errors=True)
    bulk = {"emqtasks": f"map(): {CHUNK:,} jobs per round trip",
            **{p: PEER_CLASSES[p].bulk_api for p in peers}}
    workers = {"emqtasks": f"emqtasks worker -c {concurrency} ({FEW_GROUPS} groups)",
               "huey": f"huey_consumer -w {concurrency} -k process",
               "dramatiq": "dramatiq --processes {} --threads {}".format(
                   *dramatiq_shape(concurrency))}
    idle_windows = {n: (sizes.idle_seconds if n == "emqtasks" else peer_idle) for n in names}
    if as_json:
        click.echo(json.dumps({
            "mode": "peers", "redis_version": redis_version, "private_server": not b.shared,
            "cpus": os.cpu_count(), "sizes": asdict(sizes), "elapsed_s": round(elapsed, 1),
            "systems": {n: {"version": versions[n], "worker": workers[n], "bulk_api": bulk[n],
                            "idle_seconds": idle_windows[n], "figures": figures[n],
                            "runs": results[n], "drain_commands_per_job": mixes.get(n)}
                        for n in names},
            "ratios": ratios, "skipped": skipped, "notes": b.notes,
            "load_average": {"start": load_before[0], "end": load_after[0]},
            "worker_problems": b.worker_problems[:50],
        }, indent=2))
        return
    click.echo(render(rows, names, versions, figures, ratios,
                      f"emqtasks bench --peers: redis {redis_version}, concurrency "
                      f"{concurrency}, {os.cpu_count()} CPUs, median of {sizes.runs} run(s), "
                      f"{elapsed:.0f}s"))
    click.echo("ratio = emqtasks / peer; 'better' says which way is better for that row")
    click.echo(load)
    for n in names:
        click.echo(f"{n}: {workers[n]}; bulk {bulk[n]}; idle over {idle_windows[n]:g}s")
    for line in skipped:
        click.echo(line)
    for note in b.notes:
        click.echo(f"note: {note}")
    if b.worker_problems:
        click.echo(f"the workers logged {len(b.worker_problems)} error line(s) (logs in "
                   f"{b.log_dir}); the first ones:")
        for line in b.worker_problems[:10]:
            click.echo(f"  {line}")


def render(rows: list[Row], names: list[str], versions: dict[str, str],
           figures: dict[str, dict[str, float | None]],
           ratios: dict[str, dict[str, float | None]], header: str) -> str:
    def fmt(v: float | None, digits: int) -> str:
        return "n/a" if v is None else f"{v:,.{digits}f}"

    peers = [n for n in names if n != "emqtasks"]
    width = max(len(r.label) for r in rows)
    heads = [f"{n} {versions[n]}" for n in names] + [f"emq/{p}" for p in peers]
    colw = max(12, *(len(h) for h in heads))
    line = f"{'scenario':<{width}}  " + "  ".join(f"{h:>{colw}}" for h in heads)
    out = [header, line + "  unit      better", "-" * (len(line) + 18)]
    for r in rows:
        cells = [fmt(figures[n][r.key], r.digits) for n in names]
        cells += [fmt(ratios[p].get(r.key), 2) if r.ratio else "" for p in peers]
        out.append(f"{r.label:<{width}}  " + "  ".join(f"{c:>{colw}}" for c in cells)
                   + f"  {r.unit:<9} {r.better}")
    return "\n".join(out)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def dramatiq_shape(concurrency: int) -> tuple[int, int]:
    """(processes, threads): 2 processes when the concurrency splits evenly, as 2 x 4 = 8."""
    processes = 2 if concurrency >= 2 and concurrency % 2 == 0 else 1
    return processes, concurrency // processes
