"""The verbs of one queue, one method per Lua script: what producers, workers and admins call."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

from redis import ConnectionPool
from redis.exceptions import ReadOnlyError, ResponseError

from .. import clock
from ..errors import CorruptKey, InvalidArgument, InvalidJobId, ScriptError
from ..observe import heartbeat, history, lanes
from ..observe.heartbeat import Beat
from ..observe.lanes import parse_rate
from ..validate import MAX_COUNT, integer, optional_seconds, seconds
from ..verdicts import (
    AckVerdict,
    CancelVerdict,
    EnqueueVerdict,
    ExtendVerdict,
    FireVerdict,
    ReleaseVerdict,
    RetryVerdict,
)
from .cluster import node_kwargs, scan_keys
from .connection import MAX_BLOCK, PoolBusy, pool_wait
from .keys import WAKE_DUE, WAKE_WORK, QueueKeys, check_group, check_job_id
from .scripts import VERB_KEYS, Scripts
from .selection import HotVerbs

#: The fairness modes: one claim per turn of the ring, or a share of the worker time.
FAIRNESS_MODES = ("turns", "time")
#: The most jobs one enqueue script call admits. At 9 arguments a job it stays far under the
#: 1,048,576 arguments Redis 6.2 takes in one command (a bigger batch is refused with a
#: protocol error and a closed connection), and its run (some 7 us a job) far under the 5 s
#: after which a running script makes every other client of the server wait (BUSY).
ENQUEUE_CHUNK = 10_000


class NewJob(NamedTuple):
    """One job to enqueue, in the units the scripts take (ms, seconds for ttl)."""

    id: str
    task: str
    payload: str
    group: str
    max_attempts: int
    lease_ms: int
    delay_ms: int
    ttl: int
    countdown_ms: int = 0
    priority: int = 0     # -100..100, lower first within the lane


class Outcome(NamedTuple):
    """What Queue.wait_outcome saw of a job: its state (None once its row is gone; "unseen"
    when no connection was free to ask), its result JSON and error, and whether it ended
    (done, dead, cancelled, skipped or gone) or the deadline came first."""

    state: str | None
    result: str | None
    error: str | None
    ended: bool


#: The states a job ends in (a row that is gone counts too).
ENDED = ("done", "dead", "cancelled", "skipped")


class Acked(NamedTuple):
    """What ack answers: the verdict (DONE, or STALE: nothing was written) and, with
    claim_next, the next lease (None when none was asked or none is serviceable)."""

    verdict: AckVerdict
    next: Lease | None


class Reaped(NamedTuple):
    """What a reap did, and the clock it read: the server's time (ms) and the queue's clock
    mark before it (the latest server time a reap saw; 0 for none). A mark ahead of the
    server's time is a clock stepped back (clock.py)."""

    returned: int
    dead: int
    server_ms: int
    seen_ms: int


class Lease(NamedTuple):
    """A claimed job. ``attempts`` and ``nonce`` together are the fencing token; ``fence``
    grows with every claim of the row and never goes back (for guarding external writes)."""

    id: str
    task: str
    payload: str
    attempts: int
    nonce: str
    group: str
    lease_ms: int
    more: bool = False    # other work was serviceable when this job was claimed
    fence: int = 0        # the row's claim counter after this claim

    @classmethod
    def from_reply(cls, row: Sequence[Any]) -> Lease:
        # a row without a task name or payload (written by hand) is leased as "", so the
        # runner dead-letters it with the reason (and logs it) like any job that cannot run
        return cls(row[0], row[1] or "", row[2] or "", int(row[3]), row[4], row[5], int(row[6]),
                   bool(row[7]), int(row[8]) if len(row) > 8 else 0)


class LaneHead(NamedTuple):
    """One group's row of the lanes verb (lua/lanes.lua): its pending count, its head's lane
    score (None for an empty lane: split it with lanes.split_score) and its busy ms over the
    last minute."""

    pending: int
    head_score: float | None
    busy_ms: int

    @classmethod
    def from_replies(cls, flat: Sequence[Any]) -> list[LaneHead]:
        """The lanes verb answers three values a group, in the order the groups were sent."""
        return [cls(int(flat[i]), float(flat[i + 1]) if flat[i + 1] else None,
                    int(flat[i + 2])) for i in range(0, len(flat), 3)]


class FoundPage(NamedTuple):
    """One call of the find verb (lua/find.lua): the rank to go on from (negative once the
    set was searched to its end), how many entries it looked at, and the matching ids."""

    next_rank: int
    looked: int
    ids: list[str]

    @classmethod
    def from_reply(cls, reply: Sequence[Any]) -> FoundPage:
        return cls(int(reply[0]), int(reply[1]), list(reply[2:]))


class WorkflowSent(NamedTuple):
    """What the workflow verb answered: ``code`` 1 written, 0 an id exists already (``what``
    is the workflow's own id for a duplicate workflow, else the step's), 2 a lane is full
    (``what`` is the step's id), 3 the server refused an id."""

    code: int
    what: str


#: Groups per call of the lanes verb (lua/lanes.lua; about a millisecond of the server's time
#: per 200 groups).
LANES_CHUNK = 500


D = TypeVar("D")


def _block_seconds(timeout: float) -> float:
    """A BLPOP timeout that never means "for ever": Redis 6.2 truncates seconds x 1000 to
    whole ms, so 0.001 can become 0, which blocks indefinitely."""
    return max(timeout, 0.01)


def _blpop(client: Any, keys: Sequence[str], timeout: float,
           bound: float | None = None) -> Any:
    """BLPOP; a pop that the server broke off because it stopped being a primary (REPLICAOF,
    a failover: "UNBLOCKED ... master -> replica") raises ReadOnlyError, what the next write
    to that server gets: an outage the worker rides out, not an error of its own.

    With ``bound`` (seconds, on this host's clock) a pop not answered by then raises
    TimeoutError and its connection is closed: a server times a BLPOP by its wall clock,
    so one whose clock was stepped back holds every pop that much longer. Not on a cluster
    client (its connections are the nodes'): there the pop is not bounded."""
    block = _block_seconds(timeout)
    single = getattr(client, "connection", None)
    pool = getattr(client, "connection_pool", None)
    try:
        if bound is None or (single is None and not isinstance(pool, ConnectionPool)):
            return client.blpop(keys, timeout=block)
        conn: Any = single or pool.get_connection()   # type: ignore[union-attr]
        try:
            conn.send_command("BLPOP", *keys, block)
            return conn.read_response(timeout=bound)   # a timeout closes the connection
        finally:
            if single is None:
                pool.release(conn)   # type: ignore[union-attr]
    except ResponseError as exc:
        if str(exc).startswith("UNBLOCKED"):
            raise ReadOnlyError(str(exc)) from exc
        raise


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


def job_view(job_id: str, row: dict[str, str]) -> dict[str, Any]:
    """What Queue.job shows of a job's row (its hash, read whole)."""
    view: dict[str, Any] = {"id": job_id}
    for field in ("state", "task", "group", "error", "result"):
        view[field] = row.get(field)
    for field in ("attempts", "max", "created", "started", "finished"):
        # None too for a count or time that is not an integer (a row a claim buried)
        view[field] = _int_or(row.get(field), None)
    view["max_attempts"] = view.pop("max")
    view["corrupt"] = None    # a job key of the wrong type (dead_jobs): what it holds
    return view


class Queue:
    """One queue on one Redis client. Thread-compatible like the client it wraps."""

    def __init__(self, client: Any, name: str, native: str | None = None) -> None:
        self.client = client
        self.keys = QueueKeys(name)
        self.name = name
        self.scripts = Scripts(client)
        #: The hot verbs: the module's commands when the server has them (EMQ_NATIVE, or
        #: ``native`` = auto / off / require), else the scripts.
        self.hot = HotVerbs(client, self.scripts, native)
        self._k = self.keys.fixed

    # -- producer ---------------------------------------------------------------------
    def enqueue_many(self, jobs: Sequence[NewJob]) -> list[EnqueueVerdict]:
        """Admit jobs, one round trip per ENQUEUE_CHUNK of them; per job ENQUEUED or
        DUPLICATE (bad ids raise before anything is sent). A batch bigger than a chunk is
        not admitted atomically, but every job is idempotent by its id: a batch cut short
        by an error can be sent again (what was admitted answers DUPLICATE)."""
        for job in jobs:
            check_job_id(job.id)
            check_group(job.group)
        verdicts: list[EnqueueVerdict] = []
        for start in range(0, len(jobs), ENQUEUE_CHUNK):
            chunk = jobs[start:start + ENQUEUE_CHUNK]
            args: list[Any] = [len(chunk)]
            for job in chunk:
                args.extend(job)
            try:
                replies = self.hot.call("enqueue", self._k, args)
            except ResponseError as exc:
                if "WRONGTYPE" not in str(exc):
                    raise
                raise self.corrupt([j.group for j in chunk], "nothing was enqueued") from None
            verdicts += [EnqueueVerdict(v) for v in replies]
        if EnqueueVerdict.BAD_ID in verdicts:  # pragma: no cover - the client gate runs first
            raise InvalidJobId("the server refused a malformed job id")
        return verdicts

    def corrupt(self, groups: Iterable[str], outcome: str) -> CorruptKey:
        """The error for a verb refused by a key of the wrong type (or a book it cannot
        read), naming what the checker finds (emqtasks.check.diagnose)."""
        from ..ops.check import diagnose

        found = diagnose(self, groups)
        what = "; ".join(found) if found else "a key of the queue holds the wrong type"
        return CorruptKey(f"queue {self.name}: {outcome}: {what} (emqtasks check names every "
                          "such key, emqtasks check --repair mends what it can)", tuple(found))

    # -- consumer ---------------------------------------------------------------------
    def claim(self, n: int = 1) -> list[Lease]:
        """Lease up to n jobs, one per turn of the ring; [] when nothing is serviceable."""
        n = integer(n, "the number of jobs to claim")
        return [Lease.from_reply(r) for r in self.hot.call("claim", self._k, [n, _nonce()])]

    def ack(self, lease: Lease, result: str = "null",
            claim_next: bool = False) -> Acked:
        """Complete a job (fenced); with claim_next, lease the next job in the same call.

        Returns Acked(verdict, next): verdict DONE, or STALE when this holder's lease is no
        longer current (nothing of it was written).
        """
        verdict, nxt = self.hot.call(
            "ack", self._k, [lease.id, lease.attempts, lease.nonce, result,
                             _nonce() if claim_next else ""])
        return Acked(AckVerdict(verdict), Lease.from_reply(nxt) if nxt else None)

    def retry(self, lease: Lease, error: str, delay: float | None = None,
              final: bool = False) -> RetryVerdict:
        """Fail a job (fenced): RETRIED into delayed, DEAD, or STALE (nothing written)."""
        delay = optional_seconds(delay, "a retry delay")
        delay_arg = "" if delay is None else int(delay * 1000)
        return RetryVerdict(self.hot.call(
            "retry", self._k, [lease.id, lease.attempts, lease.nonce, _sendable(error),
                               delay_arg, "1" if final else "0"]))

    def release(self, lease: Lease, reason: str = "released by a stopping worker",
                backoff: float = 0.0) -> ReleaseVerdict:
        """Hand a job back unrun (fenced), attempt rolled back: RELEASED, or STALE. With
        ``backoff`` seconds, its whole group sits out that long (RateLimited)."""
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

    def reap(self, limit: int = 1000) -> tuple[int, int]:
        """Expired leases back to their lanes (or dead): returns (returned, dead)."""
        reaped = self.reap_tick(limit)
        return reaped.returned, reaped.dead

    def reap_tick(self, limit: int = 1000, beat: Beat | None = None,
                  beat_ttl_ms: int = 0) -> Reaped:
        """reap(), and the clock it read (the master's tick). With a ``beat``, the master's
        heartbeat (heartbeat.py) rides in the same round trip."""
        if beat is None:
            reply = self.hot.call("reap", self._k, [limit])
        else:
            reply = self.hot.call_piped(
                "reap", self._k, [limit],
                lambda pipe: heartbeat.write(pipe, self.keys.base, beat, beat_ttl_ms))
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

    def park(self, timeout: float, bound: float | None = None) -> str | None:
        """Block on the wake key for up to timeout seconds.

        Returns None on timeout, WAKE_WORK when work became claimable, WAKE_DUE when
        `delayed` got a new earliest entry (re-read when to promote). With ``bound``, a pop
        still unanswered after that many seconds of this host's clock raises TimeoutError
        (see _blpop: a server clock stepped back).
        """
        timeout = seconds(timeout, "a park timeout", high=MAX_COUNT)
        reply = _blpop(self.client, [self.keys.wake], timeout, bound)
        return None if reply is None else reply[1]

    @staticmethod
    def park_many(queues: Sequence[Queue], timeout: float,
                  bound: float | None = None) -> tuple[int, str] | None:
        """park() on the wake keys of several queues of one server (one BLPOP): (index of
        the queue whose token came, the token), or None on timeout."""
        if len(queues) == 1:
            token = queues[0].park(timeout, bound)
            return None if token is None else (0, token)
        keys = [q.keys.wake for q in queues]
        reply = _blpop(queues[0].client, keys, timeout, bound)
        return None if reply is None else (keys.index(reply[0]), reply[1])

    def push_wake(self, token: str = WAKE_WORK) -> None:
        """Hand a token on: WAKE_WORK (work is claimable) or WAKE_DUE (re-read when to
        promote). Through the wake verb, so the list is bounded by the one rule every verb
        pushes by (lua/lib/wake.lua wake: a WAKE_DUE token only under half the cap)."""
        if token not in (WAKE_WORK, WAKE_DUE):
            raise InvalidArgument(f"a wake token is {WAKE_WORK!r} or {WAKE_DUE!r}, "
                                  f"not {token!r}")
        self.scripts.wake(self._k, [token])

    # -- admin ------------------------------------------------------------------------
    def pause(self) -> None:
        self.scripts.pause(self._k, ["1"])

    def resume(self) -> None:
        self.scripts.pause(self._k, ["0"])

    def pause_group(self, group: str) -> bool:
        return bool(self.scripts.pause_group(self._k, [check_group(group), "1"]) == 1)

    def resume_group(self, group: str) -> bool:
        return bool(self.scripts.pause_group(self._k, [check_group(group), "0"]) == 1)

    def set_group_limit(self, group: str, limit: int | None) -> None:
        value = "" if limit is None else integer(limit, "a group limit", 1)
        self.scripts.limit(self._k, [check_group(group), value])

    def set_group_weight(self, group: str, weight: int | None) -> None:
        """None clears the group's own weight (it then has the default weight, else 1)."""
        value = "" if weight is None else integer(weight, "a group weight", 1)
        self.scripts.weight(self._k, [check_group(group), value])

    def set_group_rate(self, group: str, max_jobs: int | None, per: float = 1.0) -> None:
        """At most max_jobs starts of the group in any window of ``per`` seconds (a burst
        of max_jobs allowed); None clears the group's own rate."""
        self.scripts.rate(self._k, [check_group(group), *rate_args(max_jobs, per)])

    def set_group_max_size(self, group: str, max_size: int | None) -> None:
        """Cap the group's waiting jobs (enqueues into a full lane are refused); None clears."""
        value = "" if max_size is None else integer(max_size, "a lane cap (max_size)", 0)
        self.scripts.maxsize(self._k, [check_group(group), value])

    def set_group_defaults(self, **values: Any) -> tuple[int, int]:
        """Set defaults for every group without a setting of its own: limit, rate
        ((max_jobs, per) or "max_jobs:per_ms"), max_size, weight; a value of None clears that
        default. Lanes already waiting follow at once; returns (groups on the ring, groups
        held back by their rate)."""
        pairs: list[Any] = []
        for name, value in values.items():
            pairs += [name, default_arg(name, value)]
        groups = sorted(self.groups())
        ringed, waiting = self.scripts.defaults(self._k, [len(pairs) // 2, *pairs, *groups])
        return int(ringed), int(waiting)

    def group_defaults(self) -> dict[str, Any]:
        """The defaults for every group that are set (rate as (max_jobs, per seconds))."""
        raw = self.client.hgetall(self.keys.gdefaults)
        return {name: parse_rate(value) if name == "rate" else int(value)
                for name, value in raw.items() if name in lanes.DEFAULT_FIELDS}

    # -- workflows (canvas.py) ----------------------------------------------------------
    def send_workflow(self, workflow_id: str, ttl: int, meta: dict[str, str],
                      steps: Sequence[tuple[NewJob, str, dict[str, str]]]) -> WorkflowSent:
        """Write a workflow and its steps in one call (lua/workflow.lua): each step its job,
        its mode and its extra row fields. Ids are the caller's to gate."""
        args: list[Any] = [workflow_id, ttl, len(meta)]
        for k, v in meta.items():
            args += [k, v]
        args.append(len(steps))
        for job, mode, extra in steps:
            args += [*job, mode, len(extra)]
            for k, v in extra.items():
                args += [k, v]
        code, what = self.scripts.workflow(self._k, args)
        return WorkflowSent(int(code), what)

    def cancel_workflow(self, workflow_id: str) -> int:
        """Cancel every step of a workflow not yet started; how many (lua/wfcancel.lua)."""
        return int(self.scripts.wfcancel(self._k, [workflow_id]))

    def fail_workflow(self, workflow_id: str, step: str, orphan: str = "") -> bool:
        """Resolve a workflow as failed at ``step`` (cancelling ``orphan``, a step waiting for
        it); False when it had failed already (lua/wffail.lua)."""
        return int(self.scripts.wffail(self._k, [workflow_id, step, orphan])) == 1

    # -- the checker's repair (check.py) --------------------------------------------------
    def repair(self, groups: Sequence[str], rebuild: Sequence[str],
               bury: Sequence[tuple[str, str, str]], lost: Sequence[str]) -> tuple[int, int]:
        """Rebuild the derived structures of ``groups`` (deleting the ``rebuild`` keys, named
        after the base, first), bury (id, group, why) rows in dead, put back ``lost`` ids;
        returns (groups on the ring, jobs restored). lua/repair.lua."""
        flat = [x for triple in bury for x in triple]
        ringed, restored = self.scripts.repair(self._k, [
            len(groups), *groups, len(rebuild), *rebuild, len(bury), *flat, *lost])
        return int(ringed), int(restored)

    # -- the dashboard's search and bulk actions (dashboard/views.py) ---------------------
    def find(self, which: str, rank: int, chunk: int, most: int, task: str = "",
             group: str = "", text: str = "", bound: str = "") -> FoundPage:
        """One bounded look through ``which`` (dead, delayed, active, or lane: the lane of
        ``group``) from ``rank``, at ``chunk`` entries at most (lua/find.lua)."""
        return FoundPage.from_reply(self.scripts.find(self._k, [
            which, rank, chunk, most, task, group, text, bound]))

    def cancel_many(self, ids: Sequence[str], per_trip: int = 500) -> int:
        """cancel() each id, ``per_trip`` calls a round trip; how many were cancelled."""
        done = 0
        for i in range(0, len(ids), per_trip):
            pipe = self.client.pipeline(transaction=False)
            for job_id in ids[i:i + per_trip]:
                self.scripts.cancel(self._k, [job_id], client=pipe)
            done += sum(1 for r in pipe.execute() if int(r) == 1)   # CANCELLED's code
        return done

    # -- the lane table (lanetable.py) ----------------------------------------------------
    def lane_heads(self, groups: Sequence[str]) -> list[LaneHead]:
        """Each group's pending count, head and busy time, LANES_CHUNK groups a call."""
        heads: list[LaneHead] = []
        for i in range(0, len(groups), LANES_CHUNK):
            heads += LaneHead.from_replies(self.scripts.lanes(self._k,
                                                              groups[i:i + LANES_CHUNK]))
        return heads

    # -- periodic schedules (schedules.py, lua/schedule.lua) ------------------------------
    def _schedule(self, args: list[Any]) -> Any:
        keys = (*self._k, *(self.keys.base + k for k in VERB_KEYS["schedule"]))
        return self.scripts.schedule(keys, args)

    def schedule_put(self, name: str, spec_json: str, timing_key: str, origin: str) -> bool:
        """Store (or update) a schedule; True when something changed."""
        return bool(self._schedule(["put", name, spec_json, timing_key, origin]))

    def schedule_drop(self, name: str) -> bool:
        return bool(self._schedule(["drop", name]))

    def schedule_fire(self, name: str, slot: int, overlap: bool,
                      job: NewJob) -> tuple[FireVerdict, int, int]:
        """Enqueue one slot of a schedule, at most once per slot: (verdict, the server's
        time in ms, the latest slot handled)."""
        verdict, now, last = self._schedule(["fire", name, slot, "1" if overlap else "0",
                                             *job])
        return FireVerdict(int(verdict)), int(now), int(last)

    # -- history (history.py; the verbs count, lua/lib/history.lua) ---------------------
    def set_history(self, hours: int = history.DEFAULT_HOURS,
                    max_groups: int = history.DEFAULT_MAX_GROUPS) -> None:
        """Keep ``hours`` of per-minute history (0: count nothing), tracking at most
        ``max_groups`` groups a minute (the rest are counted together)."""
        hours = integer(hours, "history hours", 0, history.MAX_HOURS)
        max_groups = integer(max_groups, "max_groups", 0, MAX_COUNT)
        self.client.hset(self.keys.gdefaults, mapping={"history": hours,
                                                       "hgroups": max_groups})

    def history_settings(self) -> tuple[int, int]:
        """(retention hours, groups tracked a minute) as the verbs read them."""
        hours, cap = self.client.hmget(self.keys.gdefaults, "history", "hgroups")
        return (_int_or(hours, history.DEFAULT_HOURS),
                _int_or(cap, history.DEFAULT_MAX_GROUPS))

    def history(self, minutes: int = 60, end: int | None = None) -> dict[str, Any]:
        """The last ``minutes`` minutes of counters (history.summary), up to the unix minute
        ``end`` (default: the server's current minute)."""
        rows = history.read(self.client, self.keys.base, minutes, end)
        hours, cap = self.history_settings()
        return {"queue": self.name, "retention_hours": hours, "max_groups": cap,
                **history.summary(rows)}

    def set_fairness(self, mode: str) -> int:
        """"turns" (one claim per turn of the ring, the default) or "time" (each backlogged
        group gets a share of the worker time proportional to its weight); returns the
        groups moved to the new mode's ring (0 when the queue had that mode already)."""
        if mode not in FAIRNESS_MODES:
            raise InvalidArgument(f"a fairness mode is 'turns' or 'time', not {mode!r}")
        return int(self.scripts.fairness(self._k, [mode]))

    def fairness(self) -> str:
        """The queue's fairness mode: "turns" or "time"."""
        return "time" if self.client.get(self.keys.fairness) == "time" else "turns"

    def cancel(self, job_id: str) -> CancelVerdict:
        """CANCELLED, MISSING, ACTIVE (running jobs are not interrupted) or FINISHED."""
        code = int(self.scripts.cancel(self._k, [check_job_id(job_id)]))
        try:
            return CancelVerdict.from_reply(code)
        except KeyError:  # pragma: no cover
            raise ScriptError(f"cancel answered {code}") from None

    def requeue_dead(self, job_id: str | None = None) -> int:
        """Bring one dead job (or all of them) back with fresh attempts; returns the count."""
        if job_id is not None:
            return int(self.scripts.requeue(self._k, [check_job_id(job_id)]))
        # The dead jobs of now, in pages: a job that dies again while this runs waits for
        # the next requeue instead of looping here for ever.
        return self._requeue(self.client.zrange(self.keys.dead, 0, -1))

    def requeue_dead_ids(self, ids: Sequence[str]) -> int:
        """Bring these dead jobs back (ids not dead are passed over); returns the count."""
        for job_id in ids:
            check_job_id(job_id)
        return self._requeue(ids)

    def _requeue(self, ids: Sequence[str]) -> int:
        return sum(int(self.scripts.requeue(self._k, list(ids[i:i + 500])))
                   for i in range(0, len(ids), 500))

    def dead_jobs(self, limit: int = 100) -> list[dict[str, Any]]:
        """The most recent dead jobs, newest first, each a job() view (one round trip for
        the rows). A job key of the wrong type is listed too, its ``corrupt`` naming it."""
        limit = integer(limit, "limit", 0)
        ids = self.client.zrevrange(self.keys.dead, 0, max(limit, 1) - 1)
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self.keys.job(job_id))
        views = []
        for job_id, row in zip(ids, pipe.execute(raise_on_error=False)):
            if isinstance(row, Exception):
                views.append({**job_view(job_id, {}), "corrupt": self._not_a_hash(job_id, row)})
            elif row:
                views.append(job_view(job_id, row))
        return views

    def job(self, job_id: str) -> dict[str, Any] | None:
        """A read-only view of a job row, or None once it expired (or never was); a job key
        of the wrong type raises CorruptKey naming it."""
        key = self.keys.job(check_job_id(job_id))
        try:
            row = self.client.hgetall(key)
        except ResponseError as exc:
            raise self.unreadable_row(job_id, exc) from None
        return job_view(job_id, row) if row else None

    def unreadable_row(self, job_id: str, exc: ResponseError) -> CorruptKey:
        """The error for a job key that a read found of the wrong type (``exc``, its
        WRONGTYPE; any other error is raised as it is)."""
        return CorruptKey(f"queue {self.name}: job {job_id} cannot be read: "
                          f"{self._not_a_hash(job_id, exc)} (emqtasks check --repair moves "
                          "it to dead)", (self.keys.job(job_id),))

    def _not_a_hash(self, job_id: str, exc: Exception) -> str:
        """"<job key> holds a <type>, not a hash" for a read its WRONGTYPE refused (any other
        error is raised as it is)."""
        faults: list[str] = []
        lanes.readable(self.client, self.keys.job(job_id), exc, None, faults)
        return f"{faults[0]}, not a hash"

    def outcome(self, job_id: str, register: bool = False) -> tuple[str | None, str | None,
                                                                      str | None]:
        """(state, result JSON, error) of a job; with register, count the caller as a waiter
        so the verb that ends the job pushes a token on ``keys.done(job_id)``."""
        state, result, error = self.scripts.wait(self._k, [job_id, "1" if register else "0"])
        return state, result, error

    def wait_done(self, job_id: str, timeout: float) -> bool:
        """Block until the job's end is announced or timeout passes (one BLPOP)."""
        return _blpop(self.client, [self.keys.done(job_id)], timeout) is not None

    def wait_outcome(self, job_id: str, deadline: float | None,
                     chunk: float = MAX_BLOCK) -> Outcome:
        """Follow a job until it ends or ``deadline`` (time.monotonic(); None: for ever)
        passes: one BLPOP on its done key per ``chunk`` seconds at most. A caller that finds
        every connection of a threaded client busy waits for one within its deadline."""
        registered = False
        seen: str | None = "unseen"
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                with pool_wait(left):
                    seen, result, error = self.outcome(job_id, register=not registered)
                    registered = True
                    if seen is None or seen in ENDED:
                        return Outcome(seen, result, error, True)
                    wait = chunk if deadline is None else min(chunk,
                                                              deadline - time.monotonic())
                    if wait <= 0:
                        return Outcome(seen, None, None, False)
                    self.wait_done(job_id, wait)
            except PoolBusy:
                if deadline is not None and time.monotonic() >= deadline:
                    return Outcome(seen, None, None, False)

    def holds(self, lease: Lease) -> bool:
        """Whether this lease is still the current claim of its job (one HMGET, no verb):
        false once it expired and the job was claimed again, or finished."""
        state, attempts, nonce = self.client.hmget(self.keys.job(lease.id), "state",
                                                   "attempts", "nonce")
        return bool(state == "active" and attempts == str(lease.attempts)
                    and nonce == lease.nonce)

    def status(self, job_id: str) -> str | None:
        try:
            state: str | None = self.client.hget(self.keys.job(job_id), "state")
        except ResponseError as exc:
            raise self.unreadable_row(job_id, exc) from None
        return state

    def ping(self) -> bool:
        """One round trip to the server holding the queue (on a cluster, the node serving
        its slot), so the connection a first claim would need is open."""
        return bool(self.client.ping(**node_kwargs(self.client, self.keys.ring)))

    def scan(self, match: str) -> Iterator[str]:
        """Keys of this queue matching a pattern, by SCAN of the server that holds the queue
        (on a cluster, only the node serving its slot: see cluster.scan_keys)."""
        return scan_keys(self.client, match, self.keys.ring)

    def groups(self) -> set[str]:
        """Every group the queue knows of: with a lane, in flight, or configured (a book of
        the wrong type names none: stats() names the key)."""
        k = self.keys
        found = {k.group_of_lane(key) for key in self.scan(k.lane_pattern)}
        pipe = self.client.pipeline(transaction=False)
        for name in ("gactive", "glimit", "gweight", "grate", "gmax"):
            pipe.hkeys(getattr(k, name))
        pipe.zrange(k.gwait, 0, -1)
        pipe.smembers(k.gpaused)
        for names in pipe.execute(raise_on_error=False):
            if not isinstance(names, Exception):
                found.update(names)
        return found

    def stats(self) -> dict[str, Any]:
        """Queue totals, and per group its books, effective settings and state (lanes.py).
        A group whose books cannot be read is listed with the state "corrupt" and the reason
        in its ``corrupt``; ``corrupt`` of the queue: its keys of the wrong type (each read
        as empty), one line each."""
        k = self.keys
        groups = sorted(self.groups())
        books = lanes.read_books(self.client, k, groups)
        pipe = self.client.pipeline(transaction=False)
        for key in (k.delayed, k.dead, k.active):
            pipe.zcard(key)
        pipe.llen(k.ring)
        pipe.zcard(k.gvt)
        queue_marks(pipe, k)
        faults: list[str] = books["faults"]
        replies = pipe.execute(raise_on_error=False)
        delayed, dead, active, ring, ring_time = (
            lanes.readable(self.client, key, r, 0, faults)
            for key, r in zip((k.delayed, k.dead, k.active, k.ring, k.gvt), replies))
        per_group = {g: lanes.view(self.client, k, g, books) for g in groups}
        return {
            "queue": self.name, "paused": books["paused"], "fairness": books["fairness"],
            "pending": sum(v["pending"] for v in per_group.values()),
            "active": active, "delayed": delayed, "dead": dead, "ring": ring + ring_time,
            **read_marks(self.client, k, replies[5:], books["now_ms"], faults),
            "corrupt": faults, "groups": per_group,
        }

    def workers(self) -> list[dict[str, Any]]:
        """The live workers of this queue (their heartbeats, heartbeat.py)."""
        return heartbeat.read(self.client, self.keys.base)

    def lane(self, group: str) -> dict[str, Any]:
        """One group's stats() row, read without scanning the queue."""
        g = check_group(group)
        return lanes.view(self.client, self.keys, g, lanes.read_books(self.client, self.keys,
                                                                      [g]))

    def purge(self) -> int:
        """Delete every key of the queue (jobs, lanes, books, flags); returns keys removed."""
        removed = 0
        batch: list[str] = []
        for key in self.scan(self.keys.all_pattern):
            batch.append(key)
            if len(batch) >= 500:
                removed += self.client.unlink(*batch)
                batch = []
        if batch:
            removed += self.client.unlink(*batch)
        return removed


def queue_marks(pipe: Any, keys: QueueKeys) -> None:
    """Queue on a pipeline the reads of what stats() shows beside the books (read_marks)."""
    pipe.hget(keys.tally, "stale_acks")
    pipe.hmget(keys.clock, "seen", "step", "at")


def read_marks(client: Any, keys: QueueKeys, replies: Sequence[Any], now_ms: int,
               faults: list[str]) -> dict[str, Any]:
    """From queue_marks' replies (a pipeline run with ``raise_on_error=False``):
    ``stale_acks`` (acks the fence refused, counted by the server for every worker) and
    ``clock`` (steps of the server's clock, clock.state); a key of the wrong type reads as
    unset and is named in ``faults``."""
    stale = lanes.readable(client, keys.tally, replies[0], None, faults)
    seen, step, at = lanes.readable(client, keys.clock, replies[1], (None, None, None), faults)
    return {"stale_acks": _int_or(stale, 0), "clock": clock.state(now_ms, seen, step, at)}


def _int_or(value: Any, default: D) -> int | D:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def rate_args(max_jobs: int | None, per: float) -> list[Any]:
    """The rate script's (max_jobs, per_ms), or ('', '') to clear."""
    if max_jobs is None:
        return ["", ""]
    count = integer(max_jobs, "a rate's max_jobs", 1)
    window = seconds(per, "a rate's per", above_low=True)
    return [count, max(1, round(window * 1000))]


def default_arg(name: str, value: Any) -> Any:
    """One default as the defaults script stores it; '' clears it."""
    if value is None:
        return ""
    if name == "rate":
        if isinstance(value, str):
            parsed = parse_rate(value)
            assert parsed is not None
            value = parsed
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise InvalidArgument(f"a default rate is (max_jobs, per seconds), not {value!r}")
        count, per_ms = rate_args(value[0], value[1])
        return f"{count}:{per_ms}"
    if name == "max_size":
        return integer(value, "a default max_size", 0)
    if name in ("limit", "weight"):
        return integer(value, f"a default {name}", 1)
    raise InvalidArgument(f"unknown group default {name!r}: limit, rate, max_size or weight")

