"""The hot verbs: what producers and workers call per job (enqueue, claim, ack, retry,
release, extend), what a master calls per tick (reap, promote), and the wake list's park."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from redis.exceptions import ResponseError

from ..errors import InvalidArgument, InvalidJobId
from ..validate import MAX_COUNT, integer, optional_seconds, seconds
from ..verdicts import (
    AbortAsk,
    AbortedVerdict,
    AckVerdict,
    EnqueueVerdict,
    ExtendVerdict,
    ReleaseVerdict,
    RetryVerdict,
)
from . import beats
from .autopipe import BATCHABLE
from .beats import Beat
from .core import QueueCore, corrupt_plan
from .durable import Durable
from .keys import (
    WAKE_DUE,
    WAKE_WORK,
    QueueKeys,
    Unique,
    check_group,
    check_job_id,
    check_tenant,
    check_unique,
)
from .plan import Hot, Steps, blpop
from .replies import Acked, Lease, NewJob, Reaped
from .waits import check, waited
from .wire import UNREAD, Owed

#: The most jobs one enqueue script call admits. At 9 arguments a job it stays far under the
#: 1,048,576 arguments Redis 6.2 takes in one command (a bigger batch is refused with a
#: protocol error and a closed connection), and its run (some 7 us a job) far under the 5 s
#: after which a running script makes every other client of the server wait (BUSY).
ENQUEUE_CHUNK = 10_000


def _nonce() -> str:
    return os.urandom(8).hex()


def _sendable(text: str) -> str:
    """An error text the client can encode: a lone surrogate (an exception message may hold
    one) has no UTF-8 form, and would fail the write of the failure it describes; it is
    escaped (``\\ud800``). Clients encode with ``surrogateescape``, so what came from the
    server as undecodable bytes goes back as those bytes."""
    try:
        text.encode("utf-8", "surrogateescape")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


class HotPath(QueueCore):
    """The verbs of a job's life and a master's tick (sent through ``self.hot``)."""

    # -- producer ---------------------------------------------------------------------
    def enqueue_many(self, jobs: Sequence[NewJob],
                     expires_ms: Sequence[int | None] | None = None,
                     tenants: Sequence[str | None] | None = None,
                     durable: Durable | None = None,
                     uniques: Sequence[Unique | None] | None = None,
                     holders: list[str | None] | None = None) -> list[EnqueueVerdict]:
        """Admit jobs, one round trip per ENQUEUE_CHUNK of them (enqueue_plan); with
        ``durable``, the last one carries the wait (NotDurable: too few replicas);
        ``uniques``: per job its unique key (``holders`` gets the id holding a key that was
        taken).

        With auto-pipelining (``self.batcher``, store/autopipe.py), a call of a few jobs
        made while another thread's is in flight goes out with it in the next round trip;
        its verdicts and errors are its own. A call with unique keys goes alone."""
        if self.batcher is not None and len(jobs) <= BATCHABLE and uniques is None:
            check_jobs(jobs, expires_ms, tenants)   # a call's own bad id fails it alone
            return self.batcher.enqueue(jobs, expires_ms, tenants, durable)
        return self.enqueue_now(jobs, expires_ms, tenants, durable, uniques, holders)

    def enqueue_now(self, jobs: Sequence[NewJob],
                    expires_ms: Sequence[int | None] | None = None,
                    tenants: Sequence[str | None] | None = None,
                    durable: Durable | None = None,
                    uniques: Sequence[Unique | None] | None = None,
                    holders: list[str | None] | None = None) -> list[EnqueueVerdict]:
        """enqueue_many in a round trip of its own (a batch of the batcher's).

        A call of one chunk without a wait or unique keys is enqueue_plan's one step sent
        directly: the same arguments, verdicts and errors, without the plan's generator and
        runner (a tenth of a producer's own time per call)."""
        if durable is not None or len(jobs) > ENQUEUE_CHUNK or uniques is not None:
            return self.run(enqueue_plan(self.keys, jobs, expires_ms, tenants, durable,
                                         uniques, holders))
        check_jobs(jobs, expires_ms, tenants)
        try:
            replies = self.hot.call("enqueue", self._k,
                                    enqueue_args(jobs, expires_ms, tenants))
        except ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            raise self.corrupt([j.group for j in jobs], "nothing was enqueued") from None
        return enqueue_verdicts(replies)

    # -- consumer ---------------------------------------------------------------------
    def claim(self, n: int = 1) -> list[Lease]:
        """Lease up to n jobs, one per turn of the ring; [] when nothing is serviceable."""
        n = integer(n, "the number of jobs to claim")
        return [Lease.from_reply(r) for r in self.hot.call("claim", self._k, [n, _nonce()])]

    def ack(self, lease: Lease, result: str = "null", claim_next: bool = False,
            durable: Durable | None = None, span: str | None = None) -> Acked:
        """Complete a job (fenced); with claim_next, lease the next job in the same call.

        Returns Acked(verdict, next): verdict DONE (also to this holder's ack sent again
        after its reply was lost: nothing more is written), or STALE when this holder's
        lease is no longer current (nothing of it was written). With ``durable`` (default: the
        queue's ``durable``), the ack and the result it stores are followed by the wait in
        the same round trip; too few replicas is NotDurable, whose ``reply`` is the Acked
        (the ack is made on the primary, a next lease is in it). ``span``: the run's span (a
        traceparent), kept on the workflow steps the ack releases, their runs' parent (sent
        only when given; a server's module of a release before takes five: the ack is made
        without it).
        """
        args = [lease.id, lease.attempts, lease.nonce, result, _nonce() if claim_next else ""]
        durable = self.durable if durable is None else durable
        if not span:
            return self._ack(lease, args, durable)
        try:
            return self._ack(lease, [*args, _sendable(span)], durable)
        except ResponseError as exc:
            if "wrong number of arguments" not in str(exc):
                raise
        # A server whose module predates the span (workers upgraded before the servers)
        # refuses a sixth argument before it writes anything: the ack, without it
        return self._ack(lease, args, durable)

    def ack_claim(self, done: Sequence[tuple[Lease, str, str | None]], n: int
                  ) -> tuple[list[AckVerdict | ResponseError], list[Lease]]:
        """Acknowledge finished jobs (each fenced, as ``ack``: (lease, result JSON, span))
        and lease up to n more (``claim``: each its own turn of the ring, its own lease and
        fence), in one round trip: a worker child's batch of short jobs. Per ack its
        verdict, or the error the server answered it with (the other acks and the claim
        are made all the same: the caller settles that one alone); then the leases (an
        error of the claim is raised). A queue with ``durable`` acks each with its wait,
        then claims (no batch: the wait is per write)."""
        n = integer(n, "the number of jobs to claim", low=0)
        if self.durable is not None or not done:
            verdicts: list[AckVerdict | ResponseError] = [
                self.ack(lease, result, span=span).verdict for lease, result, span in done]
            return verdicts, self.claim(n) if n > 0 else []
        calls: list[tuple[str, Sequence[str], Sequence[Any]]] = [
            ("ack", self._k, [lease.id, lease.attempts, lease.nonce, result, "",
                              *((_sendable(span),) if span else ())])
            for lease, result, span in done]
        if n > 0:
            calls.append(("claim", self._k, [n, _nonce()]))
        replies = self.hot.call_many(calls)
        verdicts = []
        for (lease, result, span), reply in zip(done, replies, strict=False):
            if isinstance(reply, ResponseError) and span \
                    and "wrong number of arguments" in str(reply):
                verdicts.append(self.ack(lease, result).verdict)   # a module without spans
            elif isinstance(reply, ResponseError):
                verdicts.append(reply)
            elif isinstance(reply, Exception):
                raise reply   # the connection: the caller rides it out and sends again
            else:
                verdicts.append(AckVerdict(reply[0]))
        leases: list[Lease] = []
        if n > 0:
            got = replies[-1]
            if isinstance(got, Exception):
                raise got
            leases = [Lease.from_reply(r) for r in got]
        return verdicts, leases

    @property
    def can_post(self) -> bool:
        """Whether acks can be posted (``post_ack``): a queue without ``durable`` on a
        single-connection client the wire serves (a worker child's)."""
        return self.durable is None and self.hot.postable

    def post_ack(self, lease: Lease, result: str = "null", span: str | None = None
                 ) -> Owed | None:
        """``ack`` written now, its reply read later, before the reply of this client's
        next call (``collect_posted``): a worker child's ack of a job as it finishes,
        without a round trip of its own. Its Owed (``posted_verdict``), or None when it
        cannot be posted (``can_post`` False, or the ack's path not known yet): ``ack`` it."""
        if self.durable is not None:
            return None
        return self.hot.post("ack", self._k, [
            lease.id, lease.attempts, lease.nonce, result, "",
            *((_sendable(span),) if span else ())])

    def collect_posted(self) -> None:
        """Read the replies of the posted acks (each into its Owed)."""
        self.hot.collect()

    def poll_posted(self) -> None:
        """Read the replies of the posted acks that have arrived, waiting for none (a
        connection the server closed is found now: those acks lost)."""
        self.hot.poll()

    def posted_verdict(self, owed: Owed) -> AckVerdict | None:
        """A posted ack's verdict; None when it is to be sent again with ``ack`` (fenced:
        this holder's ack sent twice is answered DONE): its reply was an error, or was lost
        with its connection (every error is then the ``ack``'s own: a missing script,
        function or module and a module without spans are coped with there)."""
        reply = owed.reply
        if reply is UNREAD or isinstance(reply, Exception):
            return None
        return AckVerdict(reply[0])

    def _ack(self, lease: Lease, args: list[Any], durable: Durable | None) -> Acked:
        if durable is None:
            verdict, nxt = self.hot.call("ack", self._k, args)
            return Acked(AckVerdict(verdict), Lease.from_reply(nxt) if nxt else None)
        (verdict, nxt), confirmed = self.run(waited(
            Hot("ack", self._k, args), durable, self.keys.ring))
        acked = Acked(AckVerdict(verdict), Lease.from_reply(nxt) if nxt else None)
        if acked.verdict == AckVerdict.DONE:
            check(durable, confirmed, [lease.id], "the ack", acked)
        return acked

    def retry(self, lease: Lease, error: str, delay: float | None = None,
              final: bool = False, link: str | None = None) -> RetryVerdict:
        """Fail a job (fenced): RETRIED into delayed, DEAD, or STALE (nothing written).
        ``link``: the failed attempt's span (a traceparent), kept on the row for the next
        attempt's span to link to (sent only when given; a server's module of a release
        before takes six: the failure is written without it)."""
        delay = optional_seconds(delay, "a retry delay")
        delay_arg = "" if delay is None else int(delay * 1000)
        args = [lease.id, lease.attempts, lease.nonce, _sendable(error), delay_arg,
                "1" if final else "0"]
        if not link:
            return RetryVerdict(self.hot.call("retry", self._k, args))
        try:
            return RetryVerdict(self.hot.call("retry", self._k, [*args, _sendable(link)]))
        except ResponseError as exc:
            if "wrong number of arguments" not in str(exc):
                raise
        # A server whose module predates the link (workers upgraded before the servers)
        # refuses a seventh argument before it writes anything: the failure, without it
        return RetryVerdict(self.hot.call("retry", self._k, args))

    def abort_ask(self, job_id: str) -> AbortAsk:
        """Ask the master running a job to stop it (lua/abort.lua 'ask'): ASKED (the row
        records the running attempt's nonce; every master of the queue is told, through its
        abort list), NOT_RUNNING (cancel it), FINISHED or MISSING."""
        return AbortAsk(self.hot.call("abort", self._k, ["ask", check_job_id(job_id)]))

    def abort_end(self, lease: Lease, error: str) -> AbortedVerdict:
        """End a stopped attempt (fenced) in state ``aborted``: ABORTED, or STALE."""
        return AbortedVerdict(self.hot.call("abort", self._k, [
            "end", lease.id, lease.attempts, lease.nonce, _sendable(error)]))

    @staticmethod
    def take_aborts(queues: Sequence[HotPath], worker_id: str,
                    timeout: float) -> tuple[int, str, str] | None:
        """Block up to ``timeout`` s on this master's abort lists of ``queues`` (one server:
        one BLPOP); the first token taken as (index in ``queues``, job id, nonce), or None."""
        keys = [q.keys.aborts(worker_id) for q in queues]
        got = queues[0].client.blpop(keys, timeout=max(timeout, 0.01))
        if not got:
            return None
        key, token = (v.decode() if isinstance(v, bytes) else str(v) for v in got)
        job_id, _, nonce = token.partition(" ")
        return keys.index(key), job_id, nonce

    def release(self, lease: Lease, reason: str = "released by a stopping worker",
                backoff: float = 0.0) -> ReleaseVerdict:
        """Hand a job back unrun (fenced), attempt rolled back: RELEASED, or STALE. With
        ``backoff`` seconds, its whole group sits out that long (RateLimited). An attempt
        whose abort was asked (``abort_ask``) is not handed back: it ends ``aborted`` as
        ``abort_end`` ends it (also answered RELEASED: the holder is rid of it either way)."""
        off = int(seconds(backoff, "a back-off") * 1000)
        return ReleaseVerdict(self.hot.call("release", self._k, [
            lease.id, lease.attempts, lease.nonce, _sendable(reason), off]))

    def extend(self, leases: Iterable[Lease],
               lease_ms: int | None = None) -> list[ExtendVerdict]:
        """Push lease deadlines out to now + lease (each job's own by default); fenced:
        per lease EXTENDED, or STALE."""
        leases = list(leases)
        if lease_ms is not None:
            lease_ms = integer(lease_ms, "lease_ms", 1, MAX_COUNT)
        by_len: dict[int, list[Lease]] = {}
        for lease in leases:
            by_len.setdefault(lease_ms or lease.lease_ms, []).append(lease)
        verdicts: dict[str, ExtendVerdict] = {}
        for ms, group in by_len.items():
            args: list[Any] = [ms]
            for lease in group:
                args.extend((lease.id, lease.attempts, lease.nonce))
            for lease, v in zip(group, self.hot.call("extend", self._k, args)):
                verdicts[lease.id] = ExtendVerdict(v)
        return [verdicts[lease.id] for lease in leases]

    # -- a master's tick ----------------------------------------------------------------
    def reap(self, limit: int = 1000) -> tuple[int, int]:
        """Expired leases back to their lanes (or dead, or aborted when an abort was asked of
        the attempt): returns (returned, dead), an aborted one counted in dead."""
        reaped = self.reap_tick(limit)
        return reaped.returned, reaped.dead

    def reap_tick(self, limit: int = 1000, beat: Beat | None = None,
                  beat_ttl_ms: int = 0) -> Reaped:
        """reap(), and the clock it read (the master's tick). With a ``beat``, the master's
        heartbeat (store/beats.py) rides in the same round trip."""
        if beat is None:
            reply = self.hot.call("reap", self._k, [limit])
        else:
            reply = self.hot.call_piped(
                "reap", self._k, [limit],
                lambda pipe: beats.write(pipe, self.keys, beat, beat_ttl_ms))
        return Reaped(*map(int, reply))

    def promote(self, limit: int = 1000) -> tuple[int, float | None]:
        """Due delayed jobs into their lanes: (moved, seconds until the next is due or None)."""
        moved, due_in, _ = self.promote_and_look(limit)
        return moved, due_in

    def promote_and_look(self, limit: int = 1000) -> tuple[int, float | None, bool]:
        """promote(), and whether a claim would now find work (ring not empty, not paused)."""
        moved, next_due, claimable = self.hot.call("promote", self._k, [limit])
        return (int(moved), (None if int(next_due) < 0 else int(next_due) / 1000),
                int(claimable) == 1)

    # -- the wake list ------------------------------------------------------------------
    def park(self, timeout: float, bound: float | None = None) -> str | None:
        """Block on the wake key for up to timeout seconds.

        Returns None on timeout, WAKE_WORK when work became claimable, WAKE_DUE when
        `delayed` got a new earliest entry (re-read when to promote). With ``bound``, a pop
        still unanswered after that many seconds of this host's clock raises TimeoutError
        (see core.blpop: a server clock stepped back).
        """
        timeout = seconds(timeout, "a park timeout", high=MAX_COUNT)
        reply = blpop(self.client, [self.keys.wake], timeout, bound)
        return None if reply is None else reply[1]

    @staticmethod
    def park_many(queues: Sequence[HotPath], timeout: float,
                  bound: float | None = None) -> tuple[int, str] | None:
        """park() on the wake keys of several queues of one server (one BLPOP): (index of
        the queue whose token came, the token), or None on timeout."""
        if len(queues) == 1:
            token = queues[0].park(timeout, bound)
            return None if token is None else (0, token)
        keys = [q.keys.wake for q in queues]
        reply = blpop(queues[0].client, keys, timeout, bound)
        return None if reply is None else (keys.index(reply[0]), reply[1])

    def push_wake(self, token: str = WAKE_WORK) -> None:
        """Hand a token on: WAKE_WORK (work is claimable) or WAKE_DUE (re-read when to
        promote). Through the wake verb, so the list is bounded by the one rule every verb
        pushes by (lua/lib/wake.lua wake: a WAKE_DUE token only under half the cap)."""
        if token not in (WAKE_WORK, WAKE_DUE):
            raise InvalidArgument(f"a wake token is {WAKE_WORK!r} or {WAKE_DUE!r}, "
                                  f"not {token!r}")
        self.scripts.wake(self._k, [token])


def check_jobs(jobs: Sequence[NewJob], expires_ms: Sequence[int | None] | None,
               tenants: Sequence[str | None] | None = None,
               uniques: Sequence[Unique | None] | None = None) -> None:
    """An enqueue's gate, before anything is sent: InvalidArgument, InvalidJobId,
    InvalidGroup (a bad group or tenant name), a bad unique key."""
    if expires_ms is not None and len(expires_ms) != len(jobs):
        raise InvalidArgument("one expiry per job (None for none)")
    if tenants is not None and len(tenants) != len(jobs):
        raise InvalidArgument("one tenant per job (None for none)")
    if uniques is not None and len(uniques) != len(jobs):
        raise InvalidArgument("one unique key per job (None for none)")
    for job in jobs:
        check_job_id(job.id)
        check_group(job.group)
    for tenant in tenants or ():
        if tenant is not None:
            check_tenant(tenant)
    for unique in uniques or ():
        if unique is not None:
            check_unique(*unique)


def enqueue_args(chunk: Sequence[NewJob], expires_ms: Sequence[int | None] | None,
                 tenants: Sequence[str | None] | None = None,
                 uniques: Sequence[Unique | None] | None = None) -> list[Any]:
    """The enqueue verb's ARGV for one chunk: n, the fields of each job, then the expiries
    only when one of them has one or a later section is sent ('' for none), then the
    tenants when a job names one or has a unique key, then the unique keys when a job has
    one (so an older server's scripts or module take the rest)."""
    args: list[Any] = [len(chunk)]
    for job in chunk:
        args.extend(job)
    keyed = uniques is not None and any(u is not None for u in uniques)
    named = keyed or (tenants is not None and any(t is not None for t in tenants))
    if named or (expires_ms is not None and any(e is not None for e in expires_ms)):
        args.extend("" if e is None else int(e)
                    for e in (expires_ms if expires_ms is not None else [None] * len(chunk)))
    if named:
        args.extend("" if t is None else t
                    for t in (tenants if tenants is not None else [None] * len(chunk)))
    if keyed:
        assert uniques is not None
        args.extend("" if u is None else u.wire() for u in uniques)
    return args


def enqueue_verdicts(replies: Sequence[Any],
                     holders: list[str | None] | None = None) -> list[EnqueueVerdict]:
    """Per job its verdict; a string is the holder of the job's unique key (DUPLICATE,
    nothing written), which ``holders`` gets (None for the others)."""
    verdicts: list[EnqueueVerdict] = []
    for v in replies:
        taken = isinstance(v, (bytes, str))
        verdicts.append(EnqueueVerdict.DUPLICATE if taken else EnqueueVerdict(v))
        if holders is not None:
            holders.append((v.decode() if isinstance(v, bytes) else v) if taken else None)
    if EnqueueVerdict.BAD_ID in verdicts:  # pragma: no cover - the client gate runs first
        raise InvalidJobId("the server refused a malformed job id")
    return verdicts


def enqueue_plan(keys: QueueKeys, jobs: Sequence[NewJob],
                 expires_ms: Sequence[int | None] | None = None,
                 tenants: Sequence[str | None] | None = None,
                 durable: Durable | None = None,
                 uniques: Sequence[Unique | None] | None = None,
                 holders: list[str | None] | None = None) -> Steps[list[EnqueueVerdict]]:
    """Admit jobs, one round trip per ENQUEUE_CHUNK of them; per job ENQUEUED or
    DUPLICATE (bad ids raise before anything is sent). A batch bigger than a chunk is
    not admitted atomically, but every job is idempotent by its id: a batch cut short
    by an error can be sent again (what was admitted answers DUPLICATE).

    ``expires_ms``: per job, ms from now after which it is never started (None: never;
    validate.expires_ms makes them). A call whose jobs have none sends none: the
    arguments are the previous release's, so an older server's scripts or module take it.

    ``tenants``: per job, its group's tenant (None: the group is its own); sent, after the
    expiries, only when a job of the call names one. A job whose group is another tenant's
    and busy answers TENANT (nothing written).

    ``uniques``: per job, (unique key, ms it holds at most) or None; sent, after the tenants,
    only when a job of the call names one. A job whose key a job not yet finished holds is
    not written: DUPLICATE, and the holder's id is appended to ``holders`` (given: one
    entry a job, None for the others).

    ``durable``: the last chunk is pipelined with the wait (one wait for the batch: the
    replication offset it waits for covers every chunk before it); NotDurable names the
    jobs the primary holds (enqueued or duplicate) when too few replicas confirmed."""
    check_jobs(jobs, expires_ms, tenants, uniques)
    verdicts: list[EnqueueVerdict] = []
    for start in range(0, len(jobs), ENQUEUE_CHUNK):
        chunk = jobs[start:start + ENQUEUE_CHUNK]
        tail = expires_ms[start:start + ENQUEUE_CHUNK] if expires_ms is not None else None
        named = tenants[start:start + ENQUEUE_CHUNK] if tenants is not None else None
        keyed = uniques[start:start + ENQUEUE_CHUNK] if uniques is not None else None
        op = Hot("enqueue", keys.fixed, enqueue_args(chunk, tail, named, keyed))
        last = start + ENQUEUE_CHUNK >= len(jobs)
        try:
            if durable is not None and last:
                replies, confirmed = yield from waited(op, durable, keys.ring)
            else:
                replies = yield op
        except ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            raise (yield from corrupt_plan(keys, [j.group for j in chunk],
                                           "nothing was enqueued")) from None
        verdicts += enqueue_verdicts(replies, holders)
    if durable is not None and jobs:
        held = [j.id for j, v in zip(jobs, verdicts)
                if v in (EnqueueVerdict.ENQUEUED, EnqueueVerdict.DUPLICATE)]
        check(durable, confirmed, held, "the enqueue", verdicts)
    return verdicts
