"""Riding out transient Redis errors: retry with backoff, log once per outage; and claims the
server refuses with an error reply: back off, log once while they last."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis.exceptions as rex
import tenacity

T = TypeVar("T")

#: Errors that pass: a dropped connection, a restarting or loading server, a failover.
#: On a Redis Cluster also: ClusterError (CLUSTERDOWN and MASTERDOWN are kinds of it, and
#: redis-py raises it bare when MOVED/ASK/TRYAGAIN redirections outlast its retries, as
#: while a queue's slot migrates) and RedisClusterException: the cluster client's "cannot be
#: connected" when no node answers (the cluster's ConnectionError) and SlotNotCoveredError
#: (a slot map read mid-failover). Its other kinds (CROSSSLOT in a transaction, a malformed
#: pipeline) cannot come from a queue's calls, whose keys all hash to the queue's one slot.
TRANSIENT = (rex.ConnectionError, rex.TimeoutError, rex.BusyLoadingError, rex.ReadOnlyError,
             rex.TryAgainError, rex.ClusterDownError, rex.MasterDownError, rex.ClusterError,
             rex.RedisClusterException)


class Outage:
    """Runs Redis calls; on a transient error retries with exponential backoff (5 ms to
    ``max_wait`` s) until the server answers, logging the start and end of each outage once.
    The fast path is a plain call: no retry machinery unless something failed.
    """

    def __init__(self, log: logging.Logger, what: str, max_wait: float = 2.0,
                 stop: Callable[[], bool] = lambda: False) -> None:
        self.log = log
        self.what = what
        self.down = False
        self._retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(TRANSIENT),
            wait=tenacity.wait_exponential(multiplier=0.005, max=max_wait),
            stop=lambda state: stop(),
            before_sleep=self._note,
            reraise=True,
        )

    def _note(self, state: tenacity.RetryCallState) -> None:
        if not self.down:
            self.down = True
            exc = state.outcome.exception() if state.outcome else None
            self.log.warning("Redis unavailable (%s): %s; retrying with backoff", self.what, exc)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except TRANSIENT:
            result = self._retrying(fn, *args, **kwargs)
            if self.down:
                self.down = False
                self.log.warning("Redis is back (%s)", self.what)
            return result


class Refusals:
    """Claims the server answers with an error reply: a key of the queue of the wrong type
    (``emqtasks check`` names it), a full server... A refused claim is logged once when the
    refusals start and once when claims are served again, and counts as nothing to claim
    after a pause that doubles while they last (``first`` to ``cap`` seconds; ``sleep`` None:
    no pause, for a caller whose loop paces it). So a child neither crash-loops nor hammers
    the server; the master's crash back-off is kept for crashes. A claim writes nothing
    when it is refused, so trying it again later is always safe.
    """

    def __init__(self, log: logging.Logger, what: str, first: float = 0.1, cap: float = 2.0,
                 sleep: Callable[[float], None] | None = time.sleep) -> None:
        self.log = log
        self.what = what
        self.first, self.cap, self.sleep = first, cap, sleep
        self.pause = 0.0

    def claim(self, fn: Callable[[], T]) -> T | None:
        try:
            claimed = fn()
        except rex.ResponseError as exc:
            if not self.pause:
                self.log.warning("claims refused (%s): %s; backing off", self.what, exc)
            self.pause = min(self.cap, self.pause * 2 or self.first)
            if self.sleep is not None:
                self.sleep(self.pause)
            return None
        if self.pause:
            self.pause = 0.0
            self.log.warning("claims are served again (%s)", self.what)
        return claimed
