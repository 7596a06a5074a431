"""The master (the metronome): park on the wake key, fan readiness, renew, supervise, stop.

Three threads (or one park thread and one abort listener per queue on a Redis Cluster). The
park thread (park.py) reaps and promotes on the tick, and while some child is idle it parks
on BLPOP of the wake keys of its queues for as long as nothing is due; a token it takes
becomes a byte (the queue's index) on the wake pipe. The abort listener (aborts.py) blocks
on this master's abort lists from a child's go until no child claims or runs a job; an abort
it takes becomes a byte on the abort pipe. The main thread never blocks on Redis: it selects
over the children's pipes and sentinels, the wake, abort and signal pipes, fans readiness to
idle children, renews leases, enforces time limits and aborts (SIGUSR1 to the child, SIGKILL
past the grace), fails the job of a dead child and replaces it, and runs the shutdown.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import multiprocess

from ..config import WorkerSettings
from ..errors import Aborted, TimeLimitExceeded, WorkerLost
from ..observe import heartbeat, tracing
from ..observe.heartbeat import Beat
from ..producer.hooks import Hooks
from ..producer.registry import Registry
from ..producer.retry_policy import bounded
from ..store.cluster import is_cluster
from ..store.keys import WAKE_DUE
from ..store.queue import Lease, Queue
from ..verdicts import AbortedVerdict, RetryVerdict
from . import aborts, logs, park, settled, threads
from .child import BATCH, Child, ChildConfig
from .pipe import GO, GOT_WORK, HELD, IDLE, STOP
from .resilience import TRANSIENT, FullServer, Outage
from .scheduler import Scheduler
from .slots import ASYNC, Running, Slots

log = logging.getLogger("emqtasks.worker")
_ctx = multiprocess.get_context("fork")
#: Exit codes of a child killed from outside, not failed on its own (see _respawn_delay).
_KILLED = (-signal.SIGKILL, -signal.SIGTERM, -signal.SIGINT)
#: Seconds an abort token waits for its attempt to show in a slot (a child writes its slot
#: just after its claim): past that, it is not this master's to stop.
ABORT_UNMATCHED_KEEP = 3.0


#: The longest an abort listener's blocking pop lasts (seconds): see Master._listeners.
ABORT_BLOCK = 1.0

class ChildHandle:
    """The master's view of one child process."""

    def __init__(self, index: int, process: Any, pipe: Any) -> None:
        self.index = index
        self.process = process
        self.pipe = pipe
        self.idle = True
        self.born = time.monotonic()
        self.backoff = 0.25
        self.kill_reason: TimeLimitExceeded | None = None
        self.limited: tuple[str, str] | None = None   # (id, nonce) past its time limit
        self.kill_at = 0.0                              # ... SIGKILLed if still running then
        self.renewed: dict[tuple[str, str], float] = {}
        #: Attempts (id, nonce) asked to abort -> when the child is killed if still there.
        self.aborting: dict[tuple[str, str], float] = {}


class Master:
    """Runs a pool of N children on the queues of a -Q list until told to stop."""

    #: Seconds between the SIGTERM that stops a job at its time limit (it raises
    #: TimeLimitExceeded in the task) and the SIGKILL for a task that did not stop.
    time_limit_grace = 1.0

    def __init__(self, make_queues: Callable[[], list[Queue]], settings: WorkerSettings,
                 registry: Registry, hooks: Hooks | None = None,
                 weights: list[int] | None = None) -> None:
        self.make_queues = make_queues
        self.registry = registry
        self.settings = settings
        self.hooks = hooks if hooks is not None else Hooks()
        self._hard_stop = False
        self._term_at = 0.0   # when the first SIGTERM / SIGINT arrived (set by the handler)
        self.outage = Outage(log, "master", stop=self._give_up)
        #: A full server refuses what the master writes on its own account (heartbeats,
        #: schedules' jobs, wake tokens): one line per outage, for its threads together.
        self.full = FullServer(log, "master")
        # Through the outage: a server that went down just after the start-up probe must
        # not crash the master (a single-connection client connects as it is made).
        self.queues = self.outage.call(make_queues)
        self.queue = self.queues[0]
        self.child_config = ChildConfig(
            make_queues, registry, settings.max_tasks_per_child, settings.time_limit,
            weights, settings.async_concurrency, self.hooks)
        per_child = settings.async_concurrency if self.child_config.runs_async else 1
        # a sync child may hold a batch (claimed, not started): listed in its slots' held
        # entries, so the master can release them when the child is killed or dies
        self.slots = Slots(settings.concurrency, per_child,
                           0 if self.child_config.runs_async else BATCH)
        self.slots.beat()
        self.children: list[ChildHandle | None] = [None] * settings.concurrency
        self.selector = selectors.DefaultSelector()
        self.has_idle = threading.Event()
        self.park_stop = threading.Event()
        self.stats = {"started": 0, "died": 0, "replaced": 0, "time_limited": 0}
        self.scheduler = Scheduler(registry)   # periodic schedules, run by the park thread
        self.my_beat = heartbeat.new_beat([q.name for q in self.queues], settings.concurrency)
        self._stopping = False
        self._respawn_at: dict[int, tuple[float, float]] = {}   # index -> (when, backoff)
        self.parkers: list[park.Parker] = []
        self._grace_deadline = 0.0
        self._signal_r, self._signal_w = os.pipe()
        self._wake_r, self._wake_w = os.pipe()
        self._abort_r, self._abort_w = os.pipe()
        for fd in (self._signal_r, self._signal_w, self._wake_r, self._wake_w, self._abort_r,
                   self._abort_w):
            os.set_blocking(fd, False)
        #: Aborts the listeners took, for the main loop: (queue index, id, nonce).
        self._taken: list[tuple[int, str, str]] = []
        self._taken_lock = threading.Lock()
        #: Aborts not matched to a slot yet: (id, nonce) -> when taken (monotonic).
        self._unmatched: dict[tuple[str, str], float] = {}
        #: Set from a child's go (its claim may start a job) while some child claims or runs
        #: a job: the abort listeners block only then.
        self.jobs_running = threading.Event()
        #: Set when the pool is gone: aborts are heard through a warm stop's grace too.
        self.listen_stop = threading.Event()
        self.listeners: list[aborts.AbortListener] = []

    # -- lifecycle --------------------------------------------------------------------
    def run(self) -> int:
        self._install_signals()
        # Recover and promote before anyone claims; also proves the scripts run. The due
        # time it learns is the park threads' first deadline: the 'd' token of a job
        # scheduled earlier may have been taken by a master that has since stopped.
        first_due: dict[int, float | None] = {}
        for i, q in enumerate(self.queues):
            self.full.call(self._call, park.reap, q, self._beat(),
                           park.beat_ttl(self.settings.tick))
            first_due[i] = self._call(park.promote, q)[0]
        self._set_task_rates()
        for index in range(self.settings.concurrency):
            self._spawn(index)
        self.selector.register(self._signal_r, selectors.EVENT_READ, "signal")
        self.selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self.selector.register(self._abort_r, selectors.EVENT_READ, "aborts")
        self.parkers = self._parkers(first_due)
        parkers = threads.start(self.parkers, "park")
        self.listeners = self._listeners()
        parkers += threads.start(self.listeners, "aborts")
        self._fan()  # work may already be waiting: a restarted pool must not need a wake
        try:
            while self._alive_children():
                try:
                    self._step()
                except Exception:   # an error reply to a renewal: keep supervising
                    log.exception("master loop error; carrying on")
                    time.sleep(0.5)
        finally:
            self.park_stop.set()
            self.has_idle.set()
            self.listen_stop.set()
            self.jobs_running.set()   # a listener waiting for jobs sees the stop
            for parker in self.parkers:
                parker.interrupt()
            for listener in self.listeners:
                listener.interrupt()
            for thread in parkers:
                thread.join(timeout=1.0)
            self._say_goodbye()
        log.info("stopped: %(started)d children started, %(died)d died, "
                 "%(time_limited)d stopped at their time limit", self.stats)
        return 0

    def _set_task_rates(self) -> None:
        """Write each served task's ``rate_limit`` as its group's rate, on the queues it may
        land on here (its own queue, else every queue served), at every worker's start: the
        code's rate wins over one set by hand in between."""
        for t in self.registry.tasks().values():
            rate = t.spec.rate
            if rate is None:
                continue
            for q in self.queues:
                if t.spec.queue in (None, q.name):
                    self._call(q.set_group_rate, t.spec.group, *rate)
                    log.info("task %s: rate %d per %gs on group %s of queue %s", t.name,
                             rate[0], rate[1], t.spec.group, q.name)

    def _beat(self) -> Beat:
        """This master's heartbeat as of now (read by the park threads on their tick)."""
        self.my_beat.busy = sum(1 for h in list(self.children)
                                  if h is not None and not h.idle)
        return self.my_beat

    def _say_goodbye(self) -> None:
        for q in self.queues:
            try:
                q.remove_beat(self.my_beat.id)
            except Exception:   # best effort: the key expires in a few ticks anyway
                log.debug("could not remove the heartbeat of queue %s", q.name)

    def _parkers(self, first_due: dict[int, float | None]) -> list[park.Parker]:
        """One Parker for the queues of one server; on a Cluster one per queue (each queue
        is a slot of its own, maybe on another node: one BLPOP cannot span them)."""
        every = list(range(len(self.queues)))
        groups = [[i] for i in every] if is_cluster(self.queue.client) else [every]
        wake = park.wake_byte(self._wake_w)
        # The periodic schedules live on the first queue of the list: its Parker keeps them.
        return [park.Parker(self.make_queues, g, self.settings.tick, self.has_idle,
                            self.park_stop, wake, first_due,
                            self.scheduler if n == 0 else None, self._beat, self.full)
                for n, g in enumerate(groups)]

    def _listeners(self) -> list[aborts.AbortListener]:
        """The abort listeners: grouped by server as the Parkers are. A listener's pop lasts
        at most ABORT_BLOCK: a pool gone idle leaves no blocked connection on the server
        for longer than that (a token wakes the pop at once whatever its length)."""
        every = list(range(len(self.queues)))
        groups = [[i] for i in every] if is_cluster(self.queue.client) else [every]
        return [aborts.AbortListener(self.make_queues, g, self.my_beat.id, self.jobs_running,
                                     self.listen_stop, self._abort_taken,
                                     min(self.settings.tick, ABORT_BLOCK))
                for g in groups]

    def _abort_taken(self, qi: int, job_id: str, nonce: str) -> None:
        """A listener took an abort: for the main loop (one byte on its pipe wakes it)."""
        with self._taken_lock:
            self._taken.append((qi, job_id, nonce))
        try:
            os.write(self._abort_w, b"a")
        except BlockingIOError:
            pass   # the pipe is full of bytes already: the loop is coming

    def _install_signals(self) -> None:
        def on_signal(signum: int, _frame: Any) -> None:
            # The main loop dispatches; the flags only let a Redis retry loop that holds
            # the main thread give up (see _give_up), so a stop works during an outage.
            if not self._term_at:
                self._term_at = time.monotonic()
            elif signum == signal.SIGINT:
                self._hard_stop = True
            os.write(self._signal_w, bytes([signum]))

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def _spawn(self, index: int, backoff: float = 0.25) -> None:
        master_end, child_end = _ctx.Pipe(duplex=True)
        self.slots.reset(index)
        child = Child(index, child_end, self.slots, os.getpid(), self.child_config)
        others = [h.pipe.fileno() for h in self.children if h is not None]
        process = _ctx.Process(target=_child_entry, args=(child, master_end.fileno(), others),
                               name=f"emqtasks-child-{index}", daemon=False)
        signals = {signal.SIGINT, signal.SIGTERM}
        old = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        child_end.close()
        handle = ChildHandle(index, process, master_end)
        handle.backoff = backoff
        self.children[index] = handle
        self.selector.register(master_end, selectors.EVENT_READ, ("pipe", index))
        self.selector.register(process.sentinel, selectors.EVENT_READ, ("exit", index))
        self.stats["started"] += 1
        self.has_idle.set()

    def _give_up(self) -> bool:
        """Stop retrying Redis: a hard stop, or a stop asked for and its grace run out."""
        return self._hard_stop or (
            bool(self._term_at) and time.monotonic() > self._term_at + self.settings.grace)

    def _alive_children(self) -> bool:
        return any(h is not None for h in self.children) or (
            bool(self._respawn_at) and not self._stopping)

    def _note_idle(self) -> None:
        """has_idle says whether the park thread may take a wake: some child is idle."""
        if any(h is not None and h.idle for h in self.children):
            self.has_idle.set()
        else:
            self.has_idle.clear()

    # -- the main loop ----------------------------------------------------------------
    def _step(self) -> None:
        busy = any(h is not None and not h.idle for h in self.children) or self._async_busy()
        timeout = 0.1 if (busy or self._stopping) else 1.0
        events = self.selector.select(timeout)
        self.slots.beat()   # before any go: a child claims only while this is fresh
        for key, _ in events:
            tag = key.data
            if tag == "signal":
                self._on_signals()
            elif tag == "wake":
                self._on_wake()
            elif tag == "aborts":
                self._on_aborts()
            elif tag[0] == "pipe":
                self._on_message(tag[1], key.fileobj)
            elif tag[0] == "exit":
                self._on_exit(tag[1])
        self._supervise_running()
        self._deliver_aborts()
        self._respawn_due()
        if self._stopping and not self._hard_stop and time.monotonic() > self._grace_deadline:
            log.warning("grace period over: stopping children now")
            self._kill_all()

    def _on_signals(self) -> None:
        try:
            received = os.read(self._signal_r, 64)
        except BlockingIOError:
            return
        for signum in received:
            if signum in (signal.SIGTERM, signal.SIGINT):
                if not self._stopping:
                    self._begin_warm_stop(signal.Signals(signum).name)
                elif signum == signal.SIGINT:
                    log.warning("second interrupt: stopping children now")
                    self._kill_all()

    def _async_busy(self) -> bool:
        """Whether an async child runs jobs while it accepts a go (reported idle)."""
        return self.slots.per_child > 1 and any(
            self.slots.running(h.index) for h in self.children if h is not None)

    # -- aborts -------------------------------------------------------------------------------
    def _on_aborts(self) -> None:
        try:
            os.read(self._abort_r, 4096)
        except BlockingIOError:
            pass
        with self._taken_lock:
            taken, self._taken = self._taken, []
        now = time.monotonic()
        for _, job_id, nonce in taken:
            self._unmatched.setdefault((job_id, nonce), now)

    def _deliver_aborts(self) -> None:
        """Ask the child running each aborted attempt to stop it (its nonce in the job's
        slot, then SIGUSR1), and note when it is killed if the job is still there. A token
        whose attempt no slot shows is kept ABORT_UNMATCHED_KEEP s (its child may not
        have written its slot yet), then dropped: another master's, or a stale one."""
        if not self._unmatched:
            return
        now = time.monotonic()
        for key, since in list(self._unmatched.items()):
            found = self._find_attempt(key)
            if found is None:
                if now - since > ABORT_UNMATCHED_KEEP:
                    del self._unmatched[key]
                continue
            del self._unmatched[key]
            h, index, job = found
            if key in h.aborting:
                continue
            grace = job.abort_grace if job.abort_grace >= 0 else self.settings.abort_grace
            h.aborting[key] = now + grace
            self.slots.ask_abort(index, key[1])
            try:
                os.kill(h.process.pid, signal.SIGUSR1)
            except (ProcessLookupError, TypeError):
                continue   # gone already: _on_exit settles it (aborted)
            log.info("job %s: aborting it (child %d; killed if still running in %gs)",
                     key[0], h.index, grace)

    def _find_attempt(self, key: tuple[str, str]) -> tuple[ChildHandle, int, Running] | None:
        for h in self.children:
            if h is None or not h.process.is_alive():
                continue
            for index in self.slots.of_child(h.index):
                job = self.slots.read(index)
                if job is not None and (job.lease.id, job.lease.nonce) == key:
                    return h, index, job
        return None

    def _fire_stopping(self) -> None:
        if self.hooks.has("worker_stopping"):
            self.hooks.fire("worker_stopping")

    def _begin_warm_stop(self, why: str) -> None:
        log.info("%s: finishing running jobs (grace %.1fs)", why, self.settings.grace)
        self._fire_stopping()
        self._stopping = True
        self._grace_deadline = time.monotonic() + self.settings.grace
        self.slots.set_stopping()
        self.park_stop.set()
        self.has_idle.set()
        for h in self.children:
            if h is not None and h.idle:
                _send(h.pipe, STOP)
        for i in (i for p in self.parkers for i in p.due_to_hand_on()):
            # This master may have taken the only 'd' token of a delayed job: hand it on,
            # as it hands on work tokens, so a parked peer re-reads when to promote. Once,
            # not through the outage: a stop must not wait for the server (tokens are
            # hints; the peers' ticks read `delayed` anyway).
            try:
                self.full.call(self.queues[i].push_wake, WAKE_DUE)
            except TRANSIENT:
                log.info("could not hand on the due-time token: Redis unavailable")

    def _on_wake(self) -> None:
        try:
            tokens = os.read(self._wake_r, 64)
        except BlockingIOError:
            return
        for qi in tokens:   # one byte per token: the index of its queue
            if self._stopping or not self._fan():   # not ours to use: hand it on
                self.full.call(self._call, self.queues[qi].push_wake)

    def _fan(self) -> bool:
        """Wake one idle child; it recruits the next by reporting GOT_WORK, so a lone job
        costs one claim, and a burst still has every child busy within a few claims.
        False when no child was idle."""
        woken = False
        self.slots.beat()   # a go means this loop is alive: the child may claim
        for h in self.children:
            if h is not None and h.idle and h.process.is_alive():
                if woken:
                    self.has_idle.set()   # more idle children: keep listening for wakes
                    return True
                h.idle = False
                # The abort listener blocks from here, before the child's claim: an abort
                # of the job it starts is taken at once, not a loop turn (0.1 s) later.
                self.jobs_running.set()
                _send(h.pipe, GO)
                woken = True
        self.has_idle.clear()
        return woken

    def _on_message(self, index: int, pipe: Any = None) -> None:
        h = self.children[index]
        if h is None or (pipe is not None and pipe is not h.pipe):
            # The EOF of a child that exited and was replaced earlier in this same select
            # batch: reading the replacement's pipe here would block the main loop.
            return
        try:
            message = h.pipe.recv_bytes()
        except (EOFError, OSError):
            self.selector.unregister(h.pipe)
            return
        if message == HELD and not self._stopping:
            # It stopped claiming while this loop was silent; the loop turns again: go on.
            _send(h.pipe, GO)
        elif message in (IDLE, HELD):
            h.idle = True
            if self._stopping:
                _send(h.pipe, STOP)
            else:
                self.has_idle.set()
        elif message[:1] == GOT_WORK and not self._stopping and not self._fan():
            # More work than this pool can take: let another master have a look too.
            qi = message[1] if len(message) > 1 else 0
            self.full.call(self._call, self.queues[qi].push_wake)

    def _on_exit(self, index: int) -> None:
        h = self.children[index]
        if h is None:
            return
        self.selector.unregister(h.process.sentinel)
        try:
            self.selector.unregister(h.pipe)
        except (KeyError, ValueError):
            pass
        h.process.join(timeout=1.0)
        code = h.process.exitcode
        running = self.slots.running(index)
        try:
            if running:
                self._settle_lost_jobs(h, running, code)
            elif code not in (0, None):
                log.warning("child %d (pid %s) exited with %s", index, h.process.pid, code)
        except Exception:
            log.exception("could not settle the job of child %d; its lease will expire", index)
        try:
            self._release_held(h, running)
        except Exception:
            log.exception("could not release the jobs child %d held; their leases will "
                          "expire", index)
        finally:
            h.pipe.close()
            self.children[index] = None
        if not self._stopping:
            delay = self._respawn_delay(h, code, bool(running))
            self._respawn_at[index] = (time.monotonic() + delay, delay or 0.25)

    def _respawn_delay(self, h: ChildHandle, code: int | None, had_job: bool) -> float:
        """How long to wait before replacing a child that exited.

        At once, unless it crashed young: a child that retired after --max-tasks-per-child
        jobs (exit 0), was killed from outside (SIGKILL: the OOM killer, an operator), died
        running a job or lived over 5 s is replaced now. One that failed on its own within
        5 s with no job (exit 1 of a refused AUTH, a segfault) must not be forked again in
        a tight loop: it waits, doubling up to 10 s.
        """
        lived = time.monotonic() - h.born
        if code == 0 or code in _KILLED or had_job or lived > 5:
            return 0.0
        delay = min(10.0, h.backoff * 2)
        log.warning("child %d (pid %s) failed %.1fs after its start (exit %s) with no job: "
                    "restarting it in %.1fs", h.index, h.process.pid, lived, code, delay)
        return delay

    def _respawn_due(self) -> None:
        now = time.monotonic()
        for index, (when, backoff) in list(self._respawn_at.items()):
            if now < when or self._stopping:
                continue
            del self._respawn_at[index]
            self.stats["replaced"] += 1
            self._spawn(index, backoff)
            # No wake may be coming for work the old child left in the lanes.
            child = self.children[index]
            assert child is not None
            child.idle = False
            self.slots.beat()
            _send(child.pipe, GO)
            self._note_idle()

    def _settle_lost_jobs(self, h: ChildHandle, running: list[Running],
                          code: int | None) -> None:
        for job in running:
            try:
                self._settle_lost_job(h, job, code)
            except Exception:
                log.exception("could not settle job %s of child %d; its lease will expire",
                              job.lease.id, h.index)

    def _release_held(self, h: ChildHandle, running: list[Running]) -> None:
        """The jobs a child that is gone held (claimed, not started: a batch behind the job
        it ran) go back to the head of their lanes, attempt rolled back (fenced: one it had
        started or given back already is stale), rather than wait active for their lease.
        (A child batches on one queue only: the first.) After its running jobs are
        settled: a job in both (the child died as it moved it to its slot) is the slot's.
        Killed by a hard stop or died, the same: they never ran."""
        held = self.slots.held(h.index)
        if not held:
            return
        ran = {(job.lease.id, job.lease.nonce) for job in running}
        why = ("released: worker stopped before it started the job" if self._hard_stop else
               f"released: its child pid {h.process.pid} died before it started the job")
        released = 0
        for lease in held:
            if (lease.id, lease.nonce) in ran:
                continue
            try:
                released += bool(self._call(self.queues[0].release, lease, why))
            except Exception:
                log.exception("could not release job %s held by child %d; its lease will "
                              "expire", lease.id, h.index)
        if released:
            log.warning("child %d (pid %s) was gone holding %d jobs it had not started: "
                        "released back to their lanes", h.index, h.process.pid, released)

    def _settle_lost_job(self, h: ChildHandle, running: Running, code: int | None) -> None:
        lease = running.lease
        queue = self.queues[running.queue]
        if (lease.id, lease.nonce) in h.aborting:
            self._settle_aborted(h, running, code)
            return
        reason = h.kill_reason if h.limited == (lease.id, lease.nonce) else None
        if self._hard_stop and reason is None:
            ok = self._call(queue.release, lease, "released: worker stopped mid-job")
            log.warning("job %s released back to its lane at shutdown (%s)", lease.id,
                        "ok" if ok else "already settled")
            return
        self.stats["died"] += 1
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        final = False
        exc: BaseException
        if reason is not None:
            exc = reason
            error = f"{type(exc).__name__}: {exc}"
            delay = running.retry_delay
        elif running.failure:
            # The job had failed and its child died writing that: the real reason, the
            # delay and the verdict (dead at once or not) the child had decided
            first, _, rest = running.failure.partition("\n")
            note = f"its child pid {h.process.pid} died ({how}) while writing this failure"
            error = f"{first} (written by the master: {note})\n{rest}"
            exc = WorkerLost(f"{note}: {first}")
            delay, final = running.failure_delay, running.final
        else:
            exc = WorkerLost(f"child pid {h.process.pid} died ({how}) while running the job")
            error = f"{type(exc).__name__}: {exc}"
            delay = running.retry_delay
        # the run's span, when the master traces: the child's died unfinished
        traced = settled.traced(queue, lease, exc, running.started, self._call)
        verdict = self._call(queue.retry, lease, error, bounded(delay) if delay >= 0 else None,
                             final, traced[1].traceparent if traced else None)
        landed = verdict in (RetryVerdict.RETRIED, RetryVerdict.DEAD)
        if traced:
            traced[1].end(landed)
        log.warning("job %s failed, %s: %s", lease.id, verdict.outcome,
                    error.partition("\n")[0], extra=logs.lease_extra(
                        lease, queue.name, verdict.outcome, running.started,
                        traced[0]._trace_id if traced else None))
        # Its child is gone: the master fires the hook, once (a stale verdict: the child
        # wrote the failure, and fired it, before it died).
        settled.fire(self.hooks, verdict, queue, lease, exc, self._call,
                     traced[0] if traced else None)

    def _settle_aborted(self, h: ChildHandle, running: Running, code: int | None) -> None:
        """The child of an aborted attempt is gone (killed past its grace, or it died): the
        job ends ``aborted`` (fenced), and its task_dead hook fires here."""
        lease = running.lease
        queue = self.queues[running.queue]
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        exc = Aborted(f"job {lease.id} was aborted while running (attempt {lease.attempts}); "
                      f"it did not return within its grace: its child pid {h.process.pid} "
                      f"was stopped ({how})")
        verdict = self._call(queue.abort_end, lease, f"Aborted: {exc}")
        outcome = "aborted" if verdict == AbortedVerdict.ABORTED else "stale"
        log.warning("job %s %s: %s", lease.id, outcome, exc, extra=logs.lease_extra(
            lease, queue.name, outcome, running.started, None))
        if verdict == AbortedVerdict.ABORTED:
            settled.fire(self.hooks, RetryVerdict.DEAD, queue, lease, exc, self._call)

    # -- leases and limits --------------------------------------------------------------
    def _supervise_running(self) -> None:
        """Renew the lease of every job in flight, and enforce their time limits.

        A job is renewed as soon as this loop first sees it in its slot, then every third
        of its lease: that first renewal also records on its row that it was seen running,
        so its lease expiring spends an attempt; one that expires before it (a claim whose
        reply was lost, a worker gone within the loop's turn) is given back (reap.lua). It
        costs one extend per turn of this loop for the jobs started since the last turn
        (about ten calls a second in a busy pool, whatever its rate), not a write per job."""
        now = time.monotonic()
        due: dict[int, list[Lease]] = {}
        any_running = False
        for h in self.children:
            if h is None or not h.process.is_alive():
                continue   # a dead child's jobs are settled by _on_exit, never renewed
            if not h.idle:
                any_running = True   # sent to claim: it may be starting a job (see _fan)
            elif self.slots.per_child == 1:
                continue
            renewed: dict[tuple[str, str], float] = {}
            jobs = self.slots.running(h.index)
            if h.aborting:   # aborted attempts that ended on their own: forgotten
                running = {(job.lease.id, job.lease.nonce) for job in jobs}
                h.aborting = {k: v for k, v in h.aborting.items() if k in running}
            for job in jobs:
                any_running = True
                if self._past_time_limit(h, job, now) or self._past_abort_grace(h, job, now):
                    break   # killed: _on_exit settles its jobs
                lease = job.lease
                key = (lease.id, lease.nonce)
                last = h.renewed.get(key)
                every = self.settings.renew_every or lease.lease_ms / 3000
                if last is None or now - last >= every:
                    last = now
                    due.setdefault(job.queue, []).append(lease)
                renewed[key] = last
            h.renewed = renewed
        if any_running:
            self.jobs_running.set()
        else:
            self.jobs_running.clear()
        for qi, leases in due.items():
            self._call(self.queues[qi].extend, leases)

    def _past_time_limit(self, h: ChildHandle, job: Running, now: float) -> bool:
        """Enforce a job's time limit; True when its child was killed for it now.

        A sync job gets SIGTERM first (the child raises TimeLimitExceeded in the task, fails
        the job through the fence and stays to serve the next one), SIGKILL of its child a
        grace later. An async job is cancelled by its child at its limit; a child whose loop
        is still blocked a grace (and a second to settle) later is killed."""
        ran = now - job.started
        if job.time_limit <= 0 or ran <= job.time_limit:
            return False
        key = (job.lease.id, job.lease.nonce)
        if h.limited != key:
            if job.kind == ASYNC and ran <= job.time_limit + self.time_limit_grace + 1.0:
                return False
            h.limited, h.kill_at = key, now + self.time_limit_grace
            h.kill_reason = TimeLimitExceeded(f"ran past its time limit of "
                                              f"{job.time_limit:g}s")
            self.stats["time_limited"] += 1
            if job.kind != ASYNC:
                self.slots.flag_time_limit(h.index, job.lease.nonce)
                h.process.terminate()
                return False
            h.kill_at = now
        if now >= h.kill_at:
            # A task blocked in C, or one that swallowed the exception: kill it.
            h.process.kill()
            return True
        return False

    def _past_abort_grace(self, h: ChildHandle, job: Running, now: float) -> bool:
        """An aborted job still running past its grace (it swallowed Aborted, or is blocked
        in C): its child is killed (and replaced); _on_exit ends the job ``aborted``."""
        kill_at = h.aborting.get((job.lease.id, job.lease.nonce))
        if kill_at is None or now < kill_at:
            return False
        log.warning("job %s did not stop within its abort grace: killing child %d (pid %s)",
                    job.lease.id, h.index, h.process.pid)
        h.process.kill()
        return True

    def _kill_all(self) -> None:
        self._hard_stop = True
        for h in self.children:
            if h is not None and h.process.is_alive():
                h.process.kill()

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.outage.call(fn, *args)


def _send(pipe: Any, message: bytes) -> None:
    try:
        pipe.send_bytes(message)
    except (BrokenPipeError, OSError):
        pass   # the child is gone; its sentinel tells the rest


def _child_entry(child: Child, master_end_fd: int, others: list[int]) -> None:
    for fd in [master_end_fd, *others]:
        try:
            os.close(fd)   # so our master's death reads as EOF, and so do siblings'
        except OSError:
            pass
    try:
        child.main()
    finally:
        tracing.flush()   # the child ends by os._exit: no atexit hook exports its spans
