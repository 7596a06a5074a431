"""What the dashboard's pages show, computed from the server (no state of its own).

The lanes of a queue are read once a second at most, whatever the number of viewers, by the
lane table (lanetable.py: no SCAN of the keyspace; lua/lanes.lua reads the lanes), then
sorted, filtered and paged here; the 50 rows of a page are read again exactly (lanes.view).
History is read at most every 10 s. Searches of job sets run lua/find.lua on the server
(bounded calls that read the rows there), so a filter over 200,000 dead jobs moves ids,
not rows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from ..errors import TaskFailed
from ..observe import history
from ..observe.lanetable import LaneTable
from ..observe.tenants import shares as tenant_shares
from ..observe.tenants import timeline
from ..observe.tenants import waits as tenant_waits
from ..store.keys import check_job_id
from ..store.queue import Queue, job_view
from ..store.replies import readable
from ..store.settings import int_ok
from ..workflows.canvas import WorkflowHandle
from . import charts

PAGE = 50
#: Lanes sortable by these columns (the query's ``sort``; ``-`` in front: descending).
LANE_SORTS = ("group", "state", "pending", "active", "oldest", "share5", "share60")
JOB_STATES = ("pending", "active", "delayed", "dead")
#: The tenants page's claims share is over this many minutes of history.
TENANT_MINUTES = 5


class Cached:
    """A value recomputed at most every ``ttl`` seconds (shared by every request)."""

    def __init__(self, compute: Callable[[], Any], ttl: float) -> None:
        self.compute, self.ttl = compute, ttl
        self._value: Any = None
        self._at = 0.0
        self._lock = threading.Lock()

    def get(self) -> Any:
        with self._lock:
            if self._value is None or time.monotonic() - self._at >= self.ttl:
                self._value = self.compute()
                self._at = time.monotonic()
            return self._value


class QueueView:
    """One queue as the dashboard reads it."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.table = LaneTable(queue)
        self.stats = Cached(self.table.stats, 1.0)
        self.hour = Cached(lambda: history.report(queue, 60), 10.0)
        self.five = Cached(lambda: history.report(queue, 5), 5.0)
        self.shares = Cached(lambda: tenant_shares(queue, TENANT_MINUTES), 5.0)
        self.hour_shares = Cached(lambda: tenant_shares(queue, 60), 10.0)
        self.tenant_waits = Cached(lambda: tenant_waits(queue), 5.0)

    def overview(self) -> dict[str, Any]:
        stats = self.stats.get()
        hour = self.hour.get()
        minutes = []
        for m in hour["minutes"]:
            minutes.append({"t": m["minute"], "succeeded": m["succeeded"],
                            "retried": m["retried"], "dead": m["dead"],
                            "started": m["started"],
                            "p50": _ms(m["wait_p50_ms"]), "p95": _ms(m["wait_p95_ms"])})
        return {"stats": {k: v for k, v in stats.items() if k != "groups"},
                "groups": len(stats["groups"]), "hour": hour["total"], "minutes": minutes,
                "tasks": hour["tasks"],
                "wait_chart": charts.lines(minutes, ("p50", "p95"), "ms")}

    def lanes(self, sort: str = "-pending", state: str = "", text: str = "",
              page: int = 1) -> dict[str, Any]:
        stats = self.stats.get()
        hour = self.hour.get()
        starts60 = {g: c["started"] for g, c in hour["groups"].items()}
        starts5 = self._recent_starts()
        total5 = self.five.get()["total"]["started"] or 0
        total60 = hour["total"]["started"] or 0
        groups = stats["groups"]
        busy_weight = sum(r["weight"] for r in groups.values() if r["pending"] or r["active"])
        rows = []
        for g, r in groups.items():
            if state and r["state"] != state:
                continue
            if text and text.lower() not in g.lower():
                continue
            busy = r["pending"] or r["active"]
            rows.append({
                "group": g, **r,
                "why": why(r),
                "fair": (r["weight"] / busy_weight) if busy and busy_weight else None,
                "share5": (starts5.get(g, 0) / total5) if total5 else None,
                "share60": (starts60.get(g, 0) / total60) if total60 else None,
                "oldest": r["oldest_age"]})
        key, reverse = sort.lstrip("-"), sort.startswith("-")
        if key not in LANE_SORTS:
            key, reverse = "pending", True
        rows.sort(key=lambda row: (row[key] is None, row[key] if row[key] is not None else 0),
                  reverse=reverse)
        if reverse:   # None last either way
            rows.sort(key=lambda row: row[key] is None)
        pages = page_count(len(rows))
        page = min(max(page, 1), pages)
        shown = rows[(page - 1) * PAGE: page * PAGE]
        exact = self.table.exact([r["group"] for r in shown])
        for r in shown:   # the rows shown, read as `emqtasks lane` reads them
            r.update(exact[r["group"]])
            r["why"], r["oldest"] = why(r), r["oldest_age"]
        return {"rows": shown, "total": len(rows),
                "page": page, "pages": pages, "sort": sort, "state": state, "text": text,
                "paused": stats["paused"], "all": len(groups)}

    def tenants(self, page: int = 1, chart: str = "") -> dict[str, Any]:
        """The tenants page: per tenant (busiest first: waiting, then in flight) its groups,
        backlog, jobs in flight, limit, weight, pause, its claims' share over the last
        TENANT_MINUTES against the share its weight entitles it to, and why it waits; and
        the chart of one tenant's (``chart``, else the busiest) received vs entitled share
        per minute over the last hour."""
        stats = self.stats.get()
        shares = self.shares.get()
        waited = self.tenant_waits.get()
        rows = []
        for t, r in stats["tenants"].items():
            got = shares["tenants"].get(t)
            w = waited.get(t, {}).get("5m", {})
            rows.append({"tenant": t, **r, "why": tenant_why(r, stats["paused"]),
                         "share": got["share"] if got else None,
                         "entitled": got["entitled"] if got else None,
                         "claims": got["claims"] if got else 0,
                         "wait_p50": w.get("p50_ms"), "wait_p95": w.get("p95_ms"),
                         "wait_p99": w.get("p99_ms")})
        rows.sort(key=lambda row: (-row["pending"], -row["active"], row["tenant"]))
        pages = page_count(len(rows))
        page = min(max(page, 1), pages)
        jain = [j for _, j in shares["jain"] if j is not None]
        chosen = chart or (rows[0]["tenant"] if rows else "")
        points = [{"t": p["t"], **{k: None if p[k] is None else round(p[k] * 100, 1)
                                   for k in ("received", "entitled")}}
                  for p in timeline(self.hour_shares.get(), chosen)] if chosen else []
        return {"rows": rows[(page - 1) * PAGE: page * PAGE], "total": len(rows),
                "chart_tenant": chosen, "chart_points": points,
                "chart": charts.lines(points, ("received", "entitled"), "%") if chosen
                else None,
                "page": page, "pages": pages, "minutes": shares["minutes"],
                "jain": jain[-1] if jain else None, "untracked": shares["untracked"]}

    def _recent_starts(self) -> dict[str, int]:
        return {g: c["started"] for g, c in self.five.get()["groups"].items()}


def page_count(n: int) -> int:
    """How many pages n rows fill (one, when there are none)."""
    return max(1, -(-n // PAGE))


def why(row: dict[str, Any]) -> str:
    """A lane's state in words: why its jobs wait (or do not)."""
    state = row["state"]
    if state == "corrupt":
        return f"a claim cannot read its books: {row['corrupt']} (emqtasks check --repair)"
    if state == "empty":
        return "nothing waiting"
    if state == "queue_paused":
        return "the whole queue is paused"
    if state == "paused":
        return "this group is paused"
    if state == "at_limit":
        return f"{row['active']} running, at its limit of {row['limit']}"
    if state == "rate_limited":
        rate = row.get("rate")
        per = f" ({rate[0]} per {rate[1]:g}s)" if rate else ""
        return f"rate limit{per}: next start when its budget allows"
    return "waiting for its turn on the ring"


def tenant_why(row: dict[str, Any], queue_paused: bool = False) -> str:
    """A tenant's state (lanes.tenant_rows) in words, as ``emqtasks tenant`` says it."""
    state = row["state"]
    if state == "empty":
        return "nothing waiting"
    if queue_paused:
        return "the whole queue is paused"
    if state == "paused":
        return "paused (resume_tenant)"
    if state == "at_limit":
        return f"at its limit: {row['active']} of {row['limit']} jobs in flight"
    return "waiting for its turn on the ring of tenants (then its groups' own reasons)"


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


@dataclass
class JobFilter:
    """What a search asks for (lua/find.lua applies it on the server): a state, and an
    exact group and task and a case-insensitive text of the error where given."""

    state: str = "dead"
    group: str = ""
    task: str = ""
    text: str = ""


_KEYS = {"active": "active", "delayed": "delayed", "dead": "dead"}
#: Entries lua/find.lua looks at per call (its work bound on the server).
FIND_CHUNK = 1000


def _set_key(queue: Queue, state: str) -> str:
    return str(getattr(queue.keys, _KEYS[state]))


def _lane_groups(f: JobFilter, groups: list[str] | None) -> list[str]:
    return [f.group] if f.group else sorted(groups or [])


def _plain(f: JobFilter) -> bool:
    return not (f.task or f.text or (f.group and f.state != "pending"))


_FIELDS = ("task", "group", "state", "error", "attempts", "created", "finished")


#: Entries one page of a filtered search looks at, at most: the page costs the server a
#: bounded time whatever the size of the set; the count it shows is then a lower bound.
SEARCH_BUDGET = 50_000


def find_jobs(queue: Queue, f: JobFilter, offset: int = 0, limit: int = PAGE,
              groups: list[str] | None = None) -> tuple[list[dict[str, Any]], int, bool]:
    """(the page of matching jobs, how many match, whether that count is complete).

    Without a filter a page is read by rank and the count is the set's size. With one, the
    server filters (lua/find.lua) until it has the page and one more, or has looked at
    SEARCH_BUDGET entries: then the count is "at least". ``groups``: the queue's groups
    (the lane table's), for pending jobs of every group."""
    c, k = queue.client, queue.keys
    if _plain(f) and f.state != "pending":   # a page of the zset: no row read to count
        key = _set_key(queue, f.state)
        pipe = c.pipeline(transaction=False)
        pipe.zrevrange(key, offset, offset + limit - 1)
        pipe.zcard(key)
        page_ids, size = pipe.execute()
        return _rows(queue, list(page_ids)), int(size), True
    if _plain(f):
        names = _lane_groups(f, groups)
        pipe = c.pipeline(transaction=False)
        for g in names:
            pipe.zcard(k.lane(g))
        # a lane of the wrong type holds no job here (the lanes page says why)
        sizes = [0 if isinstance(n, Exception) else n
                 for n in pipe.execute(raise_on_error=False)]
        ids: list[str] = []
        skip = offset
        for g, size in zip(names, sizes):   # only the lanes the page falls in are read
            if skip >= size:
                skip -= size
                continue
            ids += c.zrange(k.lane(g), skip, skip + limit - len(ids) - 1)
            skip = 0
            if len(ids) >= limit:
                break
        return _rows(queue, ids), sum(int(n) for n in sizes), True
    found, complete = _search(queue, f, groups, offset + limit + 1, SEARCH_BUDGET)
    return _rows(queue, found[offset: offset + limit]), len(found), complete


def _search(queue: Queue, f: JobFilter, groups: list[str] | None, want: float,
            budget: float, bound: str = "") -> tuple[list[str], bool]:
    """Up to ``want`` matching ids, looking at up to ``budget`` entries; and whether the
    set was searched to its end."""
    out: list[str] = []
    looked = 0
    sets = ([("lane", g) for g in _lane_groups(f, groups)] if f.state == "pending"
            else [(f.state, f.group)])
    for which, group in sets:
        rank = 0
        while rank >= 0:
            if len(out) >= want or looked >= budget:
                return out, False
            most = int(min(want - len(out), FIND_CHUNK))
            page = queue.find(which, rank, FIND_CHUNK, most, f.task, group, f.text,
                              "" if which == "lane" else bound)
            rank, looked = page.next_rank, looked + page.looked
            out += page.ids
    return out, True


def matching_ids(queue: Queue, f: JobFilter, groups: list[str] | None = None,
                 bound: str = "") -> list[str]:
    """Every id matching the filter (for the count, and the actions on all that match),
    newest first (pending: lane by lane, in the order their jobs start). ``bound``: only
    entries scored at most this (a dead job's time of death), the snapshot a count showed."""
    return _search(queue, f, groups, float("inf"), float("inf"), bound)[0]


def dead_bound(queue: Queue) -> str:
    """The time of death of the newest dead job: actions on "all that match" touch only
    jobs dead by then, the ones the page counted."""
    newest = queue.client.zrevrange(queue.keys.dead, 0, 0, withscores=True)
    return repr(newest[0][1]) if newest else "-inf"


def cancel_ids(queue: Queue, ids: list[str]) -> int:
    """Cancel these jobs, 500 cancel calls a round trip; how many were cancelled."""
    return queue.cancel_many(ids, 500)


def _read(queue: Queue, ids: list[str]) -> list[dict[str, Any] | None]:
    pipe = queue.client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(queue.keys.job(job_id), *_FIELDS)
    out: list[dict[str, Any] | None] = []
    for job_id, values in zip(ids, pipe.execute(raise_on_error=False)):
        if isinstance(values, Exception):   # a job key of the wrong type: listed, saying so
            faults: list[str] = []
            readable(queue.client, queue.keys.job(job_id), values, None, faults)
            out.append({**dict.fromkeys(_FIELDS), "error": f"corrupt: {faults[0]}, not a hash"})
        elif values[0] is None and values[2] is None:
            out.append(None)
        else:
            out.append(dict(zip(_FIELDS, values)))
    return out


def _rows(queue: Queue, ids: list[str]) -> list[dict[str, Any]]:
    if not ids:
        return []
    return [{"id": i, **row} for i, row in zip(ids, _read(queue, ids)) if row is not None]


def job_detail(queue: Queue, job_id: str) -> dict[str, Any] | None:
    """Queue.job's view and what the job page shows besides, from one read of the row; a
    job key of the wrong type raises CorruptKey (the page says it)."""
    try:
        row = queue.client.hgetall(queue.keys.job(check_job_id(job_id)))
    except ResponseError as exc:
        raise queue.unreadable_row(job_id, exc) from None
    if not row:
        return None
    view = job_view(job_id, row)
    prio, fence = row.get("prio") or "0", row.get("fence") or "0"
    view.update(payload=row.get("payload"), workflow=row.get("wf"),
                # as text when it is not an integer (a row written by hand): shown, not read
                priority=int(prio) if int_ok(prio) else prio,
                fence=int(fence) if int_ok(fence) else fence)
    return view


def workflow_detail(queue: Queue, wf_id: str, page: int) -> dict[str, Any] | None:
    """A workflow's status and one page of its steps: a 10,000-member chord reads PAGE
    step rows, not all of them (its status reads the final steps' states: one row for a
    chain or a chord, every member for a group). None when it is gone."""
    try:
        return WorkflowHandle(queue, check_job_id(wf_id)).info((page - 1) * PAGE, PAGE)
    except TaskFailed:
        return None
