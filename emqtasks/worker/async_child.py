"""A child that runs up to K jobs at once on its event loop (``--async-concurrency K``).

The loop watches the master's pipe (``loop.add_reader``), so a child with room for more is
woken for new work while its jobs are in flight: it says IDLE ("I accept a go") whenever a
claim found nothing and it has room, and claims again on the master's GO. Each job holds
one of the child's K slots (slots.py) from its claim until its outcome is written, so the
master renews every in-flight lease, watches every time limit and, if the child dies,
retries every job it held. An async job runs as an asyncio task under its time limit
(cancelled past it: TimeLimitExceeded, a retry through the fence); a sync job runs inline
and blocks the loop while it runs. Redis calls stay synchronous (they are short).
"""

from __future__ import annotations

import asyncio
import functools
import signal
from typing import TYPE_CHECKING, Any

from ..observe import tracing
from ..store.queue import Lease
from .pipe import GO, STOP
from .queues import Claimed
from .runner import Executed, Plan
from .slots import ASYNC

if TYPE_CHECKING:
    from .child import Child


class AsyncDrain:
    """The claim / run / settle loop of one async child."""

    def __init__(self, child: Child) -> None:
        self.child = child
        self.runner = child.runner
        self.qs = child.queues
        self.call = child.outage.call
        self.free = list(reversed(child.slots.of_child(child.index)))
        self.in_flight = 0
        self.idle_reported = True        # the master counts a new child idle
        self.stop_claiming = False
        self.loop = self.runner.loop()
        self.finished: asyncio.Future[None] = self.loop.create_future()
        self.tasks: set[asyncio.Task[Any]] = set()
        #: The async jobs running now: slot -> (nonce of its claim, its asyncio task).
        self.jobs: dict[int, tuple[str, asyncio.Task[Any]]] = {}

    def run(self) -> None:
        fd = self.child.pipe.fileno()
        self.loop.add_reader(fd, self._on_pipe)
        self.loop.add_signal_handler(signal.SIGUSR1, self._on_abort)
        try:
            self.loop.run_until_complete(self.finished)
        finally:
            self.loop.remove_reader(fd)
            self.loop.remove_signal_handler(signal.SIGUSR1)

    def _on_abort(self) -> None:
        """The master's SIGUSR1 (an abort), on the loop: each async job whose slot names
        its attempt's nonce is marked aborted and its task cancelled (the job ends
        ``aborted``). A sync job blocks the loop while it runs: its abort is its child's
        kill after the grace."""
        for slot, (nonce, task) in list(self.jobs.items()):
            if self.child.slots.abort_asked(slot) == nonce and \
                    self.runner.abort_asked(nonce) is not None and not task.done():
                task.cancel()

    # -- the pipe ---------------------------------------------------------------------------
    def _on_pipe(self) -> None:
        try:
            while self.child.pipe.poll():
                message = self.child.pipe.recv_bytes()
                if message == STOP:
                    self.stop_claiming = True
                elif message == GO:
                    self.idle_reported = False
                    self._fill()
        except (EOFError, OSError):   # the master is gone
            self.stop_claiming = True
            self.loop.remove_reader(self.child.pipe.fileno())
        self._maybe_finish()

    def _report_idle(self) -> None:
        if not self.idle_reported and not self._should_stop():
            self.idle_reported = True
            self.child.pipe.send_bytes(self.child.idle_message())

    def _should_stop(self) -> bool:
        return self.stop_claiming or self.child._should_stop()

    def _maybe_finish(self) -> None:
        if self.in_flight == 0 and self._should_stop() and not self.finished.done():
            self.finished.set_result(None)

    # -- claiming ---------------------------------------------------------------------------
    def _fill(self) -> None:
        """On a go: claim while there is room (the first claim recruits a sibling)."""
        if self._should_stop() or not self.free:
            return
        claimed = self.child.claim() if self.child.may_claim() else None
        if claimed is None:
            self._report_idle()
            return
        if claimed[1].more:
            self.child.got_work(claimed[0])
        self._drive(claimed)

    def _claim_more(self) -> Claimed | None:
        if not self.free or self._should_stop():
            return None
        claimed = self.child.claim() if self.child.may_claim() else None
        if claimed is None:
            self._report_idle()
        return claimed

    def _drive(self, claimed: Claimed | None) -> None:
        """Start claimed and what comes after it, while there is room: an async job as a
        task (then claim another), a sync job inline (then its ack claims the next)."""
        while claimed is not None:
            qi, lease = claimed
            plan = self.runner.plan(lease)
            slot = self.free.pop()
            self.child.slots.start(slot, lease, plan.time_limit, plan.kind, qi,
                                   plan.retry_delay, plan.abort_grace)
            self.in_flight += 1
            if plan.kind == ASYNC:
                task = self.loop.create_task(self._run_async(slot, qi, lease, plan))
                self.jobs[slot] = (lease.nonce, task)
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
                claimed = self._claim_more()
            else:
                claimed = self._settle(slot, qi, lease, plan,
                                       self.runner.execute(lease, qi, plan))

    # -- running and settling -------------------------------------------------------------------
    async def _run_async(self, slot: int, qi: int, lease: Lease, plan: Plan) -> None:
        executed = await self.runner.run(lease, qi, plan, on_loop=True)
        self._drive(self._settle(slot, qi, lease, plan, executed))

    def _settle(self, slot: int, qi: int, lease: Lease, plan: Plan,
                executed: Executed) -> Claimed | None:
        """Ack a success (claiming the next job in the same call when the order allows);
        returns the next job to start, if one was claimed. The slot holds the lease until
        the outcome is written."""
        result, outcome, ctx = executed
        self.jobs.pop(slot, None)
        self.child.done += 1
        more = not self._should_stop()
        claim = more and self.child.may_claim()
        nxt: Claimed | None = None
        settled = None if outcome is not None else self.runner.ack(
            functools.partial(self.qs.ack, qi, lease, result or "null", claim,
                              tracing.span_of(ctx)), ctx, qi, plan)
        if settled is not None:
            acked, nxt = settled
            self.runner.acked(lease, qi, acked, ctx)
        elif claim:
            nxt = self.child.claim()
        self.child.slots.clear(slot)
        self.free.append(slot)
        self.in_flight -= 1
        if nxt is None and more:
            self._report_idle()
        self._maybe_finish()
        return nxt
