"""``emqtasks bench``: throughput, Redis-side cost, wake latency, idle cost and fairness.

Every scenario runs on a fresh random queue, purged afterwards, against a private
``redis-server`` (default) or a given URL. Workers are real ``emqtasks worker`` subprocesses
running :mod:`emqtasks.bench_tasks`; each job counts itself with one INCR, and the bench
waits by polling that counter. Redis-side cost comes from ``INFO commandstats`` and
``INFO cpu`` deltas, which count every command of every client: on a shared server other
traffic shows up in them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import click
import redis

from .app import App, connect
from .cluster import is_cluster_url
from .config import WorkerSettings
from .errors import EmqError
from .localserver import LocalRedis

CHUNK = 1000            # jobs per batch enqueue (one round trip each)
FEW_GROUPS = 10
MANY_GROUPS = 10_000
POLL = 0.02             # seconds between looks at a completion counter
UP_TIMEOUT = 30.0       # a worker must be parked within this long
STOP_TIMEOUT = 15.0     # SIGTERM, then SIGKILL of its process group


@dataclass(frozen=True)
class Sizes:
    """How much work each scenario does."""

    concurrency: int
    jobs: int               # drains and batch enqueues
    one_by_one: int         # jobs enqueued with delay() in a loop
    runs: int
    latency_samples: int
    idle_seconds: float
    flood: int
    many_groups: int
    trials: int             # fairness drills of each kind per run
    tick: float             # the worker's --tick: the idle figure is measured over 2 ticks

    @classmethod
    def of(cls, concurrency: int, jobs: int | None, runs: int | None, quick: bool) -> Sizes:
        if quick:
            jobs = jobs or 2_000
            return cls(concurrency, jobs, min(500, jobs), runs or 1, 20, 2.0, 1_000,
                       min(MANY_GROUPS, jobs), 3, 1.0)
        jobs = jobs or 20_000
        tick = WorkerSettings().tick   # the production default, so idle cost is what users get
        return cls(concurrency, jobs, min(5_000, jobs), runs or 3, 50, 2 * tick, 5_000,
                   min(MANY_GROUPS, jobs), 1, tick)


# -- measuring ----------------------------------------------------------------------------
class ServerMeter:
    """Snapshots of the server's command counts and CPU time (one INFO call each)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def snapshot(self) -> dict[str, float]:
        # One call; "all" rather than "cpu commandstats", which redis 6.2 refuses.
        info = self.client.execute_command("INFO", "all")
        out = {"cpu": float(info["used_cpu_sys"]) + float(info["used_cpu_user"])}
        for key, row in info.items():
            if key.startswith("cmdstat_") and key != "cmdstat_info":  # INFO is the bench's
                out[key[len("cmdstat_"):]] = float(row["calls"])
        return out

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float],
              own: dict[str, int] | None = None) -> dict[str, float]:
        """Per-command call deltas and 'cpu' seconds, less the bench's own ``own`` calls."""
        d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in set(before) | set(after)}
        for cmd, n in (own or {}).items():
            d[cmd] = d.get(cmd, 0.0) - n
        return d

    @staticmethod
    def calls(delta: dict[str, float]) -> float:
        return sum(v for k, v in delta.items() if k != "cpu")

    @staticmethod
    def scripts(delta: dict[str, float]) -> float:
        return delta.get("evalsha", 0.0) + delta.get("eval", 0.0)


def _proc_cpu(pid: int) -> tuple[int, float] | None:
    """(parent pid, user+system CPU seconds) of a process from /proc, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks


def tree_pss_mb(root: int) -> float | None:
    """Proportional set size of a process and its children, MB (shared pages split between
    the processes sharing them), from /proc/PID/smaps_rollup; None where unreadable."""
    try:
        kids = Path(f"/proc/{root}/task/{root}/children").read_text().split()
        total_kb = 0
        for pid in [root, *map(int, kids)]:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kb += int(line.split()[1])
        return total_kb / 1024
    except (OSError, ValueError):
        return None


def tree_cpu(root: int) -> float:
    """CPU seconds used so far by a process and its living descendants (Linux; else 0)."""
    if not Path("/proc").is_dir():
        return 0.0
    procs: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            row = _proc_cpu(int(entry))
            if row is not None:
                procs[int(entry)] = row
    total, todo, seen = 0.0, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in procs:
            continue
        seen.add(pid)
        total += procs[pid][1]
        todo.extend(p for p, (ppid, _) in procs.items() if ppid == pid)
    return total


def median(values: list[float | None]) -> float | None:
    real = [v for v in values if v is not None]
    return statistics.median(real) if real else None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def with_client_name(url: str, name: str) -> str:
    """The URL with ``client_name`` set, so the worker's connections can be told apart."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "client_name"]
    query.append(("client_name", name))
    return urlunsplit(parts._replace(query=urlencode(query)))


class BenchError(click.ClickException):
    """A scenario could not run (a worker that never came up, a drain that got stuck)."""


def say(message: str) -> None:
    click.echo(message, err=True)


# -- the worker subprocess ----------------------------------------------------------------
class LoggedProcess:
    """A benchmarked subprocess writing its log to ``log_path`` (``log`` is the open file)."""

    log: Any
    log_path: Path
    #: markers of a log line worth reporting
    PROBLEMS: tuple[str, ...] = (" WARNING ", " ERROR ", "Traceback")

    def output(self, tail: int = 40) -> str:
        if not self.log.closed:
            self.log.flush()
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-tail:])

    def problems(self) -> list[str]:
        """The log lines worth reporting: warnings, errors, tracebacks."""
        if not self.log.closed:
            self.log.flush()
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        return [ln for ln in text.splitlines() if any(m in ln for m in self.PROBLEMS)]


class WorkerProcess(LoggedProcess):
    """An ``emqtasks worker`` on one queue, with bounded start and stop."""

    def __init__(self, redis_url: str, queue: str, concurrency: int, client: Any,
                 log_dir: Path, tick: float = 1.0) -> None:
        self.name = f"emqbench-{queue}"
        self.queue = queue
        self.concurrency = concurrency
        self.client = client
        self.log_path = log_dir / f"worker-{queue}.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        cmd = [sys.executable, "-m", "emqtasks.cli", "worker", "-A", "emqtasks.bench_tasks",
               "-c", str(concurrency), "-Q", queue,
               "--redis-url", with_client_name(redis_url, self.name), "--tick", f"{tick:g}"]
        env = {k: v for k, v in os.environ.items() if k not in ("EMQ_REDIS_URL", "EMQ_QUEUE")}
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        self.start_seconds: float | None = None

    def connections(self) -> list[dict[str, Any]]:
        return [c for c in self.client.client_list() if c.get("name") == self.name]

    def parked(self) -> bool:
        """Every child has a connection and the master is blocked on the wake key."""
        conns = self.connections()
        blocked = any(c.get("cmd") == "blpop" and "b" in c.get("flags", "") for c in conns)
        return blocked and len(conns) >= self.concurrency + 2

    def wait_up(self, timeout: float = UP_TIMEOUT) -> None:
        """Until the master parks with all its children connected (they claim once at start)."""
        deadline = time.monotonic() + timeout
        settled = 0
        while settled < 2:   # parked at two looks 50 ms apart: the children went idle
            if self.proc.poll() is not None:
                raise BenchError(f"the worker exited with {self.proc.returncode} at start:\n"
                                 f"{self.output()}")
            if time.monotonic() > deadline:
                raise BenchError(f"the worker did not park within {timeout:.0f}s:\n"
                                 f"{self.output()}")
            settled = settled + 1 if self.parked() else 0
            time.sleep(0.05)
        self.start_seconds = time.monotonic() - self.started

    def cpu(self) -> float:
        return tree_cpu(self.proc.pid)

    def stop(self, timeout: float = STOP_TIMEOUT) -> tuple[int | None, float]:
        """SIGTERM, a bounded wait, SIGKILL of the group on timeout: (exit code, seconds)."""
        began = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                say(f"  ! worker on {self.queue} ignored SIGTERM for {timeout:.0f}s; killing it")
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(5)
        self.log.close()
        return self.proc.returncode, time.monotonic() - began


# -- one scenario's queue ---------------------------------------------------------------------
class Bench:
    """The shared state of a bench: server, sizes, the worker log folder, the findings."""

    def __init__(self, url: str, sizes: Sizes, shared: bool) -> None:
        self.url = url
        self.sizes = sizes
        self.shared = shared
        self.client = connect(url)
        self.meter = ServerMeter(self.client)
        self.log_dir = Path(tempfile.mkdtemp(prefix="emq-bench-"))
        self.notes: list[str] = []
        self.worker_problems: list[str] = []
        self.worker_starts: list[float] = []
        self.worker_stops: list[float] = []

    @contextmanager
    def queue(self) -> Iterator[tuple[App, dict[str, Any]]]:
        """A fresh random queue, its App and the bench tasks bound to it; purged at the end."""
        from . import bench_tasks

        name = f"bench-{uuid.uuid4().hex[:12]}"
        app = App(redis_url=self.url, queue=name)
        tasks = bench_tasks.bind(app)
        try:
            yield app, tasks
        finally:
            try:
                app.purge()
            finally:
                app.close()

    @contextmanager
    def worker(self, app: App) -> Iterator[WorkerProcess]:
        w = WorkerProcess(self.url, app.settings.queue, self.sizes.concurrency, self.client,
                          self.log_dir, tick=self.sizes.tick)
        try:
            w.wait_up()
            assert w.start_seconds is not None
            self.worker_starts.append(w.start_seconds)
            yield w
        finally:
            code, seconds = w.stop()
            self.worker_stops.append(seconds)
            problems = w.problems()
            if code != 0:
                problems.append(f"worker exited with {code}")
            if problems:
                self.worker_problems.extend(f"[{app.settings.queue}] {p}" for p in problems)

    def key(self, app: App, name: str) -> str:
        """A key inside the queue's keyspace, so the purge removes it."""
        return f"{app.queue().keys.base}bench:{name}"

    def wait_count(self, key: str, target: int, timeout: float,
                   stall: float = 15.0) -> tuple[float | None, int]:
        """Poll a counter until it reaches target: (monotonic time reached or None, polls).

        Gives up at the timeout, or when the counter has not moved for ``stall`` seconds.
        """
        deadline = time.monotonic() + timeout
        polls, last, moved = 0, -1, time.monotonic()
        while True:
            value = int(self.client.get(key) or 0)
            polls += 1
            now = time.monotonic()
            if value >= target:
                return now, polls
            if value != last:
                last, moved = value, now
            if now > deadline or now - moved > stall:
                self.notes.append(f"stuck: counter at {value}/{target} after "
                                  f"{now - deadline + timeout:.1f}s "
                                  f"(no progress for {now - moved:.1f}s)")
                return None, polls
            time.sleep(POLL)

    def enqueue_batch(self, task: Any, counter: str, groups: int, n: int) -> float:
        """Enqueue n noop jobs spread over ``groups`` lanes with map(); returns jobs/s."""
        calls = [(counter, f"g{i % groups}") for i in range(n)]
        began = time.perf_counter()
        for i in range(0, n, CHUNK):
            task.map(calls[i:i + CHUNK])
        return n / (time.perf_counter() - began)


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


def scenario_drain(b: Bench, groups: int) -> dict[str, float | None]:
    """Enqueue into a paused queue, start the worker, resume, time the drain."""
    n = b.sizes.jobs
    with b.queue() as (app, tasks):
        counter = b.key(app, "done")
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
            started, claimed = _fairness_drill(b, app, seq, f"backlog-{trial}", True)
            backlog.append(started)
            leased.append(claimed)
            live.append(_fairness_drill(b, app, seq, f"live-{trial}", False)[0])
    return {"backlog": median(backlog), "leased": median(leased), "live": median(live)}


def _fairness_drill(b: Bench, app: App, seq: Any, name: str,
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


def run_all(b: Bench) -> list[Row]:
    s = b.sizes
    runs = s.runs

    def repeat(label: str, fn: Callable[[], Any]) -> list[Any]:
        results = []
        for r in range(runs):
            say(f"  {label}: run {r + 1}/{runs}")
            results.append(fn())
        return results

    one = repeat("enqueue 1-by-1", lambda: scenario_enqueue_one_by_one(b))
    few = repeat(f"drain, {FEW_GROUPS} groups", lambda: scenario_drain(b, FEW_GROUPS))
    single = repeat("drain, 1 group", lambda: scenario_drain(b, 1))
    many = repeat(f"drain, {s.many_groups} groups", lambda: scenario_drain(b, s.many_groups))
    idle = repeat("wake latency + idle", lambda: scenario_latency_and_idle(b))
    fair = repeat("fairness", lambda: scenario_fairness(b))

    def col(results: list[dict[str, Any]], field: str) -> list[float | None]:
        return [r[field] for r in results]

    c, n, mg = s.concurrency, s.jobs, f"{s.many_groups:,}"
    rows = [
        Row("enqueue_one_jobs_s", f"1  enqueue 1-by-1 (delay, {s.one_by_one:,} jobs)",
            median(one), "jobs/s", one),
        Row("enqueue_batch_jobs_s", f"2  enqueue batch (map x{CHUNK}, {n:,} jobs)",
            median(col(few, "enqueue")), "jobs/s", col(few, "enqueue")),
        Row("drain_10_groups_jobs_s", f"3  drain -c {c}, {n:,} jobs in {FEW_GROUPS} groups",
            median(col(few, "drain")), "jobs/s", col(few, "drain")),
        Row("drain_1_group_jobs_s", f"3  drain -c {c}, {n:,} jobs in 1 group",
            median(col(single, "drain")), "jobs/s", col(single, "drain")),
        Row("drain_cmds_per_job", f"4  Redis commands per job (drain, {FEW_GROUPS} groups, "
            "incl. the task's INCR)",
            median(col(few, "cmds")), "cmds/job", col(few, "cmds"), 1),
        Row("drain_scripts_per_job", "4    of which script calls (EVALSHA)",
            median(col(few, "scripts")), "calls/job", col(few, "scripts"), 2),
        Row("drain_cpu_us_per_job", f"4  Redis CPU per job (drain, {FEW_GROUPS} groups)",
            median(col(few, "cpu_us")), "us/job", col(few, "cpu_us"), 1),
        Row("drain_1_group_cpu_us_per_job", "4  Redis CPU per job (drain, 1 group)",
            median(col(single, "cpu_us")), "us/job", col(single, "cpu_us"), 1),
        Row("drain_worker_cpu_us_per_job", f"4  worker CPU per job (master + {c} children)",
            median(col(few, "worker_cpu_us")), "us/job", col(few, "worker_cpu_us")),
        Row("wake_latency_p50_ms", "5  wake latency, idle pool, p50",
            median(col(idle, "p50")), "ms", col(idle, "p50"), 2),
        Row("wake_latency_p90_ms", "5  wake latency, idle pool, p90",
            median(col(idle, "p90")), "ms", col(idle, "p90"), 2),
        Row("single_job_cmds", "5  Redis commands per lone job (idle pool, incl. its enqueue)",
            median(col(idle, "cmds_per_single_job")), "cmds/job",
            col(idle, "cmds_per_single_job"), 1),
        Row("single_job_scripts", "5    of which script calls (EVALSHA)",
            median(col(idle, "scripts_per_single_job")), "calls/job",
            col(idle, "scripts_per_single_job"), 1),
        Row("idle_cmds_per_s", f"6  idle Redis commands per second, 1 master ({s.idle_seconds:g}s)",
            median(col(idle, "idle_cmds")), "cmds/s", col(idle, "idle_cmds"), 1),
        Row("idle_round_trips_per_s", "6    of which round trips (EVALSHA + BLPOP)",
            median(col(idle, "idle_round_trips")), "calls/s", col(idle, "idle_round_trips"), 1),
        Row("idle_worker_cpu_ms_per_s", "6  idle worker CPU (master + children)",
            median(col(idle, "idle_worker_cpu_ms")), "ms/s", col(idle, "idle_worker_cpu_ms"), 1),
        Row("idle_pss_mb", f"6  memory of master + {c} idle children (PSS)",
            median(col(idle, "idle_pss_mb")), "MB", col(idle, "idle_pss_mb"), 1),
        Row("fairness_flood_before_quiet", f"7  flood jobs started before quiet ({s.flood:,} "
            "backlog, target < 10)", median(col(fair, "backlog")), "jobs", col(fair, "backlog")),
        Row("fairness_flood_leased_before_quiet", "7    flood jobs leased in an earlier ms "
            "than quiet", median(col(fair, "leased")), "jobs", col(fair, "leased")),
        Row("fairness_live_flood_between", "7  flood jobs started between quiet enqueue and "
            "start (live)", median(col(fair, "live")), "jobs", col(fair, "live")),
        Row("enqueue_batch_many_groups_jobs_s", f"8  enqueue batch, {n:,} jobs in {mg} groups",
            median(col(many, "enqueue")), "jobs/s", col(many, "enqueue")),
        Row("drain_many_groups_jobs_s", f"8  drain -c {c}, {n:,} jobs in {mg} groups",
            median(col(many, "drain")), "jobs/s", col(many, "drain")),
        Row("drain_many_groups_cmds_per_job", f"8  Redis commands per job (drain, {mg} groups)",
            median(col(many, "cmds")), "cmds/job", col(many, "cmds"), 1),
        Row("drain_many_groups_cpu_us_per_job", f"8  Redis CPU per job (drain, {mg} groups)",
            median(col(many, "cpu_us")), "us/job", col(many, "cpu_us"), 1),
    ]
    by_key = {r.key: r.figure for r in rows}
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


@click.command()
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
@click.option("--peers", is_flag=True,
              help="the same workloads on Huey and Dramatiq too, side by side, where they "
                   "are installed (pip install 'emqtasks[peers]'); ratios emqtasks/peer")
def bench(redis_url: str | None, concurrency: int, jobs: int | None, runs: int | None,
          as_json: bool, quick: bool, cluster: bool, peers: bool) -> None:
    """Measure enqueue and drain throughput, Redis cost, wake latency, idle cost, fairness."""
    if peers:   # its own scenarios and report: see bench_peers.py
        if cluster:
            raise BenchError("--peers and --cluster are separate benches: give one")
        from . import bench_peers

        bench_peers.run(redis_url, concurrency, jobs, runs, as_json, quick)
        return
    if cluster:   # its own scenario and report: see bench_cluster.py
        from . import bench_cluster

        source = click.get_current_context().get_parameter_source("concurrency")
        bench_cluster.run(redis_url, 4 if source is click.core.ParameterSource.DEFAULT
                          else concurrency, jobs or (1_000 if quick else 10_000),
                          runs or (1 if quick else 3), as_json)
        return
    if redis_url and is_cluster_url(redis_url):
        raise BenchError("a redis+cluster:// URL takes --cluster: the other scenarios meter "
                         "one server (INFO, CLIENT LIST)")
    sizes = Sizes.of(concurrency, jobs, runs, quick)
    began = time.monotonic()
    # SIGTERM unwinds like Ctrl-C, so the worker, the queue and the server are cleaned up.
    old_term = signal.signal(signal.SIGTERM, _exit_on_signal)
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


def open_server(redis_url: str | None) -> tuple[LocalRedis | None, str, str]:
    """(the private server started here or None, its URL, the Redis version)."""
    try:
        server = None if redis_url else LocalRedis().start()
    except EmqError as exc:
        raise BenchError(f"cannot start a private redis-server: {exc}") from None
    url = server.url if server is not None else str(redis_url)
    try:
        probe = connect(url)
        version = str(probe.info("server").get("redis_version", "?"))
        probe.close()
    except (redis.exceptions.RedisError, ValueError, OSError) as exc:
        if server is not None:
            server.close()
        raise BenchError(f"cannot reach Redis at {_redacted(url)}: {exc}") from None
    return server, url, version


def _measure(redis_url: str | None, sizes: Sizes) -> tuple[Bench, str, list[Row]]:
    """Every scenario on the given server, or on a private one started and stopped here."""
    server: LocalRedis | None = None
    try:
        server, url, version = open_server(redis_url)
        b = Bench(url, sizes, shared=server is None)
        say(f"emqtasks bench: redis {version} at {_redacted(url)}"
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


def _exit_on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def _redacted(url: str) -> str:
    from .cli import redacted  # here, not at the top: cli imports this module

    return redacted(url)
