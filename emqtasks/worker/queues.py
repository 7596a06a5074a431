"""Several queues per worker: the -Q list, and which queue a child claims from next.

``-Q high,default,low`` is strict: a queue is served only when every queue before it has
nothing claimable (each claim asks the top queue first). ``-Q high:3,low:1`` is weighted:
smooth weighted round robin over the queues that have work (3 claims from ``high`` for each
from ``low`` while both have work). A queue the rotation found empty is passed over until
the rotation comes round again, so an idle queue costs one empty claim per turn.
"""

from __future__ import annotations

import logging

from redis.exceptions import ResponseError

from ..config import QueueSpec, parse_queues
from ..errors import NotDurable
from ..store.queue import Acked, Lease, Queue

log = logging.getLogger("emqtasks.worker")

__all__ = ["Claimed", "QueueSet", "QueueSpec", "parse_queues"]

Claimed = tuple[int, Lease]   # (index of the queue in the -Q list, the lease)


class QueueSet:
    """The queues of one child and the order it claims from them in."""

    def __init__(self, queues: list[Queue], weights: list[int] | None = None) -> None:
        self.queues = queues
        self.single = len(queues) == 1
        self.weights = weights if weights and not self.single else None
        self._current = [0] * len(queues)
        self._empty: set[int] = set()
        self._turns = 0

    # -- claiming ---------------------------------------------------------------------
    def claim(self, after: int = -1) -> Claimed | None:
        """One job from the queue the order picks; None when none has work. Strict: from
        the first queue past index ``after`` that has work."""
        if self.single:
            leases = self.queues[0].claim(1)
            return (0, leases[0]) if leases else None
        if self.weights is None:
            for i in range(after + 1, len(self.queues)):
                leases = self.queues[i].claim(1)
                if leases:
                    return i, leases[0]
            return None
        return self._claim_weighted()

    def _claim_weighted(self) -> Claimed | None:
        while True:
            i = self._peek()
            if i is None:
                self._empty.clear()   # all looked empty: look at every queue next time
                return None
            leases = self.queues[i].claim(1)
            if leases:
                self._commit(i)
                return i, leases[0]
            self._empty.add(i)

    def ack(self, qi: int, lease: Lease, result: str, claim_next: bool,
            span: str | None = None) -> tuple[bool, Claimed | None]:
        """Acknowledge a job of queue qi; with claim_next, the next job: in the same call
        when the order would claim from qi next, else by a claim after the ack. ``span``:
        the run's (Queue.ack), when it recorded one."""
        q = self.queues[qi]
        if self.single or (claim_next and self._next_is(qi)):
            acked, nxt = durable_ack(q, lease, result, claim_next, span)
            if nxt is not None:
                if self.weights is not None:
                    self._commit(qi)
                return bool(acked), (qi, nxt)
            if not claim_next or self.single:
                return bool(acked), None
            if self.weights is not None:
                self._empty.add(qi)
            return bool(acked), self._claim_after(qi)   # strict: qi (the top) had none
        acked, _ = durable_ack(q, lease, result, False, span)
        return bool(acked), self._claim_after(-1) if claim_next else None

    def _claim_after(self, after: int) -> Claimed | None:
        """The claim that follows an ack made: one the server refuses is no next job (the
        child's next claim meets the refusal, backs off and says so), as an ack-and-claim
        whose claim the server could not serve."""
        try:
            return self.claim(after)
        except ResponseError:
            return None

    # -- the order --------------------------------------------------------------------
    def _next_is(self, qi: int) -> bool:
        if self.weights is None:
            return qi == 0
        return self._peek() == qi

    def _peek(self) -> int | None:
        """The queue smooth weighted round robin picks next (among those not found empty)."""
        assert self.weights is not None
        best, best_score = None, 0
        for i, w in enumerate(self.weights):
            if i in self._empty:
                continue
            score = self._current[i] + w
            if best is None or score > best_score:
                best, best_score = i, score
        return best

    def _commit(self, picked: int) -> None:
        assert self.weights is not None
        total = 0
        for i, w in enumerate(self.weights):
            if i not in self._empty:
                self._current[i] += w
                total += w
        self._current[picked] -= total
        self._turns += 1
        if self._turns >= sum(self.weights):
            self._turns = 0
            self._empty.clear()   # a full turn: look at the queues found empty again


def durable_ack(q: Queue, lease: Lease, result: str, claim_next: bool,
                span: str | None = None) -> Acked:
    """``q.ack``; with the queue durable (q.durable), an ack too few replicas confirmed is
    logged, not raised: the job is done and its result stored on the primary (running it
    again would not make that copy safer, and the producer is not waiting on this call)."""
    try:
        return q.ack(lease, result, claim_next, span=span)
    except NotDurable as exc:
        log.warning("job %s: %s", lease.id, exc)
        acked: Acked = exc.reply   # type: ignore[assignment]
        return acked
