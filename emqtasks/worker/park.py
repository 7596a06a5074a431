"""The park thread of a master: reap and promote on the tick, and park while a child idles.

One Parker serves the queues of the -Q list that live on one server: one blocking BLPOP on
all their wake keys, with a timeout of the earliest next-due time over them (capped by the
tick). On a Redis Cluster every queue has a slot of its own, possibly on another node, so
the master runs one Parker per queue. A token a Parker takes becomes a byte (the queue's
index) on the master's wake pipe.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

import redis.exceptions as rex

from .. import clock
from ..clock import ClockWatch
from ..observe.heartbeat import BEAT_TICKS, Beat
from ..store.keys import WAKE_DUE
from ..store.queue import Queue
from .resilience import TRANSIENT, FullServer, Outage
from .scheduler import Scheduler
from .threads import ServerThread

log = logging.getLogger("emqtasks.worker")
#: Seconds a park may outlast its timeout before it is given up (see _park): past a round
#: trip and the server's timer resolution, and a step of the server's clock that size is
#: below what clock.py reports.
PARK_SLACK = 3.0


class Parker(ServerThread):
    """Reap, promote and park for the queues ``indexes`` of a master's -Q list."""

    def __init__(self, make_queues: Callable[[], list[Queue]], indexes: list[int],
                 tick: float, has_idle: threading.Event, stop: threading.Event,
                 wake: Callable[[int], None], first_due: dict[int, float | None],
                 scheduler: Scheduler | None = None,
                 beat: Callable[[], Beat] | None = None,
                 full: FullServer | None = None) -> None:
        super().__init__(make_queues, indexes, stop)
        self.tick = tick
        self.has_idle = has_idle
        self.wake = wake
        now = time.monotonic()
        # The first promote ran at the master's start: trust the next-due time it gave.
        self.next_promote = [now + min(tick, first_due.get(i) or tick) for i in indexes]
        # Per queue: a delayed job is known to wait (the last promote said when), or a 'd'
        # token was taken that no promote acted on yet. A stopping master hands a 'd' on
        # for each (it may hold the only one): see due_to_hand_on.
        self.due_known = [first_due.get(i) is not None for i in indexes]
        self.due_held = [False] * len(indexes)
        self.next_reap = now + tick
        #: The periodic schedules of the master's first queue (kept by one Parker only);
        #: its first call loads them.
        self.scheduler = scheduler
        self.next_sched = 0.0 if scheduler is not None else float("inf")
        #: The master's heartbeat (heartbeat.py), written with each tick's reap.
        self.beat = beat
        #: Per queue, the server's clock as this master's ticks saw it (clock.py).
        self.watches = [ClockWatch() for _ in indexes]
        #: A full server refuses the heartbeat and schedules' jobs: said once (resilience.py)
        self.full = full if full is not None else FullServer(log, "park")

    def due_to_hand_on(self) -> list[int]:
        """The master's queue indexes whose 'd' token this Parker may be holding."""
        return [i for j, i in enumerate(self.indexes) if self.due_known[j] or self.due_held[j]]

    def run(self) -> None:
        outage = Outage(log, "park", stop=self.stop.is_set)
        queues = self.connect(outage)
        if queues is None:
            return   # stopped before the server came back
        while not self.stop.is_set():
            try:
                self._round(queues, outage)
            except TRANSIENT:
                continue   # only when stopping; the outage already logged it
            except Exception:
                log.exception("park loop error; carrying on")
                self.stop.wait(1.0)

    def _round(self, queues: list[Queue], outage: Outage) -> None:
        now = time.monotonic()
        ticked = now >= self.next_reap
        if ticked:
            beat = self.beat() if self.beat is not None else None
            for q, watch in zip(queues, self.watches):
                # the reap runs on a full server; the heartbeat beside it is refused there
                self.full.call(outage.call, reap, q, beat, beat_ttl(self.tick), watch,
                               always_writes=beat is not None)
            self.next_reap = now + self.tick
        if self.scheduler is not None and (ticked or now >= self.next_sched):
            # Due slots of periodic schedules; on the tick, a look for changed ones.
            slot_in = self.full.call(outage.call, self.scheduler.run_due, queues[0], ticked,
                                     always_writes=False)
            self.next_sched = now + min(self.tick, 1.0 if slot_in is None else slot_in)
        for j, q in enumerate(queues):
            if now >= self.next_promote[j] and self._promote(j, q, now, outage):
                return
        horizon = max(min(self.next_reap, self.next_sched, *self.next_promote)
                      - time.monotonic(), 0.001)
        if not self.has_idle.wait(horizon) or self.stop.is_set():
            return
        got = outage.call(self.pop, _park, queues, horizon)
        if got is None:
            return
        j, token = got
        if self.stop.is_set():   # not ours to use: hand it on
            self.full.call(outage.call, queues[j].push_wake, token)
        elif token == WAKE_DUE:
            self.due_held[j] = True   # until a promote acts on it
            self.next_promote[j] = 0.0
        else:
            self.has_idle.clear()
            self.wake(self.indexes[j])

    def _promote(self, j: int, q: Queue, now: float, outage: Outage) -> bool:
        """Promote queue j; True when work waits on its ring while a child idles (its wake
        token was lost: a BLPOP reply dropped with the connection, a master killed holding
        it; tokens are hints, the ring is the truth): the master is woken for it."""
        due_in, claimable = outage.call(promote, q)
        self.due_known[j], self.due_held[j] = due_in is not None, False
        # While children are busy nobody parks to hear of new delayed work, so look at
        # least every second; an idle pool hears it on the wake key.
        look = self.tick if self.has_idle.is_set() else min(self.tick, 1.0)
        self.next_promote[j] = now + min(look, due_in if due_in is not None else look)
        if claimable and self.has_idle.is_set() and not self.stop.is_set():
            self.has_idle.clear()
            self.wake(self.indexes[j])
            return True
        return False


def _park(queues: list[Queue], horizon: float) -> tuple[int, str] | None:
    """Queue.park_many, bounded by this host's clock. A server times a BLPOP by its wall
    clock, so while its clock is behind after a step back every pop lasts that much longer
    and the tick (reap, promote, the clock check) would wait with it: a pop that outlives
    its timeout by PARK_SLACK is given up (its connection closed), as if it timed out."""
    try:
        return Queue.park_many(queues, horizon, bound=horizon + PARK_SLACK)
    except rex.TimeoutError:
        return None


def beat_ttl(tick: float) -> int:
    """A heartbeat's expiry, ms: BEAT_TICKS ticks (at least 3 s)."""
    return max(3000, int(BEAT_TICKS * tick * 1000))


def reap(queue: Queue, beat: Beat | None = None, ttl_ms: int = 0,
         watch: ClockWatch | None = None) -> None:
    """The tick's reap (and heartbeat); with a ``watch``, the server time it read is
    checked for a step of the server's clock (clock.py), logged once and recorded."""
    sent = clock.elapsed()
    reaped = queue.reap_tick(beat=beat, beat_ttl_ms=ttl_ms)
    answered = clock.elapsed()
    if reaped.returned or reaped.dead:
        log.info("reaped expired leases of queue %s: %d back to their lanes, %d ended "
                 "(dead, or aborted as asked)",
                 queue.name, reaped.returned, reaped.dead)
    if watch is not None:
        step = watch.observe(reaped, sent, answered)
        if step:
            clock.report(queue, step, reaped.server_ms, first=watch.ticks == 1)


def promote(queue: Queue) -> tuple[float | None, bool]:
    """Promote every due job; returns (seconds until the next is due or None, whether a
    claim would find work now)."""
    _, due_in, claimable = queue.promote_and_look()
    while due_in == 0:
        _, due_in, claimable = queue.promote_and_look()
    return due_in, claimable


def wake_byte(fd: int) -> Callable[[int], None]:
    """What a Parker calls to wake the master: one byte, the queue's index, on its pipe."""
    def wake(index: int) -> None:
        os.write(fd, bytes([index]))
    return wake
