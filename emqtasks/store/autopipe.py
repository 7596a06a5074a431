"""Auto-pipelining of enqueues: the calls a queue's producers make while one of theirs is in
flight go out together, as one enqueue, in the next write (as ioredis and Lettuce pipeline).

A web app enqueues from many threads or coroutines at once. Sent one by one, each call is a
round trip and a verb run on the server; gathered, a burst of N calls is one round trip and
one run of the enqueue verb for N jobs (a job in a batch costs the server a fraction of a
job sent alone). Each caller still gets its own answer: the verdicts of its own jobs
(ENQUEUED, DUPLICATE, FULL, TENANT... in the order the server admitted them, as if the calls had
been sent one after the other in that order), its own NotDurable, and when the batch as a
whole fails (a corrupt queue key, a full server, a broken connection: nothing is written,
or what was is idempotent by job id) each call is sent again alone, so its error is the
one it would have had alone.

A call made while nothing is in flight is sent at once, alone: a sparse producer pays one
round trip per call, as before, and no wait for a batch to fill.

Threads (``Batcher``): no background thread. The first caller finding nothing in flight
sends its own call; calls arriving meanwhile queue up; when its round trip is back, the
oldest waiting caller becomes the next leader and sends every queued call in one go.
asyncio (``AsyncBatcher``): the calls made in one turn of the event loop are sent together
by a flusher task, which keeps sending what queued while it was awaiting until none is left.

A durable batch (store/durable.py) keeps the durable semantics: calls of one durable setting
are one write followed by one WAIT (whose offset covers every job of the batch), and each
caller of a batch too few replicas confirmed gets NotDurable naming its own jobs.

A batch's expiries and tenants are its calls' in order (None for a call that names none),
sent as enqueue_plan sends them: a batch sends the tenants section only when one of its
jobs names a tenant, and a job whose group is another tenant's and busy answers TENANT to
its own caller alone.

Off by default in this release: ``EMQ_AUTOPIPELINE`` (``0``, the default, or ``1``) or
``App(autopipeline=...)`` turns it on. It is new, and changes when and with what a call's
write goes out; it becomes the default after a long soak. A cluster client never batches
(queue.py): its commands are routed and redirected by redis-py one by one, and a pre-packed
batch cannot follow a MOVED.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, NotDurable
from ..verdicts import EnqueueVerdict
from .durable import Durable

if TYPE_CHECKING:   # (config.py reads autopipeline_mode: no import of the verbs here)
    from .replies import NewJob

#: A call of more jobs than this is a batch already: sent at once, on its own.
BATCHABLE = 100

Verdicts = list[EnqueueVerdict]
Expiries = Sequence[int | None] | None
Tenants = Sequence[str | None] | None


def autopipeline_mode(environ: Mapping[str, str] | None = None) -> bool:
    """``EMQ_AUTOPIPELINE``: off (the default in this release: unset, ``0``...) or on
    (``1``, ``true``...)."""
    env = os.environ if environ is None else environ
    word = (env.get("EMQ_AUTOPIPELINE") or "0").strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"EMQ_AUTOPIPELINE is 1 or 0, not {word!r}")


class _Call:
    """One caller's enqueue, and what came of it."""

    __slots__ = ("jobs", "expires", "tenants", "durable", "verdicts", "error", "alone",
                 "lead", "done")

    def __init__(self, jobs: Sequence[NewJob], expires: Expiries, tenants: Tenants,
                 durable: Durable | None) -> None:
        self.jobs = jobs
        self.expires = expires
        self.tenants = tenants
        self.durable = durable
        self.verdicts: Verdicts | None = None
        self.error: BaseException | None = None
        #: The batch failed as a whole: the caller sends its call again, alone.
        self.alone = False
        #: (threads) this caller is to send the calls queued behind the last round trip.
        self.lead = False
        self.done: Any = None


def _merge(batch: Sequence[_Call]) -> tuple[list[NewJob], Expiries, Tenants]:
    """One enqueue of a batch's calls: their jobs, and their expiries and tenants (None for
    a call that gives none) when a call gives some; so the arguments sent are enqueue_plan's
    for the same jobs sent in one call."""
    jobs = [job for c in batch for job in c.jobs]
    expires: Expiries = None
    if any(c.expires is not None for c in batch):
        expires = [e for c in batch for e in (c.expires or [None] * len(c.jobs))]
    tenants: Tenants = None
    if any(c.tenants is not None for c in batch):
        tenants = [t for c in batch for t in (c.tenants or [None] * len(c.jobs))]
    return jobs, expires, tenants


def _by_setting(batch: Sequence[_Call]) -> list[list[_Call]]:
    """The calls of a batch by durable setting (one write, one wait each), in order."""
    groups: dict[Durable | None, list[_Call]] = {}
    for c in batch:
        groups.setdefault(c.durable, []).append(c)
    return list(groups.values())


def _share(batch: Sequence[_Call], verdicts: Verdicts | None,
           error: BaseException | None) -> None:
    """Each call's part of a batch's answer: its verdicts, its own NotDurable, or (the batch
    failed as a whole) the error itself for a call sent alone, else a send of its own."""
    if error is not None and len(batch) == 1:
        batch[0].error = error      # a call sent alone: its own error, as it was raised
        return
    if isinstance(error, NotDurable) and isinstance(error.reply, list):
        verdicts, start = error.reply, 0
        for c in batch:
            own = verdicts[start:start + len(c.jobs)]
            start += len(c.jobs)
            held = [j.id for j, v in zip(c.jobs, own)
                    if v in (EnqueueVerdict.ENQUEUED, EnqueueVerdict.DUPLICATE)]
            exc = NotDurable(held, error.confirmed, error.wanted, "the enqueue",
                             c.durable is not None and c.durable.aof)
            exc.reply = own
            c.error = exc
        return
    if error is not None:
        for c in batch:
            c.alone = True
        return
    assert verdicts is not None
    start = 0
    for c in batch:
        c.verdicts = verdicts[start:start + len(c.jobs)]
        start += len(c.jobs)


def _answer(call: _Call) -> Verdicts:
    if call.error is not None:
        raise call.error
    assert call.verdicts is not None
    return call.verdicts


class Batcher:
    """Auto-pipelining of one queue's enqueues for the threads that share its client.

    ``send(jobs, expires_ms, durable)`` is the queue's own enqueue (hot.enqueue_plan run on
    its client): a batch is one call of it."""

    def __init__(self, send: Callable[[Sequence[NewJob], Expiries, Tenants, Durable | None],
                                      Verdicts]) -> None:
        self._send = send
        self._reset()
        _batchers.add(self)

    def _reset(self) -> None:
        """Nothing in flight (and, in a forked child, no lock held by a thread that is not
        there: a batch in flight in another thread at the fork would hold every call)."""
        self._lock = threading.Lock()
        self._queued: list[_Call] = []
        self._busy = False

    def enqueue(self, jobs: Sequence[NewJob], expires: Expiries, tenants: Tenants,
                durable: Durable | None) -> Verdicts:
        call = _Call(jobs, expires, tenants, durable)
        with self._lock:
            lead = not self._busy
            if lead:
                self._busy = True
            else:
                call.done = threading.Event()
                self._queued.append(call)
        if not lead:
            call.done.wait()
            if not call.lead:
                return self._own(call)
            with self._lock:
                batch, self._queued = self._queued, []
        else:
            batch = [call]
        try:
            self._flush(batch)
        finally:
            for c in batch:     # an interrupted flush: whoever was not answered sends alone
                if c.verdicts is None and c.error is None:
                    c.alone = True
                if c is not call:
                    c.done.set()
            self._hand_over()
        return self._own(call)

    def _own(self, call: _Call) -> Verdicts:
        if call.alone:
            return self._send(call.jobs, call.expires, call.tenants, call.durable)
        return _answer(call)

    def _flush(self, batch: Sequence[_Call]) -> None:
        for group in _by_setting(batch):
            jobs, expires, tenants = _merge(group)
            try:
                verdicts = self._send(jobs, expires, tenants, group[0].durable)
            except Exception as exc:
                _share(group, None, exc)
            else:
                _share(group, verdicts, None)

    def _hand_over(self) -> None:
        """The oldest queued caller leads the next round trip; none queued: nothing in flight."""
        with self._lock:
            if not self._queued:
                self._busy = False
                return
            nxt = self._queued[0]
        nxt.lead = True
        nxt.done.set()


_batchers: weakref.WeakSet[Batcher] = weakref.WeakSet()


def _reset_in_child() -> None:
    for b in list(_batchers):
        b._reset()


os.register_at_fork(after_in_child=_reset_in_child)


class AsyncBatcher:
    """Auto-pipelining of one async queue's enqueues: the calls of one turn of its event
    loop, and those made while a batch is in flight, go out together."""

    def __init__(self, send: Callable[[Sequence[NewJob], Expiries, Tenants, Durable | None],
                                      Awaitable[Verdicts]]) -> None:
        self._send = send
        self._queued: list[_Call] = []
        self._flusher: asyncio.Task[None] | None = None

    async def enqueue(self, jobs: Sequence[NewJob], expires: Expiries, tenants: Tenants,
                      durable: Durable | None) -> Verdicts:
        call = _Call(jobs, expires, tenants, durable)
        call.done = asyncio.get_running_loop().create_future()
        self._queued.append(call)
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_all())
        # A cancelled caller leaves its call behind: not sent if its batch has not gone yet
        await call.done
        if call.alone:
            return await self._send(call.jobs, call.expires, call.tenants, call.durable)
        return _answer(call)

    async def _flush_all(self) -> None:
        try:
            while self._queued:
                batch = [c for c in self._queued if not c.done.cancelled()]
                self._queued = []
                try:
                    for group in _by_setting(batch):
                        jobs, expires, tenants = _merge(group)
                        try:
                            verdicts = await self._send(jobs, expires, tenants,
                                                        group[0].durable)
                        except Exception as exc:
                            _share(group, None, exc)
                        else:
                            _share(group, verdicts, None)
                finally:
                    for c in batch:
                        if c.verdicts is None and c.error is None:
                            c.alone = True
                        if not c.done.done():
                            c.done.set_result(None)
        finally:
            self._flusher = None
            for c in self._queued:      # the flusher itself was cancelled (the loop closing)
                c.alone = True
                if not c.done.done():
                    c.done.set_result(None)
            self._queued = []
