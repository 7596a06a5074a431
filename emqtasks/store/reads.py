"""What the store reads for the views and the producers' handles: job rows, a job's end,
the lanes' heads, the find verb, the history's rows and the masters' heartbeats. The read
models built on them (a lane's state, stats, summaries) are lanes.py's and history.py's."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ResponseError

from ..errors import CorruptKey
from ..validate import integer
from . import beats, minutes
from .connection import MAX_BLOCK, PoolBusy
from .core import QueueCore
from .keys import QueueKeys, check_job_id
from .minutes import DEFAULT_HOURS, DEFAULT_MAX_GROUPS, Minute
from .plan import Bounded, Pop, Script, Steps, blpop, cmd
from .replies import ENDED, FoundPage, LaneHead, Lease, Outcome, SpanRow, int_or, job_view

#: Groups per call of the lanes verb (lua/lanes.lua; about a millisecond of the server's time
#: per 200 groups).
LANES_CHUNK = 500


class Reads(QueueCore):
    """Reads of rows and books, each decoded (replies.py)."""

    # -- a job's row ----------------------------------------------------------------------
    def job(self, job_id: str) -> dict[str, Any] | None:
        """A read-only view of a job row, or None once it expired (or never was); a job key
        of the wrong type raises CorruptKey naming it."""
        return self.run(job_plan(self.keys, job_id))

    def status(self, job_id: str) -> str | None:
        return self.run(status_plan(self.keys, job_id))

    def links(self, job_id: str) -> tuple[str | None, list[str], list[str]]:
        """A workflow step's place as its row knows it: (its workflow's id, the ids of the
        steps it releases, the ids of the steps it waits for); (None, [], []) for a plain job
        or a row that is gone."""
        try:
            wf, nxt, par = self.client.hmget(self.keys.job(check_job_id(job_id)),
                                             "wf", "next", "par")
        except ResponseError as exc:
            raise self.run(unreadable_row_plan(self.keys, job_id, exc)) from None
        return wf, (nxt or "").split(), (par or "").split()

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

    def unreadable_row(self, job_id: str, exc: ResponseError) -> CorruptKey:
        """The error for a job key that a read found of the wrong type (``exc``, its
        WRONGTYPE; any other error is raised as it is)."""
        return self.run(unreadable_row_plan(self.keys, job_id, exc))

    def _not_a_hash(self, job_id: str, exc: Exception) -> str:
        return self.run(not_a_hash_plan(self.keys, job_id, exc))

    def holds(self, lease: Lease) -> bool:
        """Whether this lease is still the current claim of its job (one HMGET, no verb):
        false once it expired and the job was claimed again, or finished."""
        state, attempts, nonce = self.client.hmget(self.keys.job(lease.id), "state",
                                                   "attempts", "nonce")
        return bool(state == "active" and attempts == str(lease.attempts)
                    and nonce == lease.nonce)

    def retry_link(self, job_id: str) -> str | None:
        """The span of the job's last failed attempt (a traceparent retry() kept), if any."""
        link: str | None = self.client.hget(self.keys.job(job_id), "tlink")
        return link

    def trace_row(self, job_id: str) -> SpanRow:
        """The spans a job's row names, for its run's span (one HMGET)."""
        link, parent, links = self.client.hmget(self.keys.job(job_id), "tlink", "tparent",
                                                "tlinks")
        return SpanRow(link, parent, tuple((links or "").split()))

    def trace_of(self, job_id: str) -> tuple[str, SpanRow]:
        """(payload, the spans its row names) of a job: what the span of a run its master
        settles needs (its sender's context is in the payload's envelope)."""
        payload, link, parent, links = self.client.hmget(
            self.keys.job(job_id), "payload", "tlink", "tparent", "tlinks")
        return payload or "", SpanRow(link, parent, tuple((links or "").split()))

    # -- a job's end (JobHandle.get) ------------------------------------------------------
    def outcome(self, job_id: str, register: bool = False) -> tuple[str | None, str | None,
                                                                      str | None]:
        """(state, result JSON, error) of a job; with register, count the caller as a waiter
        so the verb that ends the job pushes a token on ``keys.done(job_id)``."""
        return self.run(outcome_plan(self.keys, job_id, register))

    def wait_done(self, job_id: str, timeout: float) -> bool:
        """Block until the job's end is announced or timeout passes (one BLPOP)."""
        return blpop(self.client, [self.keys.done(job_id)], timeout) is not None

    def wait_outcome(self, job_id: str, deadline: float | None,
                     chunk: float = MAX_BLOCK) -> Outcome:
        """Follow a job until it ends or ``deadline`` passes (wait_plan)."""
        return self.run(wait_plan(self.keys, job_id, deadline, chunk))

    # -- the dashboard's search and lane table ---------------------------------------------
    def find(self, which: str, rank: int, chunk: int, most: int, task: str = "",
             group: str = "", text: str = "", bound: str = "") -> FoundPage:
        """One bounded look through ``which`` (dead, delayed, active, or lane: the lane of
        ``group``) from ``rank``, at ``chunk`` entries at most (lua/find.lua)."""
        return FoundPage.from_reply(self.scripts.find(self._k, [
            which, rank, chunk, most, task, group, text, bound]))

    def lane_heads(self, groups: Sequence[str]) -> list[LaneHead]:
        """Each group's pending count, head and busy time, LANES_CHUNK groups a call."""
        heads: list[LaneHead] = []
        for i in range(0, len(groups), LANES_CHUNK):
            heads += LaneHead.from_replies(self.scripts.lanes(self._k,
                                                              groups[i:i + LANES_CHUNK]))
        return heads

    # -- the history's rows (store/minutes.py; summed by history.py) -----------------------
    def history_settings(self) -> tuple[int, int]:
        """(retention hours, groups tracked a minute) as the verbs read them."""
        hours, cap = self.client.hmget(self.keys.gdefaults, "history", "hgroups")
        return int_or(hours, DEFAULT_HOURS), int_or(cap, DEFAULT_MAX_GROUPS)

    def minutes(self, count: int, end: int | None = None) -> list[Minute]:
        """The counters of the last ``count`` minutes up to the unix minute ``end`` (default:
        the server's now), oldest first, a missing minute as zeros."""
        return minutes.read(self.client, self.keys, count, end)

    def server_minute(self) -> int:
        """The server's current unix minute (on a cluster, the clock of the queue's node)."""
        return minutes.server_minute(self.client, self.keys)

    # -- the masters' heartbeats (store/beats.py) ------------------------------------------
    def workers(self) -> list[dict[str, Any]]:
        """The live workers of this queue (their heartbeats), oldest first."""
        return beats.read(self.client, self.keys)

    def remove_beat(self, worker_id: str) -> None:
        """A stopping master's goodbye (best effort: its heartbeat would expire anyway)."""
        beats.remove(self.client, self.keys, worker_id)


# -- the plans (plan.py) the sync Queue and the async one (aqueue.py) share ----------------
def job_plan(keys: QueueKeys, job_id: str) -> Steps[dict[str, Any] | None]:
    """Reads.job."""
    key = keys.job(check_job_id(job_id))
    try:
        row = yield cmd("hgetall", key)
    except ResponseError as exc:
        raise (yield from unreadable_row_plan(keys, job_id, exc)) from None
    return job_view(job_id, row) if row else None


def status_plan(keys: QueueKeys, job_id: str) -> Steps[str | None]:
    """Reads.status: pending, delayed, active, done, dead, cancelled, skipped, expired,
    aborted, or None."""
    try:
        state: str | None = yield cmd("hget", keys.job(job_id), "state")
    except ResponseError as exc:
        raise (yield from unreadable_row_plan(keys, job_id, exc)) from None
    return state


def unreadable_row_plan(keys: QueueKeys, job_id: str, exc: ResponseError) -> Steps[CorruptKey]:
    """Reads.unreadable_row."""
    what = yield from not_a_hash_plan(keys, job_id, exc)
    return CorruptKey(f"queue {keys.name}: job {job_id} cannot be read: {what} (emqtasks "
                      "check --repair moves it to dead)", (keys.job(job_id),))


def not_a_hash_plan(keys: QueueKeys, job_id: str, exc: Exception) -> Steps[str]:
    """"<job key> holds a <type>, not a hash" for a read its WRONGTYPE refused (any other
    error is raised as it is)."""
    if not str(exc).startswith("WRONGTYPE"):
        raise exc
    key = keys.job(job_id)
    kind = yield cmd("type", key)
    return f"{key} holds a {kind}, not a hash"


def outcome_plan(keys: QueueKeys, job_id: str,
                 register: bool = False) -> Steps[tuple[str | None, str | None, str | None]]:
    """Reads.outcome (lua/wait.lua)."""
    state, result, error = yield Script("wait", keys.fixed, [job_id, "1" if register else "0"])
    return state, result, error


def wait_plan(keys: QueueKeys, job_id: str, deadline: float | None,
              chunk: float = MAX_BLOCK) -> Steps[Outcome]:
    """Follow a job until it ends or ``deadline`` (time.monotonic(); None: for ever)
    passes: one BLPOP on its done key per ``chunk`` seconds at most. A caller that finds
    every connection of its client busy waits for one within its deadline."""
    registered = False
    seen: str | None = "unseen"
    while True:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            seen, result, error = yield Bounded(
                Script("wait", keys.fixed, [job_id, "0" if registered else "1"]), left)
            registered = True
            if seen is None or seen in ENDED:
                return Outcome(seen, result, error, True)
            wait = chunk if deadline is None else min(chunk, deadline - time.monotonic())
            if wait <= 0:
                return Outcome(seen, None, None, False)
            yield Bounded(Pop([keys.done(job_id)], wait), left)
        except PoolBusy:
            if deadline is not None and time.monotonic() >= deadline:
                return Outcome(seen, None, None, False)
