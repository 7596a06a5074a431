"""``emqtasks bench --peers``: the same workloads on emqtasks, Huey and Dramatiq, side by side.

One private ``redis-server`` (or ``--redis-url``), one run, each system in turn, so the
ratios compare figures measured minutes apart on the same machine, not against a number
from another day. Huey and Dramatiq are not dependencies of emqtasks: each runs only where
it is importable (``pip install 'emqtasks[peers]'``); a missing one is skipped with a line
saying how to install it.

Per system, with its own worker as a subprocess (emqtasks ``worker -c 8``; Huey
``huey_consumer -w 8 -k process``; Dramatiq ``--processes 2 --threads 4``: concurrency 8
each, library defaults otherwise) and the task bodies of :mod:`emqtasks._dev.bench.tasks` /
:mod:`emqtasks._dev.bench.peer_tasks` (a no-op job does one INCR to count itself):

0. the round-trip floor, once a run: a raw socket's PING loop and redis-py's;
1. enqueue 1-by-1: ``delay()`` / calling the Huey task / ``send()``, no worker running,
   each call's latency too; then the same calls from 8 threads at once, and (emqtasks: the
   peers have no async API) from 256 coroutines (``adelay()``); see producers.py;
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
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from .core import (
    STOP_TIMEOUT,
    UP_TIMEOUT,
    Bench,
    BenchError,
    LoggedProcess,
    Sizes,
    say,
    tree_cpu,
    with_client_name,
)
from .producers import COROUTINES, THREADS

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
        Row("enqueue_one_p50_us", "  one call, p50", "us", 0, "lower"),
        Row("enqueue_one_p99_us", "  one call, p99", "us", 0, "lower"),
        Row("enqueue_threads_jobs_s", f"enqueue from {THREADS} threads, 1 job a call",
            "jobs/s", 0, "higher"),
        Row("enqueue_threads_p50_us", "  one call, p50", "us", 0, "lower"),
        Row("enqueue_threads_p99_us", "  one call, p99", "us", 0, "lower"),
        Row("enqueue_async_jobs_s", f"enqueue from {COROUTINES} coroutines (async API)",
            "jobs/s", 0, "higher"),
        Row("enqueue_async_p50_us", "  one call, p50", "us", 0, "lower"),
        Row("enqueue_async_p99_us", "  one call, p99", "us", 0, "lower"),
        Row("enqueue_bulk_jobs_s", f"enqueue bulk ({s.jobs:,} jobs, API below)", "jobs/s", 0,
            "higher"),
        Row("drain_jobs_s", f"drain {s.jobs:,} no-op jobs, concurrency {c}", "jobs/s", 0,
            "higher"),
        Row("drain_cmds_per_job", "Redis commands per job (drain, incl. INCR)", "cmds/job",
            1, "lower"),
        Row("drain_scripts_per_job", "  of which verb calls (FCALL, EVALSHA or EMQ.*)",
            "calls/job", 2, "lower", ratio=False),
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
        self.wait_started(ready, timeout, self.label)

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
        from . import peer_tasks as t

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
        from .peer_tasks import huey_app

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
        cmd = [sys.executable, "-m", "huey.bin.huey_consumer",
               "emqtasks._dev.bench.peer_tasks.huey", "-w", str(c), "-k", "process"]
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
        from .peer_tasks import dramatiq_app

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
        cmd = [sys.executable, "-m", "dramatiq", "emqtasks._dev.bench.peer_tasks:dramatiq_worker",
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


def dramatiq_shape(concurrency: int) -> tuple[int, int]:
    """(processes, threads): 2 processes when the concurrency splits evenly, as 2 x 4 = 8."""
    processes = 2 if concurrency >= 2 and concurrency % 2 == 0 else 1
    return processes, concurrency // processes
