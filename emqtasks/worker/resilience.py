"""Riding out transient Redis errors: retry with backoff, log once per outage; and claims the
server refuses with an error reply: back off, log once while they last."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis.exceptions as rex
import tenacity

from ..errors import ServerFull

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


#: A call whose connection is cut this many times in a row while the server answers a PING
#: each time is refused, not caught in an outage.
REFUSALS = 3


#: What redis-py's Sentinel connection raises (a ConnectionError) when the primary it knew
#: answers READONLY: a failover under way, so an outage, whatever a PING answers meanwhile.
DEMOTED = "previous master is now a"


class Refused(Exception):
    """The server cut the connection on one call again and again while it answered a PING
    each time: it refuses that call (an argument over its proto-max-bulk-len is answered so),
    and sending it again cannot help."""


class Outage:
    """Runs Redis calls; on a transient error retries with exponential backoff (5 ms to
    ``max_wait`` s) until the server answers, logging the start and end of each outage once.
    The fast path is a plain call: no retry machinery unless something failed.

    With a ``probe`` (a PING), a connection error is told apart from a refusal: when the
    probe answers after each of REFUSALS cuts of the same call, the server is up and it is
    that call it will not take: Refused is raised instead of retrying for ever.
    """

    def __init__(self, log: logging.Logger, what: str, max_wait: float = 2.0,
                 stop: Callable[[], bool] = lambda: False,
                 probe: Callable[[], object] | None = None) -> None:
        self.log = log
        self.what = what
        self.down = False
        self.probe = probe
        self._refusals = 0
        self._retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(TRANSIENT),
            wait=tenacity.wait_exponential(multiplier=0.005, max=max_wait),
            stop=lambda state: stop() or self._refused(state),
            before_sleep=self._note,
            reraise=True,
        )

    def _refused(self, state: tenacity.RetryCallState) -> bool:
        exc = state.outcome.exception() if state.outcome else None
        if self.probe is None or not isinstance(exc, rex.ConnectionError) \
                or DEMOTED in str(exc):
            self._refusals = 0
            return False
        try:
            self.probe()
        except TRANSIENT:
            self._refusals = 0   # the server does not answer: an outage
            return False
        self._refusals += 1
        return self._refusals >= REFUSALS

    def _note(self, state: tenacity.RetryCallState) -> None:
        if not self.down:
            self.down = True
            exc = state.outcome.exception() if state.outcome else None
            self.log.warning("Redis unavailable (%s): %s; retrying with backoff", self.what, exc)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except TRANSIENT:
            self._refusals = 0
            try:
                result = self._retrying(fn, *args, **kwargs)
            except rex.ConnectionError as exc:
                if self._refusals < REFUSALS:
                    raise
                self._refusals = 0
                if self.down:
                    self.down = False
                    self.log.warning("Redis answers, but refuses that call (%s): %s",
                                     self.what, exc)
                raise Refused(f"the server cut the connection on this call {REFUSALS + 1} "
                              f"times while it answered a PING: {exc}") from exc
            if self.down:
                self.down = False
                self.log.warning("Redis is back (%s)", self.what)
            return result


class FullServer:
    """A full server (used memory over maxmemory, policy noeviction) said once: one line
    when it starts refusing what a master writes on its own account — its heartbeat, a
    periodic schedule's job, a wake token handed on — and one when it takes them again, not
    one per tick. Jobs still run and settle meanwhile: the verbs that do so run on a full
    server (lua/lib/core.lua, runs_when_full)."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self.log = log
        self.what = what
        self.full = False

    def refused(self, exc: BaseException) -> None:
        if not self.full:
            self.full = True
            # the server's own words (a ServerFull says "the server is full" itself)
            said = exc.reply if isinstance(exc, ServerFull) and exc.reply else exc
            self.log.warning("the server is full (%s): %s; jobs still run and settle, while "
                             "heartbeats, schedules and new work wait for room", self.what,
                             said)

    def took(self) -> None:
        if self.full:
            self.full = False
            self.log.warning("the server has room again (%s)", self.what)

    def call(self, fn: Callable[..., T], *args: Any, always_writes: bool = True) -> T | None:
        """fn(*args), a call that writes on the master's own account; None when a full
        server refused it. Its success shows the server has room again only if it always
        writes (a heartbeat does; a look for due schedules mostly does not)."""
        try:
            result = fn(*args)
        except rex.OutOfMemoryError as exc:
            self.refused(exc)
            return None
        if always_writes:
            self.took()
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
