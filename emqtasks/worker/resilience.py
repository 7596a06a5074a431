"""Riding out transient Redis errors: retry with backoff, log once per outage."""

from __future__ import annotations

import logging
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
