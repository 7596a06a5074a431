"""Why is this lane waiting? One group's view: its books, its effective settings (its own or
the defaults for every group, by the store's rule: store/settings.py) and the state that says
what holds it back; and a queue's stats, every group's view at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import clock
from ..store import settings
from ..store.core import clock_plan, groups_plan, server_ms
from ..store.keys import PRIO_SPAN, TENANT_MARK, QueueKeys, check_group
from ..store.plan import Pipe, Recorder, Steps, cmd, run
from ..store.replies import int_or, readable, readable_plan
from ..store.settings import SETTINGS, int_ok, parse_rate

if TYPE_CHECKING:
    from ..store.queue import Queue

__all__ = ["BOOK_REPLIES", "DEFAULT_FIELDS", "STATES", "book_faults", "effective_weight",
           "group_row", "int_ok", "lane", "make_books", "minute_ms", "oldest_ms", "parse_rate",
           "queue_books", "queue_marks", "read_books", "read_marks", "readable", "server_ms",
           "set_busy", "shares", "split_score", "stats", "view"]

#: The settings a group has of its own or by default (the store's SETTINGS).
DEFAULT_FIELDS = SETTINGS
STATES = ("ready", "empty", "paused", "queue_paused", "at_limit", "rate_limited", "corrupt",
          "tenant_paused", "tenant_at_limit", "tenant_rate_limited")


def split_score(score: float) -> tuple[int, int]:
    """A lane score -> (priority, enqueue time ms)."""
    prio = round(score / PRIO_SPAN)
    return prio, int(score - prio * PRIO_SPAN)


_BOOK_HASHES = ("gactive", "glimit", "gweight", "grate", "gmax", "gdefaults", "gtenant",
                "tactive", "tlimit", "tweight")
#: The other shared books: (name in QueueKeys, what a missing or unreadable key reads as).
_BOOK_OTHERS: tuple[tuple[str, Any], ...] = (("gpaused", set()), ("paused", 0), ("gwait", []),
                                             ("fairness", None), ("gvt", []), ("busy", {}),
                                             ("tpaused", set()), ("twait", []))
#: How many replies queue_books adds to a pipeline.
BOOK_REPLIES = len(_BOOK_HASHES) + len(_BOOK_OTHERS)


def queue_books(pipe: Any, keys: Any) -> None:
    """Queue on a pipeline the reads every view of groups shares (BOOK_REPLIES replies,
    for make_books; run it with ``raise_on_error=False``)."""
    for name in _BOOK_HASHES:
        pipe.hgetall(getattr(keys, name))
    pipe.smembers(keys.gpaused)
    pipe.exists(keys.paused)
    pipe.zrange(keys.gwait, 0, -1, withscores=True)
    pipe.get(keys.fairness)
    pipe.zrange(keys.gvt, 0, -1)
    pipe.hgetall(keys.busy)
    pipe.smembers(keys.tpaused)
    pipe.zrange(keys.twait, 0, -1, withscores=True)


def make_books(client: Any, keys: Any, replies: list[Any], now: int) -> dict[str, Any]:
    """The books from queue_books' replies and the server's time (ms) (make_books_plan)."""
    return run(make_books_plan(keys, replies, now), client)


def make_books_plan(keys: Any, replies: list[Any], now: int) -> Steps[dict[str, Any]]:
    """The books from queue_books' replies and the server's time (ms); ``lanes`` and
    ``busy`` per group are the caller's to fill, and ``corrupt`` per group (the lines
    naming what of the group's own keys cannot be read). ``faults``: the shared books of
    the wrong type (read as empty); those of the groups' settings go to every group's row."""
    shared: list[str] = []      # the groups' settings and books: every row shows them
    others: list[str] = []
    n = len(_BOOK_HASHES)
    hashes = []
    for name, reply in zip(_BOOK_HASHES, replies[:n]):
        hashes.append((yield from readable_plan(getattr(keys, name), reply, {}, shared)))
    values = []
    for (name, empty), reply in zip(_BOOK_OTHERS, replies[n:BOOK_REPLIES]):
        values.append((yield from readable_plan(getattr(keys, name), reply, empty, others)))
    books: dict[str, Any] = dict(zip(_BOOK_HASHES, hashes))
    gpaused, paused, gwait, fairness, gvt, busy, tpaused, twait = values
    books.update(now_ms=now, gpaused=gpaused, paused=bool(paused), gwait=dict(gwait),
                 lanes={}, fairness="time" if fairness == "time" else "turns", gvt=gvt,
                 busy={}, corrupt={}, faults=shared + others, shared_faults=shared, keys=keys,
                 tpaused=tpaused, twait=dict(twait))
    books["busy_total"] = minute_ms(busy, now) or 0
    return books


def read_books(client: Any, keys: Any, groups: list[str]) -> dict[str, Any]:
    """Everything the views of these groups need, in one pipelined round trip."""
    return run(read_books_plan(keys, groups), client)


def read_books_plan(keys: Any, groups: list[str]) -> Steps[dict[str, Any]]:
    """read_books as a plan (store/plan.py)."""
    now = yield from clock_plan(keys)
    pipe = Recorder()
    queue_books(pipe, keys)
    for g in groups:
        pipe.hgetall(keys.group_busy(g))
    for g in groups:
        pipe.zcard(keys.lane(g))
        pipe.zrange(keys.lane(g), 0, 0, withscores=True)
        pipe.zrange(keys.lane(g), -1, -1, withscores=True)
    replies = yield Pipe(pipe.cmds, raise_on_error=False)
    books = yield from make_books_plan(keys, replies, now)
    per_group = replies[BOOK_REPLIES:]
    rest = per_group[len(groups):]
    for i, g in enumerate(groups):
        faults: list[str] = []
        slots = yield from readable_plan(keys.group_busy(g), per_group[i], {}, faults)
        lane = rest[3 * i:3 * i + 3]
        spoilt = [r for r in lane if isinstance(r, Exception)]
        if spoilt:      # the three reads of one key: one line
            lane = [(yield from readable_plan(keys.lane(g), spoilt[0], 0, faults)), [], []]
        set_busy(books, g, keys, slots, faults)
        books["lanes"][g] = tuple(lane)
    return books


def set_busy(books: dict[str, Any], g: str, keys: Any, slots: dict[str, str],
             faults: list[str]) -> None:
    """Fill a group's busy time (its busy hash's 10 s slots) and its ``corrupt`` lines
    (``faults``, and a slot the hash cannot be summed by)."""
    busy = minute_ms(slots, books["now_ms"])
    if busy is None:
        faults.append(f"its busy time ({keys.group_busy(g)}) holds text that is not "
                      "an integer")
    books["busy"][g] = busy or 0
    if faults:
        books["corrupt"][g] = faults


def minute_ms(slots: dict[str, str], now_ms: int) -> int | None:
    """Busy ms over the last minute from a busy hash (10 s slot -> ms): the current slot and
    the five before it; None when an entry is not an integer."""
    if not all(int_ok(slot) and int_ok(ms) for slot, ms in slots.items()):
        return None
    current = now_ms // 10_000
    return sum(int(ms) for slot, ms in slots.items() if current - 6 < int(slot) <= current)


def shares(books: dict[str, Any], g: str, weight: int, pending: int) -> dict[str, Any]:
    """The group's share of the queue's busy time over the last minute (jobs claimed in time
    mode), and in time mode its target share: its weight over the weights of the groups
    competing now (on the time ring, and itself if it has work waiting)."""
    total = books["busy_total"]
    busy = books["busy"][g]
    target = None
    if books["fairness"] == "time" and pending and g not in books["gtenant"]:
        # (a tenant's group: its share of its tenant's, left None here: its tenant's set
        # of groups is not among the books read)
        competing = set(books["gvt"]) | {g}
        weights = sum(_member_weight(books, h) for h in competing)
        target = weight / weights
    return {"busy_s": busy / 1000, "busy_share": busy / total if total else None,
            "target_share": target}


def _member_weight(books: dict[str, Any], m: str) -> int:
    """The weight of a member of time mode's `gvt`: a group's, or a tenant's for its mark."""
    if m.startswith(TENANT_MARK):
        t = m[len(TENANT_MARK):]
        return _int(books["tweight"].get(t, books["tweight"].get(""))) or 1
    return settings.weight(books, m)


def effective_weight(books: dict[str, Any], g: str) -> int:
    """The group's weight (its own, else the default, else 1); 1 when it cannot be read."""
    return settings.weight(books, g)


def oldest_ms(client: Any, lane_key: str, first: list[Any], last: list[Any]) -> int | None:
    """Enqueue time of the lane's oldest waiting job: the head of each priority present."""
    return run(oldest_ms_plan(lane_key, first, last), client)


def oldest_ms_plan(lane_key: str, first: list[Any], last: list[Any]) -> Steps[int | None]:
    """oldest_ms as a plan (store/plan.py)."""
    if not first:
        return None
    low, high = split_score(first[0][1])[0], split_score(last[0][1])[0]
    oldest = split_score(first[0][1])[1]
    prio = low
    while prio < high:   # several priorities wait: look at the head of each (rare)
        nxt = yield cmd("zrangebyscore", lane_key, (prio + 1) * PRIO_SPAN, "+inf",
                        start=0, num=1, withscores=True)
        if not nxt:
            break
        prio, stamp = split_score(nxt[0][1])
        oldest = min(oldest, stamp)
    return oldest


def view(client: Any, keys: Any, g: str, books: dict[str, Any]) -> dict[str, Any]:
    """One group's row of stats()['groups'] (and what App.lane returns)."""
    return run(view_plan(keys, g, books), client)


def view_plan(keys: Any, g: str, books: dict[str, Any]) -> Steps[dict[str, Any]]:
    """view as a plan (store/plan.py)."""
    pending, first, last = books["lanes"][g]
    oldest = yield from oldest_ms_plan(keys.lane(g), first, last)
    return group_row(g, pending, oldest, books)


def book_faults(g: str, books: dict[str, Any]) -> list[str]:
    """Why a claim cannot read the group's books (store/settings.py book_faults, and what
    emqtasks check says), with the shared books of the wrong type and the group's own keys
    that cannot be read: one line each, naming the key; [] for a healthy group."""
    return [*books["shared_faults"], *books["corrupt"].get(g, ()),
            *(fault.line for fault in settings.book_faults(books, g, books["keys"]))]


def _int(text: Any) -> int | None:
    return int(text) if int_ok(text) else None


def tenant_state(books: dict[str, Any], g: str) -> str:
    """A group ready of its own: "ready", or why its tenant holds it back (its pause, its
    limit, its rate; time mode serves the groups flat, no tenant holds one back there)."""
    t = books["gtenant"].get(g)
    if t is None or books["fairness"] == "time":
        return "ready"
    if t in books["tpaused"]:
        return "tenant_paused"
    limit = _int(books["tlimit"].get(t, books["tlimit"].get("")))
    if limit is not None and (_int(books["tactive"].get(t, "0")) or 0) >= limit:
        return "tenant_at_limit"
    if t in books["twait"]:
        return "tenant_rate_limited"
    return "ready"


def group_row(g: str, pending: int, oldest: int | None, books: dict[str, Any]) -> dict[str, Any]:
    """A group's row from the books: its effective settings (and where each comes from), its
    state and why it waits, its oldest job's age, its busy share (``books["busy"][g]``).

    A group whose books a claim cannot read (book_faults) has the state "corrupt" and
    ``corrupt`` says why, one line naming each key (None for a healthy group); what of its
    settings cannot be read shows as unset (a weight as 1, jobs in flight as 0)."""
    faults = book_faults(g, books)
    eff = {f: settings.effective(books, g, f) for f in SETTINGS}
    active = _int(books["gactive"].get(g, "0")) or 0
    limit = _int(eff["limit"].value)
    weight = settings.weight(books, g)
    rate = eff["rate"].value
    waiting_until = books["gwait"].get(g)
    now = books["now_ms"]
    if faults:
        state = "corrupt"
    elif not pending:
        state = "empty"
    elif books["paused"]:
        state = "queue_paused"
    elif g in books["gpaused"]:
        state = "paused"
    elif limit is not None and active >= limit:
        state = "at_limit"
    elif waiting_until is not None:
        state = "rate_limited"
    else:
        state = tenant_state(books, g)
    return {
        "pending": pending, "active": active, "limit": limit,
        "weight": weight, "paused": g in books["gpaused"],
        "tenant": books["gtenant"].get(g),
        # a rate a claim reads as none (not max:per_ms) shows as none
        "rate": parse_rate(rate) if settings.RATE.fullmatch(rate or "") else None,
        "max_size": _int(eff["max_size"].value),
        **{f"{f}_source": None if eff[f].value is None else ("group" if eff[f].own
                                                              else "default")
           for f in ("limit", "rate", "max_size", "weight")},
        "state": state,
        "ready_at": (waiting_until / 1000 if state == "rate_limited" else None),
        "oldest_age": None if oldest is None else max(0.0, (now - oldest) / 1000),
        **shares(books, g, weight, pending),
        "corrupt": "; ".join(faults) if faults else None,
    }


# -- a queue's stats: every group's view ------------------------------------------------------
def stats(queue: Queue) -> dict[str, Any]:
    """Queue totals, and per group its books, effective settings and state (App.stats;
    stats_plan)."""
    return queue.run(stats_plan(queue.keys))


def stats_plan(k: QueueKeys) -> Steps[dict[str, Any]]:
    """Queue totals, and per group its books, effective settings and state. A group whose
    books cannot be read is listed with the state "corrupt" and the reason in its
    ``corrupt``; ``corrupt`` of the queue: its keys of the wrong type (each read as
    empty), one line each. Finds the groups by a SCAN (Queue.groups); the lane table
    (lanetable.py) reads the same without one. A plan (store/plan.py): App.stats runs it
    on the blocking client, App.astats on the async one."""
    groups = sorted((yield from groups_plan(k)))
    books = yield from read_books_plan(k, groups)
    pipe = Recorder()
    for key in (k.delayed, k.dead, k.active):
        pipe.zcard(key)
    pipe.llen(k.ring)
    pipe.zcard(k.gvt)
    queue_marks(pipe, k)
    faults: list[str] = books["faults"]
    replies = yield Pipe(pipe.cmds, raise_on_error=False)
    counts = []
    for key, r in zip((k.delayed, k.dead, k.active, k.ring, k.gvt), replies):
        counts.append((yield from readable_plan(key, r, 0, faults)))
    delayed, dead, active, ring, ring_time = counts
    per_group = {}
    for g in groups:
        per_group[g] = yield from view_plan(k, g, books)
    marks = yield from read_marks_plan(k, replies[5:], books["now_ms"], faults)
    return {
        "queue": k.name, "paused": books["paused"], "fairness": books["fairness"],
        "pending": sum(v["pending"] for v in per_group.values()),
        "active": active, "delayed": delayed, "dead": dead, "ring": ring + ring_time,
        **marks, "corrupt": faults, "groups": per_group,
        "tenants": tenant_rows(per_group, books),
    }


def tenant_rows(per_group: dict[str, dict[str, Any]], books: dict[str, Any]
                ) -> dict[str, dict[str, Any]]:
    """Per tenant (lua/lib/ring.lua): its groups, their waiting jobs and oldest job's age,
    its jobs in flight, its effective limit and weight, whether paused, and its state:
    "empty", "paused", "at_limit", "rate_limited" or "ready" (in time mode its groups are
    served flat)."""
    names = {t for t in (*books["gtenant"].values(), *books["tactive"], *books["tpaused"])
             if t}
    by_tenant: dict[str, list[dict[str, Any]]] = {t: [] for t in names}
    for g, row in per_group.items():   # one pass: linear in groups and tenants
        owner = books["gtenant"].get(g)
        if owner in by_tenant:
            by_tenant[owner].append(row)
    rows: dict[str, dict[str, Any]] = {}
    for t in sorted(names):
        mine = by_tenant[t]
        pending = sum(row["pending"] for row in mine)
        ages = [row["oldest_age"] for row in mine if row["oldest_age"] is not None]
        active = _int(books["tactive"].get(t, "0")) or 0
        limit = _int(books["tlimit"].get(t, books["tlimit"].get("")))
        weight = _int(books["tweight"].get(t, books["tweight"].get(""))) or 1
        paused = t in books["tpaused"]
        state = ("empty" if not pending else "paused" if paused else
                 "at_limit" if limit is not None and active >= limit else
                 "rate_limited" if t in books["twait"] else "ready")
        rows[t] = {"groups": len(mine), "pending": pending, "active": active, "limit": limit,
                   "weight": weight, "paused": paused, "state": state,
                   "oldest_age": max(ages) if ages else None}
    return rows


def lane(queue: Queue, group: str) -> dict[str, Any]:
    """One group's stats() row, read without scanning the queue (App.lane)."""
    g = check_group(group)
    return view(queue.client, queue.keys, g, read_books(queue.client, queue.keys, [g]))


def queue_marks(pipe: Any, keys: QueueKeys) -> None:
    """Queue on a pipeline the reads of what stats() shows beside the books (read_marks)."""
    pipe.hget(keys.tally, "stale_acks")
    pipe.hmget(keys.clock, "seen", "step", "at")


def read_marks(client: Any, keys: QueueKeys, replies: Sequence[Any], now_ms: int,
               faults: list[str]) -> dict[str, Any]:
    """From queue_marks' replies (read_marks_plan)."""
    return run(read_marks_plan(keys, replies, now_ms, faults), client)


def read_marks_plan(keys: QueueKeys, replies: Sequence[Any], now_ms: int,
                    faults: list[str]) -> Steps[dict[str, Any]]:
    """From queue_marks' replies (a pipeline run with ``raise_on_error=False``):
    ``stale_acks`` (acks the fence refused, counted by the server for every worker) and
    ``clock`` (steps of the server's clock, clock.state); a key of the wrong type reads as
    unset and is named in ``faults``."""
    stale = yield from readable_plan(keys.tally, replies[0], None, faults)
    seen, step, at = yield from readable_plan(keys.clock, replies[1], (None, None, None),
                                              faults)
    return {"stale_acks": int_or(stale, 0), "clock": clock.state(now_ms, seen, step, at)}
