"""The rows the verbs take and the replies they give, each named: no index arithmetic outside
the store."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, TypeVar

from ..verdicts import AckVerdict
from .plan import Steps, cmd, run
from .protocol import ROW_INTS
from .settings import int_ok


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
    (done, dead, cancelled, skipped, expired or gone) or the deadline came first."""

    state: str | None
    result: str | None
    error: str | None
    ended: bool


class SpanRow(NamedTuple):
    """The spans a job's row names (W3C traceparents), for its run's span: ``link`` the last
    failed attempt's (``tlink``), ``parent`` the run that released this workflow step
    (``tparent``), ``links`` a chord callback's members before the last (``tlinks``)."""

    link: str | None
    parent: str | None
    links: tuple[str, ...]


#: The states a job ends in (a row that is gone counts too). ``expired``: its ``expires``
#: passed before a claim started it (lua/lib/claim.lua), so it never ran.
ENDED = ("done", "dead", "cancelled", "skipped", "expired", "aborted")


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


class Acked(NamedTuple):
    """What ack answers: the verdict (DONE, or STALE: nothing was written) and, with
    claim_next, the next lease (None when none was asked or none is serviceable)."""

    verdict: AckVerdict
    next: Lease | None


class Reaped(NamedTuple):
    """What a reap did, and the clock it read: the server's time (ms) and the queue's clock
    mark before it (the latest server time a reap saw; 0 for none). A mark ahead of the
    server's time is a clock stepped back (clock.py). ``dead`` counts every job the reap
    ended: into ``dead``, or ``aborted`` (an attempt whose abort was asked, lua/reap.lua)."""

    returned: int
    dead: int
    server_ms: int
    seen_ms: int


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


D = TypeVar("D")


def int_or(value: Any, default: D) -> int | D:
    """An integer field of a row or book; ``default`` when unset or not an integer."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def job_view(job_id: str, row: dict[str, str]) -> dict[str, Any]:
    """What Queue.job shows of a job's row (its hash, read whole)."""
    view: dict[str, Any] = {"id": job_id}
    for field in ("state", "task", "group", "error", "result", "unique"):
        view[field] = row.get(field)
    for field in ("attempts", "max", "created", "started", "finished"):
        # None too for a count or time that is not an integer (a row a claim buried)
        view[field] = int_or(row.get(field), None)
    view["max_attempts"] = view.pop("max")
    view["corrupt"] = None    # a job key of the wrong type (dead_jobs): what it holds
    return view


#: The fields of a row the checker reads: its state, its group and the integers.
ROW_READ = ("state", "group", *(name for name, _ in ROW_INTS))


def row_fault(row: dict[str, str | None], lane: str | None = None) -> str | None:
    """Why a claim could not lease this row (lua/lib/rows.lua row_fault), or None. ``lane``:
    the group of the lane it sits in, when it sits in one."""
    if row.get("group") is None:
        return "no group"
    if lane is not None and row["group"] != lane:
        return "its group is not the lane it was in"
    for name, required in ROW_INTS:
        value = row.get(name)
        if value is None:
            if required:
                return f"no {name}"
        elif not int_ok(value):
            return f"{name} is not an integer"
    return None


def readable(client: Any, key: str, reply: Any, empty: Any, faults: list[str]) -> Any:
    """A reply of a pipeline run with ``raise_on_error=False``: a key of the wrong type reads
    as ``empty`` and adds one line naming it to ``faults`` (a view shows what it can of a
    queue a producer-ACL user spoilt, never a raw WRONGTYPE); any other error is raised."""
    if not isinstance(reply, Exception):
        return reply
    return run(readable_plan(key, reply, empty, faults), client)


def readable_plan(key: str, reply: Any, empty: Any, faults: list[str]) -> Steps[Any]:
    """readable as a plan (plan.py): the type of a key of the wrong type is read."""
    if not isinstance(reply, Exception):
        return reply
    if not str(reply).startswith("WRONGTYPE"):
        raise reply
    faults.append(f"{key} holds a {(yield cmd('type', key))}")
    return empty
