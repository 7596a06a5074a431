"""The child: claim -> run -> ack, repeat until a claim answers empty; never crashed by a job.

A child waits on its pipe for the master's go, drains, and reports idle. It talks to Redis
over its own connection, opened after the fork, and to its master only over the pipe and
the shared slots (see slots.py). A job's outcome is one of: acknowledged with its result,
retried after a delay, or dead-lettered with the reason. With an async concurrency above 1
(and async tasks registered) the drain runs on the child's event loop instead
(async_child.py), several async jobs at once.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import Aborted, TimeLimitExceeded
from ..observe import tracing
from ..producer.context import install_log_fields
from ..producer.hooks import Hooks
from ..producer.registry import Registry
from ..store.queue import Lease, Queue
from ..store.wire import UNREAD, Owed
from .holding import Holding
from .pipe import GO, GOT_WORK, HELD, IDLE, STOP
from .queues import Claimed, QueueSet
from .resilience import Outage, Refusals
from .runner import LOG_TEXT_MAX, Outcome, Runner, every_hook, every_task
from .slots import Slots

__all__ = ["GO", "STOP", "GOT_WORK", "HELD", "IDLE", "LOG_TEXT_MAX", "Child", "ChildConfig",
           "Outcome", "Runner", "every_hook", "every_task"]

log = logging.getLogger("emqtasks.child")

#: A job finished that its ack settles: (lease, result JSON, span, its context, its plan).
Done = tuple[Lease, str, "str | None", Any, Any]

#: A job that ran under this many seconds is short: the child then claims BATCH jobs at a
#: time (each its own turn of the ring, lease and fence), writes each one's ack as it
#: finishes and reads their replies with the next claim's: one round trip per batch
#: (issue 31 item 5). One job over it: back to one.
SHORT = 0.001
BATCH = 8
#: A job still running after this long hands the jobs held behind it on (holding.py).
HAND_ON_AFTER = 0.1


def batch_claims_wanted(environ: dict[str, str] | None = None) -> bool:
    """``EMQ_BATCH_CLAIMS``: batched claims of short jobs, on unless 0, off, false or no."""
    env = os.environ if environ is None else environ
    return (env.get("EMQ_BATCH_CLAIMS") or "1").strip().lower() not in ("0", "off", "false",
                                                                       "no")


@dataclass
class ChildConfig:
    """What every child of a pool shares."""

    make_queues: Callable[[], list[Queue]]   # the -Q queues, on one fresh connection
    registry: Registry
    max_tasks: int = 0
    default_time_limit: float = 0.0
    weights: list[int] | None = None         # None: strict order (or a single queue)
    async_concurrency: int = 1
    hooks: Hooks = field(default_factory=Hooks)

    @property
    def runs_async(self) -> bool:
        """Whether children run several jobs at once: K > 1 and some task is async."""
        return self.async_concurrency > 1 and any(
            t.spec.is_async for t in self.registry.tasks().values())


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this child when the master dies (no-op elsewhere)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Child:
    """The loop of one forked child."""

    def __init__(self, index: int, pipe: Any, slots: Slots, master_pid: int,
                 config: ChildConfig) -> None:
        self.index = index
        self.pipe = pipe
        self.slots = slots
        self.master_pid = master_pid
        self.config = config
        self.max_tasks = config.max_tasks
        self.done = 0
        self.terminating = False
        self._said_silent = False
        self._aborted: str = ""   # the nonce of the attempt Aborted was raised into

    def main(self) -> None:
        # Ctrl-C reaches the whole process group and systemd sends SIGTERM to the whole
        # cgroup: both are the master's to handle. A SIGTERM here only means "finish this
        # job and claim no more", so a job is never cut short by the group signal.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, self._on_term)
        # The master's SIGUSR1: an abort of a job this child runs (see _on_abort). Not
        # SIGALRM, the soft time limit's.
        signal.signal(signal.SIGUSR1, self._on_abort)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        _die_with_parent()
        if os.getppid() != self.master_pid:
            return
        install_log_fields()
        # Keep retrying Redis through a warm stop (the ack of the last job must land); give
        # up only when the master is gone.
        self.outage = Outage(log, f"child {self.index}",
                             stop=lambda: os.getppid() != self.master_pid)
        self.refusals = Refusals(log, f"child {self.index}",
                                 sleep=None if self.config.runs_async else time.sleep)
        # A cluster client connects as it is made: ride out a server that is down now,
        # rather than die and be respawned in a tight loop.
        queues = self.outage.call(self.config.make_queues)
        self.queues = QueueSet(queues, self.config.weights)
        self.runner = Runner(queues, self.config.registry, self.config.default_time_limit,
                             self.config.hooks)
        self.runner.call = self.outage.call
        # A connection cut while the server answers this is a call it refuses (see Outage)
        self.outage.probe = queues[0].ping
        self.runner.noting = functools.partial(self.slots.failing, self.index)
        self.outage.call(queues[0].ping)   # connect now: the first wake pays no handshake
        # Batches of short jobs, on unless EMQ_BATCH_CLAIMS=0. Each job's ack is posted as
        # it finishes (written at once, its reply read with the next claim's), so a child
        # killed mid-batch runs again only the job it ran, as without batches. One plain
        # queue only (the order of several is per claim), on a connection acks can be
        # posted on (not durable: its wait is per write; not a cluster client).
        self.batches = (batch_claims_wanted() and self.queues.single
                        and queues[0].can_post)
        self.short = False     # the last job ran under SHORT
        self.size = 1          # the next batch's size: doubles while jobs run short
        self.time_mode: bool | None = None   # the queue's fairness is "time" (per drain)
        self.holding = Holding(HAND_ON_AFTER, self._release_held)
        #: Acks posted (written, reply not read yet), in the order sent: (its Owed, the job)
        self.posted: list[tuple[Owed, Done]] = []
        self.runner.fire("child_started")
        if self.config.runs_async:
            from .async_child import AsyncDrain

            AsyncDrain(self).run()
            return
        self._serve()

    def _serve(self) -> None:
        while not self._should_stop():
            try:
                message = self.pipe.recv_bytes()
            except (EOFError, OSError):
                return
            if message == STOP:
                return
            self._drain()
            if self._spent():
                return
            self.pipe.send_bytes(self.idle_message())

    def _on_term(self, _signum: int, _frame: Any) -> None:
        runner: Runner | None = getattr(self, "runner", None)
        lease = runner.current if runner is not None else None
        if runner is not None and lease is not None \
                and self.slots.take_time_limit(self.index, lease.nonce):
            # The master's SIGTERM for a sync job past its time limit: stop the task (the
            # runner fails the job through the fence) and stay for the next job. The one
            # handler that raises: as with Celery's soft time limit, the task itself must be
            # left. Past the task already (its result being written): nothing to stop.
            if runner.in_task:
                limit = runner.time_limit(lease)
                raise TimeLimitExceeded(f"ran past its time limit of {limit:g}s")
            return
        self.terminating = True

    def _on_abort(self, _signum: int, _frame: Any) -> None:
        """The master asked to abort an attempt this child runs (its nonce in the job's
        slot): the job's context is marked aborted and, when it is the sync task running
        now, Aborted is raised in it at the next bytecode. A nonce that is not the running
        attempt's (it ended, or the job was claimed again since) changes nothing."""
        runner: Runner | None = getattr(self, "runner", None)
        if runner is None:
            return
        for index in self.slots.of_child(self.index):
            nonce = self.slots.abort_asked(index)
            ctx = runner.abort_asked(nonce) if nonce else None
            lease = runner.current
            if ctx is None or lease is None or lease.nonce != nonce or not runner.in_task \
                    or self._aborted == nonce:
                continue
            self._aborted = nonce
            if runner.here is not None:   # an async task run to its end here: cancelled
                runner.loop().call_soon_threadsafe(runner.here.cancel)
                return
            raise Aborted(f"job {lease.id} was aborted while running (attempt "
                          f"{lease.attempts})")

    def _spent(self) -> bool:
        return self.max_tasks > 0 and self.done >= self.max_tasks

    def _should_stop(self) -> bool:
        return (self.terminating or self.slots.stopping or os.getppid() != self.master_pid
                or self._spent())

    def may_claim(self) -> bool:
        """Whether to claim (more) work now: not stopping, and the master is renewing leases
        (its heartbeat in the slots is fresh). A frozen master's children finish what they
        run and claim nothing more, so its freeze costs at most one duplicate per job held;
        they claim again once its loop turns and wakes them."""
        if self._should_stop():
            return False
        silent = self.slots.master_silent()
        if silent and not self._said_silent:
            log.warning("child %d: the master has not renewed leases for %.1fs; claiming "
                        "nothing until it does", self.index, silent)
        self._said_silent = bool(silent)
        return not silent

    def idle_message(self) -> bytes:
        """What to tell the master when the drain stops: IDLE, or HELD when it stopped
        because the master was silent (work may wait: the master answers it with a go)."""
        return HELD if self._said_silent else IDLE

    def got_work(self, qi: int) -> None:
        """Tell the master more is waiting on queue qi: it recruits a sibling."""
        self.pipe.send_bytes(GOT_WORK + bytes([qi]))

    def claim(self) -> Claimed | None:
        """One claim, riding out an outage; a claim the server refuses is nothing to claim
        (after a back-off, logged once: Refusals)."""
        return self.refusals.claim(lambda: self.outage.call(self.queues.claim))

    def _drain(self) -> None:
        if self.batches:
            self._drain_batches()
            return
        runner, slots, qs = self.runner, self.slots, self.queues
        index = slots.of_child(self.index).start
        if not self.may_claim():
            return
        claimed = self.claim()
        if claimed is None:
            return
        if claimed[1].more:
            self.got_work(claimed[0])
        while claimed is not None:
            qi, lease = claimed
            plan = runner.plan(lease)
            slots.start(index, lease, plan.time_limit, plan.kind, qi, plan.retry_delay,
                        plan.abort_grace)
            result, outcome, ctx = runner.execute(lease, qi, plan)
            # The slot keeps the lease until its outcome is written: a child that dies in
            # between has its job retried through the fence (stale if the ack landed).
            self.done += 1
            more = self.may_claim()
            settled = None if outcome is not None else runner.ack(
                functools.partial(qs.ack, qi, lease, result or "null", more,
                                  tracing.span_of(ctx)), ctx, qi, plan)
            if settled is not None:
                acked, claimed = settled
                runner.acked(lease, qi, acked, ctx)
            elif more:
                slots.clear(index)       # settled: a refused claim may pause a while
                claimed = self.claim()
            else:
                claimed = None
        slots.clear(index)

    # -- batches of short jobs (one plain queue) ----------------------------------------
    def _drain_batches(self) -> None:
        """The drain of a child of one queue: as ``_drain`` while jobs run long; while they
        run short, BATCH claimed at once. Each job's ack is written as it finishes (posted:
        its reply read with the next claim's), so a batch costs about one round trip and a
        child killed mid-batch runs again only the job it ran. The jobs held behind the
        running one are handed on when it runs long (holding.py)."""
        runner, slots = self.runner, self.slots
        index = slots.of_child(self.index).start
        if not self.may_claim():
            return
        # Each drain starts at one job and doubles: the first claims of a wake take the
        # ring's first turns one at a time (a quiet group's job is not held behind a batch)
        self.size = 1
        self.time_mode = None   # read again once a drain, when it would batch
        held = self._claim_batch(1)
        since = time.monotonic()   # when the jobs held now were claimed (Holding.begin)
        if held and held[-1].more:
            self.got_work(0)   # as _drain: once a drain, the master recruits a sibling
        while held:
            if self.terminating or self.slots.stopping:
                # a warm stop finishes the job in hand (the one just run) and starts no
                # other: every job held (claimed, not started) goes back, as _drain claims
                # no next job once it stops
                for spare in held:
                    self.outage.call(self.queues.queues[0].release, spare,
                                     "released by a stopping worker")
                    slots.unhold(self.index, spare)
                break
            if self.posted:
                # the acks whose replies are in (or whose connection the server closed:
                # sent again now) settled before the next job runs, however long: its slot
                # no longer keeps the leases of the jobs acked before it
                self.queues.queues[0].poll_posted()
                self._settle_posted()
            lease = held.pop(0)
            plan = runner.plan(lease)
            slots.start(index, lease, plan.time_limit, plan.kind, 0, plan.retry_delay,
                        plan.abort_grace)
            slots.unhold(self.index, lease)   # in its slot now: held no more
            if held:
                self.holding.begin(held, since)
            began = time.perf_counter()
            result, outcome, ctx = runner.execute(lease, 0, plan)
            self.short = time.perf_counter() - began < SHORT
            if held:
                held = self.holding.end()
            if outcome is not None and outcome.verdict == "rate_limited" and held:
                held = self._sit_out(lease.group, held, ctx)
            self.done += 1
            done = None if outcome is not None else (
                lease, result or "null", tracing.span_of(ctx), ctx, plan)
            if held:
                if done is not None:
                    self._post_ack(*done)
                continue
            more = self.may_claim()
            held = self._ack_and_claim(done, self._batch() if more else 0)
            since = time.monotonic()
            if not more:
                slots.clear(index)
        self._settle_posted(collect=True)   # every verdict in before the child idles
        slots.clear(index)

    def _batch(self) -> int:
        """How many to claim next: 2, 4, then BATCH while jobs run short, else one; never
        past the child's --max-tasks-per-child."""
        self.size = min(2 * self.size, BATCH) if self.short else 1
        n = self.size
        if n > 1 and self.time_mode is None:
            # In time mode a job's charge is its claim to its ack: a batch would charge each
            # job the whole batch's time (a short job another group's long one). One at a time.
            fairness = self.queues.queues[0].fairness
            self.time_mode = self.outage.call(fairness) == "time"
        if self.time_mode:
            n = self.size = 1
        return min(n, self.max_tasks - self.done) if self.max_tasks > 0 else n

    def _claim_batch(self, n: int) -> list[Lease]:
        """Up to n jobs (a refused claim is none, as ``claim``); the replies of the acks
        posted before it are read with its own."""
        if n == 1:
            claimed = self.claim()
            held = [claimed[1]] if claimed is not None else []
        else:
            q = self.queues.queues[0]
            held = self.refusals.claim(lambda: self.outage.call(q.claim, n)) or []
        self.slots.hold(self.index, held)   # a child killed now: the master releases them
        self._settle_posted()
        return held

    def _ack_and_claim(self, done: Done | None, n: int) -> list[Lease]:
        """The last job of a batch acked and up to n next claimed, in one round trip: at a
        long job's pace (n <= 1) one ack-and-claim-next call, as ``_drain``; else its ack
        posted and the claim sent behind it. The jobs claimed."""
        if done is None or n > 1:
            if done is not None:
                self._post_ack(*done)
            if n > 0:
                return self._claim_batch(n)
            self._settle_posted()
            return []
        lease, result, span, ctx, plan = done
        settled = self.runner.ack(functools.partial(
            self.queues.ack, 0, lease, result, n == 1, span), ctx, 0, plan)
        held = [settled[1][1]] if settled is not None and settled[1] is not None else []
        self.slots.hold(self.index, held)
        self._settle_posted()
        if settled is None:   # refused for good (the attempt failed): claim on its own
            return self._claim_batch(n) if n > 0 else []
        self.runner.acked(lease, 0, settled[0], ctx)
        return held

    def _post_ack(self, lease: Lease, result: str, span: str | None, ctx: Any,
                  plan: Any) -> None:
        """A finished job's ack written now; its verdict reaches runner.acked once its reply
        is read (``_settle_posted``). Not postable yet (the ack's path not known): acked
        now, in a round trip of its own."""
        q = self.queues.queues[0]
        owed = q.post_ack(lease, result, span)
        if owed is None:
            self._ack_alone((lease, result, span, ctx, plan))
            return
        self.posted.append((owed, (lease, result, span, ctx, plan)))
        if owed.reply is not UNREAD:   # lost as it was written: sent again now
            self._settle_posted()

    def _settle_posted(self, collect: bool = False) -> None:
        """The verdicts of the posted acks whose replies were read (``collect``: all of them,
        read now) to runner.acked: its hook, log and stats. An ack whose reply was an error
        or was lost with its connection is sent again alone (``_ack_alone``)."""
        if not self.posted:
            return
        q = self.queues.queues[0]
        if collect:
            q.collect_posted()
        posted, self.posted = self.posted, []
        for i, (owed, done) in enumerate(posted):
            if owed.reply is UNREAD:   # replies are read in order: the rest wait too
                self.posted[:0] = posted[i:]
                return
            verdict = q.posted_verdict(owed)
            if verdict is None:
                self._ack_alone(done)
            else:
                self.runner.acked(done[0], 0, bool(verdict), done[3])

    def _ack_alone(self, done: Done) -> None:
        """An ack in a call of its own, riding out an outage (fenced: an ack of this holder
        that landed already is answered DONE); refused for good, the attempt fails
        (runner.ack), as an ack of ``_drain``."""
        lease, result, span, ctx, plan = done
        q = self.queues.queues[0]
        got = self.runner.ack(functools.partial(q.ack, lease, result, False, span=span),
                              ctx, 0, plan)
        if got is not None:
            self.runner.acked(lease, 0, bool(got.verdict), ctx)

    def _sit_out(self, group: str, held: list[Lease], ctx: Any) -> list[Lease]:
        """A job hit an outside limit (RateLimited): its group sits out the delay, so the
        jobs of it held behind go back too (their places kept, the same back-off) rather
        than run into the limit as jobs not yet claimed would not; the others, to run."""
        delay = float(getattr(getattr(ctx, "exception", None), "delay", 0.0) or 0.0)
        q = self.queues.queues[0]
        for spare in (h for h in held if h.group == group):
            self.outage.call(q.release, spare, "released: its group sits out a rate limit",
                             delay)
            self.slots.unhold(self.index, spare)
        return [h for h in held if h.group != group]

    def _release_held(self, held: list[Lease]) -> None:
        """The watchdog's: jobs held behind a long one go back to the head of their lanes."""
        for lease in held:
            self._spare_queue().release(lease, "handed on: held behind a long job")
            self.slots.unhold(self.index, lease)

    def _spare_queue(self) -> Queue:
        """A queue on a connection of the watchdog's own (made when first needed)."""
        spare: Queue | None = getattr(self, "_spare", None)
        if spare is None:
            spare = self._spare = self.config.make_queues()[0]
        return spare
