"""The jobs a batching child holds while it runs one, handed on when that one runs long.

A child whose jobs run short claims a few at once (child.py, ``_drain_batches``). The ones
it has not started wait behind the one it runs (the ones it finished are acked as each
finishes: nothing of theirs waits). A job that runs long must not hold them (Celery's
prefetch problem): past ``after`` seconds a watchdog thread releases them (back to the head
of their lanes, attempt rolled back: another child takes them), on a connection of its own
(the child's is single-thread). The thread is started at the first batch, and sleeps on a
condition until the batch's deadline: per job it costs two lock round trips of the child;
it is woken (a futex call, and a thread that then wants the GIL) only when a batch's
deadline is earlier than the one it sleeps until, and wakes by itself at most once a batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..store.queue import Lease

log = logging.getLogger("emqtasks.child")


class Holding:
    """The held jobs of one child, and the thread that hands them on when one runs long."""

    def __init__(self, after: float, release: Callable[[list[Lease]], None]) -> None:
        self.after = after
        self._release = release
        self._cond = threading.Condition()
        self._deadline: float | None = None   # while a job runs with others held
        self.held: list[Lease] = []           # claimed, not started
        self._thread: threading.Thread | None = None
        self._handing = False   # the watchdog is releasing what it took
        self._sleeps_until: float | None = None   # the watchdog's wake-up (None: for ever)

    def begin(self, held: list[Lease], since: float) -> None:
        """A job starts while others are held: they are the watchdog's until ``end``.
        ``since``: when the batch was claimed (time.monotonic()). The deadline counts from
        it, not from this job's start: nobody renews a held job's lease, so none may wait
        more than ``after`` however many jobs just under it run first."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="emq-holding",
                                            daemon=True)
            self._thread.start()
        with self._cond:
            self.held = held
            self._deadline = since + self.after
            # Every job of a batch has its deadline: the watchdog already asleep until it
            # (or earlier) is left asleep
            if self._sleeps_until is None or self._sleeps_until > self._deadline:
                self._cond.notify_all()

    def end(self) -> list[Lease]:
        """The job ended: what is still held (none when the watchdog handed it on) is the
        child's again. A hand-on under way is waited for, so a child that exits next
        (--max-tasks-per-child, a stop) does not cut its daemon thread off mid-way (jobs
        left active until their lease runs out)."""
        with self._cond:
            self._deadline = None
            while self._handing:
                self._cond.wait()
            held, self.held = self.held, []
        return held

    def _watch(self) -> None:
        while True:
            with self._cond:
                while self._deadline is None:
                    self._sleeps_until = None
                    self._cond.wait()
                wait = self._deadline - time.monotonic()
                if wait > 0:
                    self._sleeps_until = self._deadline
                    self._cond.wait(wait)
                    continue   # ended, or a new deadline, or time: look again
                self._sleeps_until = None
                self._deadline = None
                held, self.held = self.held, []
                self._handing = True
            try:
                if held:   # outside the lock: the child may end its job meanwhile
                    self._release(held)
            except Exception:   # their leases run out and the reaper hands them on
                log.exception("handing on %d held jobs failed", len(held))
            finally:
                with self._cond:
                    self._handing = False
                    self._cond.notify_all()
