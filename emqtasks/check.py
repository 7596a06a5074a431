"""The invariant checker: reads a queue and reports every violation of DESIGN's invariants.

Read a quiet queue (no worker running) for an exact answer: the structures are read in one
MULTI snapshot, but the job rows are scanned after it, so a live queue can show passing
differences. ``repair`` rebuilds the derived structures (ring, gactive) and puts back jobs
that no structure holds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .queue import Queue

WAKE_CAP = 16
_PLACES = {"pending": "lane", "active": "active", "delayed": "delayed", "dead": "dead"}


@dataclass
class Report:
    """What the checker found; ``ok`` when no invariant is broken."""

    violations: list[str] = field(default_factory=list)
    jobs: int = 0
    groups: int = 0
    lost: list[str] = field(default_factory=list)   # rows that wait in no structure
    #: (workflow, step, lost parent): a step waiting for a parent that cannot release it
    orphans: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def add(self, message: str) -> None:
        self.violations.append(message)


def _snapshot(queue: Queue) -> tuple[list[str], dict[str, list[str]], dict[str, Any]]:
    k = queue.keys
    groups = sorted(queue.groups())
    pipe = queue.client.pipeline(transaction=True)
    for g in groups:
        pipe.zrange(k.lane(g), 0, -1)
    for name in ("ring", "active", "delayed", "dead"):
        getattr(pipe, "lrange" if name == "ring" else "zrange")(getattr(k, name), 0, -1)
    pipe.hgetall(k.gactive)
    pipe.hgetall(k.glimit)
    pipe.smembers(k.gpaused)
    pipe.llen(k.wake)
    pipe.zrange(k.gwait, 0, -1)
    pipe.hget(k.gdefaults, "limit")
    pipe.zrange(k.gvt, 0, -1)
    pipe.get(k.fairness)
    replies = pipe.execute()
    lanes = dict(zip(groups, replies[: len(groups)]))
    ring, active, delayed, dead, gactive, glimit, gpaused, wake, gwait, default_limit, gvt, \
        mode = replies[len(groups):]
    books = {"ring": ring, "active": active, "delayed": delayed, "dead": dead,
             "gactive": gactive, "glimit": glimit, "gpaused": gpaused, "wake": wake,
             "gwait": gwait, "default_limit": default_limit, "gvt": gvt,
             "time_mode": mode == "time"}
    return groups, lanes, books


def _rows(queue: Queue) -> dict[str, tuple[str | None, str | None]]:
    base = queue.keys.job("")
    keys = list(queue.scan(base + "*"))
    pipe = queue.client.pipeline(transaction=False)
    for key in keys:
        pipe.hmget(key, "state", "group")
    return {key[len(base):]: tuple(row) for key, row in zip(keys, pipe.execute())}


def check(queue: Queue) -> Report:
    """Every violation of the invariants on this queue, as readable lines."""
    groups, lanes, b = _snapshot(queue)
    rows = _rows(queue)
    report = Report(jobs=len(rows), groups=len(groups))
    where: dict[str, list[str]] = {}
    for g, ids in lanes.items():
        for i in ids:
            where.setdefault(i, []).append(f"lane {g}")
    for name in ("active", "delayed", "dead"):
        for i in b[name]:
            where.setdefault(i, []).append(name)
    for job_id, places in where.items():
        if len(places) > 1:
            report.add(f"job {job_id} is in {len(places)} places: {', '.join(places)}")
        if job_id not in rows:
            report.add(f"job {job_id} is in {places[0]} but its row is gone (a ghost)")
            continue
        state, group = rows[job_id]
        expected = _PLACES.get(state or "")
        if expected is None or not places[0].startswith(expected):
            report.add(f"job {job_id} is in {places[0]} but its state is {state}")
        elif expected == "lane" and places[0] != f"lane {group}":
            report.add(f"job {job_id} of group {group} sits in {places[0]}")
    for job_id, (state, _group) in rows.items():
        if state in _PLACES and job_id not in where:
            report.lost.append(job_id)
            report.add(f"job {job_id} is {state} but no structure holds it (lost)")
    in_flight: Counter[str | None] = Counter(rows[i][1] for i in b["active"] if i in rows)
    for holder in set(in_flight) | set(b["gactive"]):
        booked, counted = int(b["gactive"].get(holder, 0)), in_flight.get(holder, 0)
        if booked != counted:
            report.add(f"gactive of {holder} is {booked} but {counted} of its jobs are active")
    _check_ring(report, groups, lanes, b, in_flight)
    _check_workflows(queue, report, rows)
    if b["wake"] > WAKE_CAP:
        report.add(f"the wake list holds {b['wake']} tokens (bound {WAKE_CAP})")
    return report


def _check_ring(report: Report, groups: list[str], lanes: dict[str, list[str]],
                b: dict[str, Any], in_flight: Counter[str | None]) -> None:
    """Each open group (lane waiting, not paused, under its limit) is on the ring once or
    held back in gwait (its rate budget spent, or backing off), and no other group is. The
    ring of a time-fair queue is `gvt` (a zset: each member once); the other one is empty."""
    idle, live = ("ring", "gvt") if b["time_mode"] else ("gvt", "ring")
    if b[idle]:
        report.add(f"the queue is in {'time' if b['time_mode'] else 'turns'} mode but "
                   f"{len(b[idle])} groups are on its {idle}")
    on_ring, waiting = Counter(b[live]) + Counter(b[idle]), set(b["gwait"])
    for g, n in on_ring.items():
        if n > 1:
            report.add(f"group {g} is on the ring {n} times")
    for g in set(groups) | set(on_ring) | waiting:
        limit = b["glimit"].get(g, b["default_limit"])
        is_open = (bool(lanes.get(g)) and g not in b["gpaused"]
                   and (limit is None or in_flight.get(g, 0) < int(limit)))
        if g in on_ring and g in waiting:
            report.add(f"group {g} is both on the ring and waiting in gwait")
        elif is_open and g not in on_ring and g not in waiting:
            report.add(f"group {g} is serviceable but not on the ring")
        elif g in on_ring and not is_open:
            report.add(f"group {g} is on the ring but not serviceable")
        elif g in waiting and not is_open:
            report.add(f"group {g} waits in gwait but is not serviceable")


def _check_workflows(queue: Queue, report: Report,
                     rows: dict[str, tuple[str | None, str | None]]) -> None:
    """A workflow step waits (state waiting, in no structure) until a parent's ack releases
    it: each parent that has not handed its result over must still be able to, so its row
    is there and not finished (done, dead, cancelled)."""
    waiting = [i for i, (state, _g) in rows.items() if state == "waiting"]
    pipe = queue.client.pipeline(transaction=False)
    for i in waiting:
        pipe.hmget(queue.keys.job(i), "wf", "par", "npend")
        pipe.hkeys(queue.keys.chord(i))
    replies = pipe.execute()
    for n, step in enumerate(waiting):
        (wf, par, npend), handed = replies[2 * n], set(replies[2 * n + 1])
        if not wf or not par:      # a link_error step: released by a failure, or never
            continue
        for slot, parent in enumerate(par.split()):
            if npend is not None and str(slot) in handed:
                continue
            state = rows.get(parent, (None, None))[0]
            if state is None or state in ("done", "dead", "cancelled"):
                why = "is gone" if state is None else f"ended {state} without handing over"
                report.add(f"workflow {wf}: step {step} waits for parent {parent}, which {why}")
                report.orphans.append((wf, step, parent))


class Repaired(NamedTuple):
    """What repair() mended."""
    ringed: int             # groups on the ring after the rebuild
    restored: int           # lost jobs put back in their lanes
    workflows_failed: int   # workflows failed at a parent that is gone


def repair(queue: Queue) -> Repaired:
    """Rebuild ring and gactive and restore lost jobs. A workflow step waiting for a parent
    that is gone is resolved as failed (the workflow fails at that parent: its waiting
    steps are cancelled, its link_error step runs)."""
    report = check(queue)
    groups = sorted(queue.groups())
    ringed, restored = queue.scripts.repair(queue.keys.fixed,
                                            [len(groups), *groups, *report.lost])
    failed = sum(int(queue.scripts.wffail(queue.keys.fixed, [wf, parent, step]))
                 for wf, step, parent in report.orphans)
    return Repaired(int(ringed), int(restored), failed)
