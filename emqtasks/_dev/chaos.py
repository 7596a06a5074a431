"""The chaos soak: jobs keep coming while children, masters, connections and the server die.

A private ``redis-server`` with ``appendonly yes`` and ``appendfsync always`` on a fixed port
and folder (so it can be SIGKILLed and started again with its data); two worker pools on
one queue; a producer thread enqueueing batches of jobs over ~50 groups (plain ones, ones
that fail once and are retried, ones with a countdown, and a few that always fail). At
random intervals the soak SIGKILLs a child, SIGKILLs a master and starts another,
``CLIENT KILL``s connections, or SIGKILLs the server and starts it again. Then it lets the
pools drain and checks the promises: every acknowledged enqueue completed, nothing was lost,
nothing is dead but the jobs made to die, ``check`` is clean. Duplicate runs are expected
(at-least-once) and counted.

``emqtasks bench --chaos SECONDS`` runs it; ``tests/test_chaos.py`` runs a short one.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..app import App
from ..check import check
from ..keys import QueueKeys
from ..queue import NewJob
from ..task import build_job
from ..testing import WorkerProcess
from ..worker.resilience import TRANSIENT
from . import chaos_tasks
from .localserver import LocalRedis

#: Job kinds and their shares; about one in ten also gets a countdown.
KINDS = {"work": 85, "flaky": 14, "doomed": 1}
COUNTDOWN_SHARE = 0.1
#: Chaos events and their weights (about the mix of the adversarial pass that calibrated it).
EVENTS = {"child_kills": 29, "master_restarts": 6, "connection_kills": 25,
          "server_restarts": 6}
MEAN_INTERVAL = 0.9    # seconds between chaos events, on average
BATCHES_PER_SECOND = 20
DRAIN_TIMEOUT = 120.0  # after the chaos, every acknowledged job must finish within this
GIVE_UP = 30.0         # an enqueue retried this long without an answer is not acknowledged


@dataclass
class Report:
    """What the soak did and found; ``ok`` when every promise held."""

    seconds: float
    seed: int
    redis_version: str
    workers: int
    concurrency: int
    jobs: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    countdowns: int = 0
    groups: int = 0
    events: dict[str, int] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)
    unexpected_dead: list[str] = field(default_factory=list)
    undead: list[str] = field(default_factory=list)      # doomed jobs that did not die
    duplicated_jobs: int = 0
    extra_runs: int = 0
    max_runs: int = 0
    check_ok: bool = False
    violations: list[str] = field(default_factory=list)
    drain_seconds: float = 0.0
    worker_errors: list[str] = field(default_factory=list)
    worker_exits: list[str] = field(default_factory=list)   # last log line of each exit
    log_dir: str = ""

    @property
    def ok(self) -> bool:
        return (self.jobs > 0 and self.check_ok and not self.lost and not self.unexpected_dead
                and not self.undead)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def lines(self) -> list[str]:
        e, k = self.events, self.kinds
        restarted = e.get("worker_restarts", 0)
        return [
            f"chaos soak: {self.seconds:.0f} s, seed {self.seed}, redis {self.redis_version} "
            f"(appendfsync always), {self.workers} workers -c {self.concurrency}",
            f"events: {e.get('child_kills', 0)} child kills, {e.get('master_restarts', 0)} "
            f"master restarts, {e.get('connection_kills', 0)} connection kills, "
            f"{e.get('server_restarts', 0)} server restarts"
            + (f" (and {restarted} worker(s) restarted after exiting)" if restarted else ""),
            f"jobs: {self.jobs:,} acknowledged enqueues over {self.groups} groups "
            f"({k.get('work', 0):,} plain, {k.get('flaky', 0):,} failing once, "
            f"{k.get('doomed', 0):,} always failing; {self.countdowns:,} with a countdown)",
            f"outcome: {len(self.lost)} lost, {len(self.unexpected_dead)} dead that should not "
            f"be, {k.get('doomed', 0) - len(self.undead)}/{k.get('doomed', 0)} doomed jobs "
            f"dead; check {'clean' if self.check_ok else 'BROKEN'}",
            f"duplicates: {self.duplicated_jobs} jobs ran more than once ({self.extra_runs} "
            f"extra runs; at most {self.max_runs} runs of one job)",
            f"drain after the chaos: {self.drain_seconds:.1f} s; worker log errors: "
            f"{len(self.worker_errors)}"
            + (f" (logs kept in {self.log_dir})" if self.worker_errors else ""),
            *(f"  lost: {i}" for i in self.lost[:10]),
            *(f"  dead, should not be: {i}" for i in self.unexpected_dead[:10]),
            *(f"  violation: {v}" for v in self.violations[:10]),
            *(f"  worker error: {line}" for line in self.worker_errors[:5]),
            *(f"  a worker exited: {line}" for line in self.worker_exits[:5]),
            "OK" if self.ok else f"FAILED (worker logs in {self.log_dir})",
        ]


class Soak:
    """One chaos soak: ``Soak(60).run()`` returns its Report."""

    def __init__(self, seconds: float, *, rate: int = 400, groups: int = 50, workers: int = 2,
                 concurrency: int = 3, seed: int | None = None,
                 say: Callable[[str], None] = lambda _: None) -> None:
        self.seconds = seconds
        self.rate = rate
        self.groups = groups
        self.concurrency = concurrency
        self.seed = seed if seed is not None else random.randrange(1 << 30)
        self.rng = random.Random(self.seed)
        self.say = say
        self.queue = "chaos"
        self.log_dir = Path(tempfile.mkdtemp(prefix="emq-chaos-"))
        self.server = LocalRedis(persist=True)
        self.workers: list[WorkerProcess | None] = [None] * workers
        self.acked: dict[str, str] = {}     # job id -> kind, once its enqueue returned
        self.countdowns = 0
        self.events: Counter[str] = Counter()
        self.exits: list[str] = []
        self._stop = threading.Event()
        self._started = 0

    # -- the run --------------------------------------------------------------------------
    def run(self) -> Report:
        self.server.start(30)
        admin = self.server.client(socket_timeout=10, socket_connect_timeout=5)
        report = Report(self.seconds, self.seed, str(admin.info("server")["redis_version"]),
                        len(self.workers), self.concurrency, log_dir=str(self.log_dir))
        producer = threading.Thread(target=self._produce, name="chaos-producer", daemon=True)
        try:
            for i in range(len(self.workers)):
                self.workers[i] = self._start_worker(wait=True)
            producer.start()
            self.say(f"chaos for {self.seconds:.0f} s (seed {self.seed}), logs in {self.log_dir}")
            self._chaos(admin)
            self._stop.set()
            producer.join(GIVE_UP + 5)
            began = time.monotonic()
            self.say(f"chaos over: {len(self.acked):,} jobs acknowledged; draining")
            self._drain(admin)
            report.drain_seconds = time.monotonic() - began
            self._stop_workers()
            self._verify(admin, report)
        finally:
            self._stop.set()
            self._stop_workers()
            admin.close()
            self.server.close()
        if report.ok and not report.worker_errors:
            shutil.rmtree(self.log_dir, ignore_errors=True)
        return report

    def _start_worker(self, wait: bool = False) -> WorkerProcess:
        self._started += 1
        w = WorkerProcess(["emqtasks._dev.chaos_tasks"], redis_url=self.server.url,
                          queue=self.queue, concurrency=self.concurrency, tick=0.5,
                          extra=["--grace", "5"],
                          log_path=self.log_dir / f"worker-{self._started}.log")
        if wait:
            deadline = time.monotonic() + 30
            while "tasks registered" not in w.output() or not w.children():
                if time.monotonic() > deadline or w.proc.poll() is not None:
                    raise RuntimeError(f"a chaos worker did not start:\n{w.output(tail=20)}")
                time.sleep(0.05)
        return w

    def _stop_workers(self) -> None:
        for i, w in enumerate(self.workers):
            if w is not None:
                w.stop(15)
                self.workers[i] = None

    # -- the producer ---------------------------------------------------------------------
    def _produce(self) -> None:
        app = App(redis_url=self.server.url, queue=self.queue)
        tasks = chaos_tasks.bind(app)
        rng = random.Random(self.seed + 1)
        per_batch = max(1, self.rate // BATCHES_PER_SECOND)
        n, next_at = 0, time.monotonic()
        try:
            while not self._stop.is_set():
                jobs: list[tuple[NewJob, str]] = []
                for _ in range(per_batch):
                    n += 1
                    kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
                    job_id = f"g{rng.randrange(self.groups)}-{n}"
                    countdown = rng.uniform(0.1, 3.0) if rng.random() < COUNTDOWN_SHARE else None
                    job = build_job(tasks[kind].spec, (job_id,), {}, job_id=job_id,
                                    limit=app.settings.max_payload_bytes, countdown=countdown)
                    jobs.append((job, kind))
                if self._send(app, [j for j, _ in jobs]):
                    self.acked.update((j.id, kind) for j, kind in jobs)
                    self.countdowns += sum(1 for j, _ in jobs if j.countdown_ms)
                next_at += 1 / BATCHES_PER_SECOND
                time.sleep(max(0.0, next_at - time.monotonic()))
        finally:
            app.close()

    def _send(self, app: App, jobs: list[NewJob]) -> bool:
        """Enqueue a batch, again and again through outages (ids make it idempotent); True
        once the server answered, False if it never did within GIVE_UP."""
        deadline = time.monotonic() + GIVE_UP
        while True:
            try:
                app.queue().enqueue_many(jobs)
                return True
            except TRANSIENT:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.05)

    # -- the chaos ------------------------------------------------------------------------
    def _chaos(self, admin: Any) -> None:
        actions: dict[str, Callable[[Any], None]] = {
            "child_kills": self._kill_child, "master_restarts": self._restart_master,
            "connection_kills": self._kill_connections,
            "server_restarts": self._restart_server,
        }
        # One of each kind first, in a random order, so even a short soak has them all.
        firsts = self.rng.sample(list(EVENTS), len(EVENTS))
        deadline = time.monotonic() + self.seconds
        while (left := deadline - time.monotonic()) > 0:
            self._supervise()
            # The schedule of the chaos, not a poll: sleep until the next event.
            time.sleep(min(self.rng.expovariate(1 / MEAN_INTERVAL), left))
            if time.monotonic() >= deadline:
                break
            name = firsts.pop() if firsts else self.rng.choices(
                list(EVENTS), weights=list(EVENTS.values()))[0]
            actions[name](admin)

    def _supervise(self) -> None:
        """As systemd would: start again a worker that exited (one started while the
        server was down stops at once with 'cannot reach Redis')."""
        for i, w in enumerate(self.workers):
            if w is not None and w.proc.poll() is not None:
                w.stop()
                self.exits.append(f"exit {w.proc.returncode}: {w.output(tail=1)[:200]}")
                self.workers[i] = self._start_worker()
                self.events["worker_restarts"] += 1

    def _live_worker(self) -> tuple[int, WorkerProcess] | None:
        live = [(i, w) for i, w in enumerate(self.workers)
                if w is not None and w.proc.poll() is None]
        return self.rng.choice(live) if live else None

    def _kill_child(self, _admin: Any) -> None:
        picked = self._live_worker()
        children = picked[1].children() if picked else []
        if children:
            _kill(self.rng.choice(children))
            self.events["child_kills"] += 1

    def _restart_master(self, _admin: Any) -> None:
        picked = self._live_worker()
        if picked is not None:
            i, w = picked
            w.kill()    # SIGKILL of the master; its children follow (parent-death signal)
            w.stop()
            self.workers[i] = self._start_worker()
            self.events["master_restarts"] += 1

    def _kill_connections(self, admin: Any) -> None:
        try:
            mine = admin.client_id()
            others = [c["id"] for c in admin.client_list(_type="normal")
                      if int(c["id"]) != mine]
            for victim in self.rng.sample(others, min(len(others), self.rng.randint(1, 3))):
                admin.client_kill_filter(_id=victim)
                self.events["connection_kills"] += 1
        except TRANSIENT:
            pass   # the server is restarting: nothing to kill

    def _restart_server(self, _admin: Any) -> None:
        self.server.kill()   # SIGKILL: no shutdown, as a crash; AOF (always) keeps the writes
        time.sleep(self.rng.uniform(0.0, 0.3))
        self.server.start(30)
        self.events["server_restarts"] += 1

    # -- the verdict ----------------------------------------------------------------------
    def _drain(self, admin: Any) -> None:
        """Until every acknowledged job finished (done or dead) or lost its row, bounded."""
        waiting = set(self.acked)
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while waiting and time.monotonic() < deadline:
            self._supervise()
            states = _states(admin, self.queue, waiting)
            waiting = {i for i, s in states.items() if s is not None and s not in
                       ("done", "dead")}
            if waiting:
                time.sleep(0.25)   # a condition on thousands of rows, with a deadline

    def _verify(self, admin: Any, report: Report) -> None:
        states = _states(admin, self.queue, self.acked)
        runs = {k: int(v) for k, v in admin.hgetall(chaos_tasks.runs_key(self.queue)).items()}
        for job_id, kind in self.acked.items():
            state, ran = states.get(job_id), runs.get(job_id, 0)
            if kind == "doomed":
                if state != "dead":
                    report.undead.append(f"{job_id} ({state})")
            elif state == "dead":
                report.unexpected_dead.append(job_id)
            elif state != "done" or ran == 0:
                report.lost.append(f"{job_id} ({kind}: state {state}, {ran} runs)")
        report.jobs = len(self.acked)
        report.kinds = dict(Counter(self.acked.values()))
        report.countdowns = self.countdowns
        report.groups = len({chaos_tasks.group_of(i) for i in self.acked})
        report.events = {name: self.events[name] for name in (*EVENTS, "worker_restarts")}
        report.duplicated_jobs = sum(1 for n in runs.values() if n > 1)
        report.extra_runs = sum(n - 1 for n in runs.values() if n > 1)
        report.max_runs = max(runs.values(), default=0)
        app = App(redis_url=self.server.url, queue=self.queue)
        try:
            result = check(app.queue())
        finally:
            app.close()
        report.check_ok, report.violations = result.ok, result.violations
        report.worker_errors = _errors(self.log_dir.glob("worker-*.log"))
        report.worker_exits = list(self.exits)


def _states(client: Any, queue: str, ids: Iterable[str]) -> dict[str, str | None]:
    keys = QueueKeys(queue)
    ids = list(ids)
    out: dict[str, str | None] = {}
    for start in range(0, len(ids), 2000):
        chunk = ids[start:start + 2000]
        pipe = client.pipeline(transaction=False)
        for job_id in chunk:
            pipe.hget(keys.job(job_id), "state")
        out.update(zip(chunk, pipe.execute()))
    return out


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _errors(logs: Iterable[Path]) -> list[str]:
    """ERROR lines and tracebacks the workers logged (outage WARNINGs are expected), each
    with the exception a traceback ended in."""
    found: list[str] = []
    for path in sorted(logs):
        lines = path.read_text(errors="replace").splitlines()
        for n, line in enumerate(lines):
            if " ERROR " in line or line.startswith("Traceback"):
                end = next((x for x in lines[n + 1:] if x and not x[0].isspace()), "")
                found.append(f"{path.name}: {line[:160]} ... {end[:200]}")
    return found


def run(seconds: float, **options: Any) -> Report:
    return Soak(seconds, **options).run()

