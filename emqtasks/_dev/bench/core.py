"""``emqtasks bench``: throughput, Redis-side cost, wake latency, idle cost and fairness.

Every scenario runs on a fresh random queue, purged afterwards, against a private
``redis-server`` (default) or a given URL. Workers are real ``emqtasks worker`` subprocesses
running :mod:`emqtasks._dev.bench.tasks`; each job counts itself with one INCR, and the bench
waits by polling that counter. Redis-side cost comes from ``INFO commandstats`` and
``INFO cpu`` deltas, which count every command of every client: on a shared server other
traffic shows up in them.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import click

from ... import testing
from ...config import WorkerSettings
from ...producer.app import App
from ...store.connection import connect

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
            # A 0.5 s tick: a worker's stop waits for its park (up to a tick), 7 times a run
            return cls(concurrency, jobs, min(500, jobs), runs or 1, 20, 1.0, 1_000,
                       min(MANY_GROUPS, jobs), 3, 0.5)
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
        """Verb calls: script runs (EVALSHA, EVAL, or FCALL of the library), or the native
        module's EMQ.* commands."""
        return (delta.get("evalsha", 0.0) + delta.get("eval", 0.0) + delta.get("fcall", 0.0)
                + sum(v for k, v in delta.items() if k.startswith("emq.")))


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


def median(values: Sequence[float | None]) -> float | None:
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
    log_path: Path | None
    proc: subprocess.Popen[bytes]
    started: float
    start_seconds: float | None
    #: markers of a log line worth reporting
    PROBLEMS: tuple[str, ...] = (" WARNING ", " ERROR ", "Traceback")

    def output(self, tail: int | None = 40) -> str:
        if not self.log.closed:
            self.log.flush()
        try:
            lines = self.log_path.read_text(errors="replace").splitlines() \
                if self.log_path else []
        except OSError:
            return ""
        return "\n".join(lines[-tail:] if tail else lines)

    def wait_started(self, ready: Callable[[], bool], timeout: float, label: str) -> None:
        """Until ready() (looked at every 50 ms); BenchError if it exits or times out."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None:
                raise BenchError(f"the {label} worker exited with {self.proc.returncode} "
                                 f"at start:\n{self.output()}")
            if time.monotonic() > deadline:
                raise BenchError(f"the {label} worker was not up within {timeout:.0f}s:"
                                 f"\n{self.output()}")
            time.sleep(0.05)
        self.start_seconds = time.monotonic() - self.started

    def problems(self) -> list[str]:
        """The log lines worth reporting: warnings, errors, tracebacks."""
        if not self.log.closed:
            self.log.flush()
        try:
            text = self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return []
        return [ln for ln in text.splitlines() if any(m in ln for m in self.PROBLEMS)]


class WorkerProcess(LoggedProcess, testing.WorkerProcess):
    """An ``emqtasks worker`` on one queue, with bounded start and stop."""

    def __init__(self, redis_url: str, queue: str, concurrency: int, client: Any,
                 log_dir: Path, tick: float = 1.0, extra: tuple[str, ...] = (),
                 modules: tuple[str, ...] = (), path: str | None = None) -> None:
        self.name = f"emqbench-{queue}"
        self.queue = queue
        self.concurrency = concurrency
        self.client = client
        env = {k: v for k, v in os.environ.items() if k not in ("EMQ_REDIS_URL", "EMQ_QUEUE")}
        testing.WorkerProcess.__init__(
            self, ["emqtasks._dev.bench.tasks", *modules],
            redis_url=with_client_name(redis_url, self.name), queue=queue,
            concurrency=concurrency, tick=tick, env=env, extra=extra, path=path,
            log_path=log_dir / f"worker-{queue}.log")
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
        looks = [0]

        def settled() -> bool:   # parked at two looks 50 ms apart: the children went idle
            looks[0] = looks[0] + 1 if self.parked() else 0
            return looks[0] >= 2

        self.wait_started(settled, timeout, "emqtasks")

    def cpu(self) -> float:
        return tree_cpu(self.proc.pid)

    def stop_timed(self, timeout: float = STOP_TIMEOUT) -> tuple[int | None, float]:
        """SIGTERM, a bounded wait, SIGKILL of the group on timeout: (exit code, seconds)."""
        began = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                say(f"  ! worker on {self.queue} ignored SIGTERM for {timeout:.0f}s; killing it")
                self._kill_group()
        self._close_log()
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
        from . import tasks as bench_tasks

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
    def worker(self, app: App, *extra: str, concurrency: int | None = None,
               modules: tuple[str, ...] = (), path: str | None = None
               ) -> Iterator[WorkerProcess]:
        """A worker of the bench tasks (and ``modules``; ``path`` first on its PYTHONPATH)."""
        w = WorkerProcess(self.url, app.settings.queue, concurrency or self.sizes.concurrency,
                          self.client, self.log_dir, tick=self.sizes.tick, extra=extra,
                          modules=modules, path=path)
        try:
            w.wait_up()
            assert w.start_seconds is not None
            self.worker_starts.append(w.start_seconds)
            yield w
        finally:
            code, seconds = w.stop_timed()
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


