"""The invariant checker: reads a queue and reports every violation of DESIGN's invariants.

Read a quiet queue (no worker running) for an exact answer: the structures are read in one
MULTI snapshot, but the job rows are scanned after it, so a live queue can show passing
differences. It also checks what the verbs read: every key of the queue holds its type, the
books a claim reads of each group are readable, and so is every waiting or running job's row
(the rules of lua/lib/seat.lua and rows.lua, as the store writes them in Python:
settings.book_faults, replies.row_fault); it reports them and never fails on them.
``repair`` rebuilds the derived structures (ring, gactive, and any derived key of the wrong
type), moves rows a claim could not read to ``dead`` with the reason, puts back jobs that no
structure holds, and names what it could not mend.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..store.groups import group_names
from ..store.keys import NAMED_TYPES, TENANT_MARK, WAKE_CAP, expected_type, ident_of, kind_of
from ..store.protocol import ROW_INTS
from ..store.queue import Queue
from ..store.replies import ROW_READ, row_fault
from ..store.settings import OWN_BOOK, effective, int_ok, queue_book_faults

__all__ = ["REBUILT", "ROW_INTS", "TYPES", "WAKE_CAP", "Repaired", "Report", "check",
           "expected_type", "rebuilt", "repair", "row_fault"]

_PLACES = {"pending": "lane", "active": "active", "delayed": "delayed", "dead": "dead"}

#: The type of each named key of a queue, by its name after the queue's base (the store's).
TYPES = NAMED_TYPES
#: Keys repair deletes when of the wrong type: rebuilt from the rows, or books the verbs and
#: the workers write again (a minute's history, wake tokens, cost estimates, heartbeats).
#: The others are settings and workflows, which only their owner can set again.
REBUILT = frozenset({"ring", "active", "gactive", "gturn", "delayed", "dead", "wake",
                     "gbackoff", "gwait", "gvt", "gvrun", "gcost", "busy", "workers", "tasks",
                     "schedver", "tactive", "twait"})
#: The families of keys (store/keys.py FAMILIES) repair deletes when of the wrong type.
_REBUILT_FAMILIES = frozenset({"minute", "done", "worker", "lane", "starts", "group_busy",
                               "tenant_ring", "tenant_gvt", "unique", "tenant_starts",
                               "tenant_groups", "aborts"})
#: The states of a job that has ended: its unique key (if any) is no longer held.
_ENDED = frozenset({"done", "dead", "cancelled", "expired", "aborted", "skipped"})
#: Settings the rebuild reads (a group's openness, its books): of the wrong type, they stop it.
_NEEDED = frozenset({"gdefaults", "fairness", "glimit", "gweight", "gpaused", "grate",
                     "gtenant", "tlimit", "tpaused", "trate"})

def rebuilt(name: str) -> bool:
    """Whether repair deletes the key of this name (after the base) when of the wrong type."""
    kind = kind_of(name)
    return kind in REBUILT or kind in _REBUILT_FAMILIES


@dataclass
class Report:
    """What the checker found; ``ok`` when no invariant is broken."""

    violations: list[str] = field(default_factory=list)
    jobs: int = 0
    groups: int = 0
    lost: list[str] = field(default_factory=list)   # rows that wait in no structure
    #: (workflow, step, lost parent): a step waiting for a parent that cannot release it
    orphans: list[tuple[str, str, str]] = field(default_factory=list)
    #: key (after the base) -> (the type it holds, the type it must hold)
    wrong_types: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: job id -> (its group or None, why a claim cannot read its row): repair buries them
    unreadable: dict[str, tuple[str | None, str]] = field(default_factory=dict)
    #: settings a claim cannot read (a group's limit, weight, rate, lane cap; a default)
    bad_settings: list[str] = field(default_factory=list)
    #: books of learnt values a claim cannot read (cost estimates): repair resets them
    bad_books: set[str] = field(default_factory=set)
    group_names: list[str] = field(default_factory=list)
    #: unique key -> the job it names, gone or ended: not a violation (the next enqueue of the
    #: key takes it over, and it expires at its unique_for), but repair frees it now
    stale_uniques: dict[str, str] = field(default_factory=dict)
    #: master id -> the tokens of its abort list no master will act on: all of them when
    #: the master is not alive (its id in ``dead_abort_lists``: repair deletes the list),
    #: else those aimed at attempts that are over. Not a violation (a list expires ABORT_TTL
    #: s after its last push; a master drops a token for an attempt it does not run), but
    #: repair deletes them now.
    stale_aborts: dict[str, list[str]] = field(default_factory=dict)
    dead_abort_lists: set[str] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return not self.violations

    def add(self, message: str) -> None:
        self.violations.append(message)


def _types(queue: Queue, report: Report) -> tuple[set[str], set[str], set[str], set[str]]:
    """Every key of the queue by name: the job ids, the group names of its lanes, the unique
    keys, the masters with an abort list, and each key of the wrong type noted in the report
    (job rows are checked as they are read)."""
    k = queue.keys
    names = [k.name_of(key) for key in queue.scan(k.all_pattern)]
    others = [n for n in names if kind_of(n) != "job" and expected_type(n)]
    pipe = queue.client.pipeline(transaction=False)
    for name in others:
        pipe.type(k.named(name))
    for name, kind in zip(others, pipe.execute()):
        want = expected_type(name)
        if want and kind not in (want, "none"):
            report.wrong_types[name] = (kind, want)
    ids = {ident_of(n) for n in names if kind_of(n) == "job"}
    lanes = {ident_of(n) for n in names if kind_of(n) == "lane"}
    uniques = {ident_of(n) for n in names
               if kind_of(n) == "unique" and n not in report.wrong_types}
    aborts = {ident_of(n) for n in names
              if kind_of(n) == "aborts" and n not in report.wrong_types}
    return ids, lanes, uniques, aborts


#: What the snapshot reads of each structure and book: (key after the base, command).
_SNAPSHOT = (("active", "zrange"), ("delayed", "zrange"), ("dead", "zrange"), ("gvt", "zrange"),
             ("gwait", "zrange"), ("ring", "lrange"), ("gactive", "hgetall"),
             ("gbackoff", "hgetall"),
             ("glimit", "hgetall"), ("gweight", "hgetall"), ("gturn", "hgetall"),
             ("grate", "hgetall"), ("gmax", "hgetall"), ("gcost", "hgetall"),
             ("gdefaults", "hgetall"), ("gpaused", "smembers"), ("wake", "llen"),
             ("fairness", "get"), ("gtenant", "hgetall"), ("tactive", "hgetall"),
             ("tlimit", "hgetall"), ("tpaused", "smembers"), ("twait", "zrange"))
_EMPTY: dict[str, Any] = {"zrange": [], "lrange": [], "hgetall": {}, "smembers": set(),
                          "llen": 0, "get": None}


def _snapshot(queue: Queue, report: Report, lanes: set[str]) -> dict[str, Any]:
    """The structures and books in one MULTI, each key of the wrong type read as empty."""
    k = queue.keys
    reads = [(name, cmd) for name, cmd in _SNAPSHOT if name not in report.wrong_types]
    readable = sorted(g for g in lanes if k.name_of(k.lane(g)) not in report.wrong_types)
    pipe = queue.client.pipeline(transaction=True)
    for name, cmd in reads:
        ranged = cmd in ("zrange", "lrange")
        getattr(pipe, cmd)(k.named(name), *((0, -1) if ranged else ()))
    for g in readable:
        pipe.zrange(queue.keys.lane(g), 0, -1)
    replies = [None if isinstance(r, Exception) else r     # a key that changed type since
               for r in pipe.execute(raise_on_error=False)]
    books: dict[str, Any] = {name: _EMPTY[cmd] for name, cmd in _SNAPSHOT}
    for (name, cmd), reply in zip(reads, replies):
        books[name] = _EMPTY[cmd] if reply is None else reply
    books["lanes"] = {g: r or [] for g, r in zip(readable, replies[len(reads):])}
    # each tenant's ring (lua/lib/ring.lua): its open groups; in time mode its zset, and
    # the tenants' marks stand in `gvt` (lua/lib/timefair.lua)
    books["time_mode"] = books.pop("fairness") == "time"
    tenants = sorted(set(books["gtenant"].values()))
    pipe = queue.client.pipeline(transaction=False)
    for t in tenants:
        if books["time_mode"]:
            pipe.zrange(k.tenant_gvt(t), 0, -1)
        else:
            pipe.lrange(k.tenant_ring(t), 0, -1)
        pipe.smembers(k.tenant_groups(t))     # gtenant backwards (a tenant's lane cap)
    replies = pipe.execute(raise_on_error=False)
    books["trings"] = {t: r if isinstance(r, list) else []
                       for t, r in zip(tenants, replies[0::2])}
    books["tgroups"] = {t: r if isinstance(r, set) else set()
                        for t, r in zip(tenants, replies[1::2])}
    return books


def _rows(queue: Queue, report: Report, ids: set[str]) -> dict[str, dict[str, str | None]]:
    """Each job row's fields the verbs read; a key of the wrong type noted and left out."""
    order = sorted(ids)
    pipe = queue.client.pipeline(transaction=False)
    for i in order:
        pipe.hmget(queue.keys.job(i), *ROW_READ)
    rows: dict[str, dict[str, str | None]] = {}
    wrong = []
    for i, values in zip(order, pipe.execute(raise_on_error=False)):
        if isinstance(values, Exception):
            wrong.append(i)
        else:
            rows[i] = dict(zip(ROW_READ, values))
    if wrong:
        pipe = queue.client.pipeline(transaction=False)
        for i in wrong:
            pipe.type(queue.keys.job(i))
        for i, kind in zip(wrong, pipe.execute()):
            if kind not in ("hash", "none"):
                report.wrong_types[queue.keys.name_of(queue.keys.job(i))] = (kind, "hash")
    return rows


def check(queue: Queue) -> Report:
    """Every violation of the invariants on this queue, as readable lines."""
    report = Report()
    ids, lane_groups, uniques, aborts = _types(queue, report)
    b = _snapshot(queue, report, lane_groups)
    rows = _rows(queue, report, ids)
    lanes: dict[str, list[str]] = b["lanes"]
    groups = sorted(group_names(lane_groups, b))
    report.group_names = groups
    report.jobs = len(rows) + sum(1 for n in report.wrong_types if kind_of(n) == "job")
    report.groups = len(groups)
    for name, (kind, want) in sorted(report.wrong_types.items()):
        report.add(f"key {queue.keys.named(name)} holds a {kind}, not a {want}")
    _check_books(report, b, groups, queue)
    where: dict[str, list[str]] = {}
    for g, members in lanes.items():
        for i in members:
            where.setdefault(i, []).append(f"lane {g}")
    for name in ("active", "delayed", "dead"):
        for i in b[name]:
            where.setdefault(i, []).append(name)
    for job_id, places in where.items():
        if len(places) > 1:
            report.add(f"job {job_id} is in {len(places)} places: {', '.join(places)}")
        row_name = queue.keys.name_of(queue.keys.job(job_id))
        if row_name in report.wrong_types:
            lane = places[0][5:] if places[0].startswith("lane ") else None
            kind = report.wrong_types[row_name][0]
            report.unreadable[job_id] = (lane, f"the key holds a {kind}, not a hash")
            continue
        if job_id not in rows:
            report.add(f"job {job_id} is in {places[0]} but its row is gone (a ghost)")
            continue
        state, group = rows[job_id]["state"], rows[job_id]["group"]
        expected = _PLACES.get(state or "")
        if expected is None or not places[0].startswith(expected):
            report.add(f"job {job_id} is in {places[0]} but its state is {state}")
        elif expected == "lane" and places[0] != f"lane {group}":
            report.add(f"job {job_id} of group {group} sits in {places[0]}")
    for job_id, row in rows.items():
        state = row["state"]
        if state in ("pending", "delayed", "active"):
            lane = where.get(job_id, [""])[0]
            fault = row_fault(row, lane[5:] if lane.startswith("lane ") else None)
            if fault:
                report.unreadable[job_id] = (lane[5:] if lane.startswith("lane ")
                                             else row["group"], fault)
        if state in _PLACES and job_id not in where and job_id not in report.unreadable:
            report.lost.append(job_id)
            report.add(f"job {job_id} is {state} but no structure holds it (lost)")
    for job_id, (_g, why) in sorted(report.unreadable.items()):
        report.add(f"job {job_id}: unreadable row ({why}): a claim moves it to dead")
    in_flight: Counter[str | None] = Counter(rows[i]["group"] for i in b["active"] if i in rows)
    for holder in set(in_flight) | set(b["gactive"]):
        booked, counted = b["gactive"].get(holder, "0"), in_flight.get(holder, 0)
        if int_ok(booked) and int(booked) != counted:
            report.add(f"gactive of {holder} is {booked} but {counted} of its jobs are active")
    _check_ring(report, groups, lanes, b, in_flight)
    _check_tenants(report, b, in_flight)
    _check_workflows(queue, report, rows)
    keys = sorted(uniques)
    for key, holder in zip(keys, queue.unique_holders(keys)):
        if holder is not None and (holder not in rows or rows[holder]["state"] in _ENDED):
            report.stale_uniques[key] = holder
    _check_aborts(queue, report, sorted(aborts))
    if b["wake"] > WAKE_CAP:
        report.add(f"the wake list holds {b['wake']} tokens (bound {WAKE_CAP})")
    return report


def _check_aborts(queue: Queue, report: Report, masters: list[str]) -> None:
    """The abort lists (lua/abort.lua) no master will take from, or tokens no master will
    act on: the list of a master that is not alive (abort.lua pushes to every master the
    index lists, a dead one's too until a reader drops it), and tokens whose attempt is
    over (the master that ran it is gone, or it never listens again for that attempt)."""
    for wid, (alive, tokens) in zip(masters, queue.abort_lists(masters)):
        if not alive:
            report.dead_abort_lists.add(wid)
            report.stale_aborts[wid] = tokens
            continue
        over = queue.attempts_over(tokens) if tokens else []
        if over:
            report.stale_aborts[wid] = over


def _check_books(report: Report, b: dict[str, Any], groups: list[str], queue: Queue) -> None:
    """What a claim reads of each group's books (store/settings.py queue_book_faults, the
    rule of lua/lib/seat.lua group_seat): a group whose books it cannot read leaves the
    ring, so each is named here; and the time-fair mode's cost estimates."""
    for fault in queue_book_faults(b, groups, queue.keys):
        report.add(fault.line)
        if fault.book == "gdefaults" or fault.book in OWN_BOOK.values():
            report.bad_settings.append(fault.line)
    for who, value in b["gcost"].items():
        if not int_ok(value):
            report.bad_books.add("gcost")
            report.add(f"the cost estimate of {who or 'the queue'} ({queue.keys.named('gcost')})"
                       f" is {value!r}, not an integer: a time-fair claim skips the group")


def _check_ring(report: Report, groups: list[str], lanes: dict[str, list[str]],
                b: dict[str, Any], in_flight: Counter[str | None]) -> None:
    """Each open group (lane waiting, not paused, under its limit) is on the ring once or
    held back in gwait (its rate budget spent, or backing off), and no other group is. The
    ring of a time-fair queue is `gvt` (a zset: each member once); the other one is empty."""
    idle, live = ("ring", "gvt") if b["time_mode"] else ("gvt", "ring")
    if b[idle]:
        report.add(f"the queue is in {'time' if b['time_mode'] else 'turns'} mode but "
                   f"{len(b[idle])} groups are on its {idle}")
    ring_groups = [g for g in b[live] if not g.startswith(TENANT_MARK)]
    others = [g for g in b[idle] if not g.startswith(TENANT_MARK)]
    tenanted = [g for t, members in b["trings"].items() for g in members]
    on_ring = Counter(ring_groups) + Counter(others) + Counter(tenanted)
    waiting = set(b["gwait"])
    for g in ring_groups:
        if g in b["gtenant"]:
            report.add(f"group {g} of tenant {b['gtenant'][g]} is on the queue's ring, "
                       f"not its tenant's")
    for g, n in on_ring.items():
        if n > 1:
            report.add(f"group {g} is on the ring {n} times")
    for g in set(groups) | set(on_ring) | waiting:
        limit = effective(b, g, "limit").value
        if limit is not None and not int_ok(limit):
            continue                              # reported by _check_books
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


def _check_tenants(report: Report, b: dict[str, Any], in_flight: Counter[str | None]) -> None:
    """Each tenant's books (lua/lib/ring.lua): its ring holds only its own groups, its jobs
    in flight are booked in tactive, and its mark stands on the ring (once), or waits out
    its rate in twait, exactly while its ring holds a group and it is open (not paused,
    under its limit); its set of groups is gtenant's."""
    per_tenant: Counter[str] = Counter()
    for g, n in in_flight.items():
        if g is not None and g in b["gtenant"]:
            per_tenant[b["gtenant"][g]] += n
    for t in set(per_tenant) | set(b["tactive"]):
        booked = b["tactive"].get(t, "0")
        if int_ok(booked) and int(booked) != per_tenant.get(t, 0):
            report.add(f"tactive of tenant {t} is {booked} but {per_tenant.get(t, 0)} of its "
                       f"jobs are active")
    live = b["gvt"] if b["time_mode"] else b["ring"]
    marks = Counter(m[len(TENANT_MARK):] for m in live if m.startswith(TENANT_MARK))
    for t, members in b["trings"].items():
        for g in members:
            if b["gtenant"].get(g) != t:
                report.add(f"group {g} is on the ring of tenant {t} but is not its")
    # each tenant's set of groups is gtenant read backwards (its lane cap counts over it)
    for t, members in b["tgroups"].items():
        owned = {g for g, owner in b["gtenant"].items() if owner == t}
        if members != owned:
            report.add(f"the set of groups of tenant {t} differs from gtenant "
                       f"({len(members)} against {len(owned)})")
    waits = set(b["twait"])          # tenants whose rate is spent: their marks wait there
    for t in set(marks) | set(b["trings"]):
        limit = b["tlimit"].get(t, b["tlimit"].get(""))
        active = b["tactive"].get(t, "0")
        is_open = t not in b["tpaused"] and (
            limit is None or not int_ok(limit) or not int_ok(active)
            or int(active) < int(limit))
        should = is_open and bool(b["trings"].get(t))
        if marks.get(t, 0) > 1:
            report.add(f"tenant {t} is on the ring {marks[t]} times")
        if marks.get(t) and t in waits:
            report.add(f"tenant {t} is both on the ring and waiting in twait")
        if should and not marks.get(t) and t not in waits:
            report.add(f"tenant {t} has groups ready and is open but is not on the ring")
        elif marks.get(t) and not should:
            report.add(f"tenant {t} is on the ring but is not serviceable")
    for t in waits - {t for t, members in b["trings"].items() if members}:
        report.add(f"tenant {t} waits in twait but has no group ready")


def _check_workflows(queue: Queue, report: Report,
                     rows: dict[str, dict[str, str | None]]) -> None:
    """A workflow step waits (state waiting, in no structure) until a parent's ack releases
    it: each parent that has not handed its result over must still be able to, so its row
    is there and not finished (done, dead, cancelled, expired, aborted)."""
    waiting = [i for i, row in rows.items() if row["state"] == "waiting"]
    pipe = queue.client.pipeline(transaction=False)
    for i in waiting:
        pipe.hmget(queue.keys.job(i), "wf", "par", "npend")
        pipe.hkeys(queue.keys.chord(i))
    replies = pipe.execute(raise_on_error=False)
    for n, step in enumerate(waiting):
        fields, handed = replies[2 * n], replies[2 * n + 1]
        if isinstance(fields, Exception):
            continue                               # the row changed type meanwhile
        wf, par, npend = fields
        handed = set() if isinstance(handed, Exception) else set(handed)
        if not wf or not par:      # a link_error step: released by a failure, or never
            continue
        for slot, parent in enumerate(par.split()):
            if npend is not None and str(slot) in handed:
                continue
            state = rows.get(parent, {}).get("state")
            if state is None or state in ("done", "dead", "cancelled", "expired", "aborted"):
                why = "is gone" if state is None else f"ended {state} without handing over"
                report.add(f"workflow {wf}: step {step} waits for parent {parent}, which {why}")
                report.orphans.append((wf, step, parent))


class Repaired(NamedTuple):
    """What repair() mended, and what it could not."""
    ringed: int             # groups on the ring after the rebuild
    restored: int           # lost jobs put back in their lanes
    workflows_failed: int   # workflows failed at a parent that is gone
    buried: int = 0         # unreadable rows moved to dead with the reason
    rebuilt: tuple[str, ...] = ()       # keys of the wrong type deleted and rebuilt
    not_repaired: tuple[str, ...] = ()  # what an operator must mend (then repair again)
    uniques_freed: int = 0  # unique keys whose job was gone or ended, deleted
    aborts_dropped: int = 0  # abort tokens of masters gone or of attempts over, deleted


def repair(queue: Queue) -> Repaired:
    """Rebuild ring and gactive (and every derived key of the wrong type), move unreadable
    rows to dead with the reason, restore lost jobs. A workflow step waiting for a parent
    that is gone is resolved as failed (the workflow fails at that parent: its waiting steps
    are cancelled, its link_error step runs). Settings and workflows are their owner's: one
    of the wrong type, or a value a claim cannot read, is named in ``not_repaired`` (and a
    setting the rebuild reads, of the wrong type, stops it: mend it, then repair again)."""
    report = check(queue)
    k = queue.keys
    rebuild = sorted({n for n in report.wrong_types if rebuilt(n)} | report.bad_books)
    stray = [n for n in sorted(report.wrong_types)
             if not rebuilt(n) and not (kind_of(n) == "job" and ident_of(n) in report.unreadable)]
    not_repaired = tuple([f"{k.named(n)} holds a {report.wrong_types[n][0]}, not a "
                          f"{report.wrong_types[n][1]}: delete it or set it again"
                          for n in stray] + report.bad_settings)
    if _NEEDED.intersection(stray):
        return Repaired(0, 0, 0, not_repaired=not_repaired)
    groups = sorted(set(report.group_names) | {g for g, _ in report.unreadable.values() if g})
    bury = [(i, g or "", why) for i, (g, why) in sorted(report.unreadable.items())]
    ringed, restored = queue.repair(groups, rebuild, bury, report.lost)
    failed = sum(queue.fail_workflow(wf, parent, step) for wf, step, parent in report.orphans)
    freed = sum(queue.drop_unique(key, holder) for key, holder in report.stale_uniques.items())
    dropped = sum(queue.drop_aborts(wid, tokens, wid in report.dead_abort_lists)
                  for wid, tokens in report.stale_aborts.items())
    return Repaired(int(ringed), int(restored), failed, len(report.unreadable),
                    tuple(k.named(n) for n in rebuild), not_repaired, freed, dropped)
