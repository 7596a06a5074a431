"""The jobs a batching child holds while it runs one, handed on when that one runs long.

A child whose jobs run short claims a few at once (child.py, ``Batch``). The ones it has
not started wait behind the one it runs, and the ones it finished wait for their ack (sent
with the next batch's claim). A job that runs long must not hold them (Celery's prefetch
problem): past ``after`` seconds a watchdog thread releases the unstarted ones (back to
the head of their lanes, attempt rolled back: another child takes them) and acks the
finished ones, on a connection of its own (the child's is single-thread). The thread is
started at the first batch, and waits on a condition between jobs: per job it costs two
lock round trips of the child, no syscall unless a job runs long.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..store.queue import Lease

log = logging.getLogger("emqtasks.child")

#: A finished job waiting for its ack: (lease, result JSON, span, what the child keeps).
Finished = tuple[Lease, str, "str | None", Any]


class Holding:
    """The held jobs of one child, and the thread that hands them on when one runs long."""

    def __init__(self, after: float, release: Callable[[list[Lease]], None],
                 ack: Callable[[list[Finished]], list[bool]]) -> None:
        self.after = after
        self._release = release
        self._ack = ack
        self._cond = threading.Condition()
        self._deadline: float | None = None   # while a job runs with others held
        self.held: list[Lease] = []           # claimed, not started
        self.finished: list[Finished] = []    # run, not acked
        #: What the watchdog acked (the finished job, its verdict): the child reports them.
        self.acked: list[tuple[Finished, bool]] = []
        self._thread: threading.Thread | None = None
        self._handing = False   # the watchdog is acking / releasing what it took

    def begin(self, held: list[Lease], finished: list[Finished], since: float) -> None:
        """A job starts while others are held: they are the watchdog's until ``end``.
        ``since``: when the batch was claimed (time.monotonic()). The deadline counts from
        it, not from this job's start: nobody renews a held or finished job's lease, so
        none may wait more than ``after`` however many jobs just under it run first."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="emq-holding",
                                            daemon=True)
            self._thread.start()
        with self._cond:
            self.held, self.finished = held, finished
            self._deadline = since + self.after
            self._cond.notify_all()

    def end(self) -> tuple[list[Lease], list[Finished]]:
        """The job ended: what is still held (none when the watchdog handed it on) is the
        child's again. A hand-on under way is waited for: its acks are then in ``acked``
        for the child to report, and a child that exits next (--max-tasks-per-child, a
        stop) does not cut its daemon thread off mid-way (acks lost, jobs left active)."""
        with self._cond:
            self._deadline = None
            while self._handing:
                self._cond.wait()
            held, finished = self.held, self.finished
            self.held, self.finished = [], []
        return held, finished

    def _watch(self) -> None:
        while True:
            with self._cond:
                while self._deadline is None:
                    self._cond.wait()
                wait = self._deadline - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue   # ended, or a new deadline, or time: look again
                self._deadline = None
                held, self.held = self.held, []
                finished, self.finished = self.finished, []
                self._handing = True
            try:
                self._hand_on(held, finished)
            finally:
                with self._cond:
                    self._handing = False
                    self._cond.notify_all()

    def _hand_on(self, held: list[Lease], finished: list[Finished]) -> None:
        # Outside the lock: the child may end its job meanwhile and find nothing held.
        try:
            if finished:
                verdicts = self._ack(finished)
                with self._cond:
                    self.acked.extend(zip(finished, verdicts, strict=True))
            if held:
                self._release(held)
        except Exception:   # their leases run out and the reaper hands them on
            log.exception("handing on %d held and %d finished jobs failed", len(held),
                          len(finished))

    def take_acked(self) -> list[tuple[Finished, bool]]:
        with self._cond:
            acked, self.acked = self.acked, []
        return acked
