"""What the dashboard's pages show, computed from the server (no state of its own).

The lanes of a queue are read once a second at most, whatever the number of viewers (one
pipelined round trip per refresh: stats()), and sorted, filtered and paged here, so a page
of 50 lanes out of 10,000 costs the browser 50 rows. History is read at most every 10 s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..history import quantile
from ..queue import Queue

PAGE = 50
#: Lanes sortable by these columns (the query's ``sort``; ``-`` in front: descending).
LANE_SORTS = ("group", "state", "pending", "active", "oldest", "share5", "share60")
JOB_STATES = ("pending", "active", "delayed", "dead")
#: Job rows read per round trip while searching.
CHUNK = 1000


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
        self.stats = Cached(queue.stats, 1.0)
        self.hour = Cached(lambda: queue.history(60), 10.0)
        self.five = Cached(lambda: queue.history(5), 5.0)

    def overview(self) -> dict[str, Any]:
        stats = self.stats.get()
        hour = self.hour.get()
        minutes = []
        for m in hour["minutes"]:
            minutes.append({"t": m["minute"], "succeeded": m["succeeded"],
                            "retried": m["retried"], "dead": m["dead"],
                            "started": m["started"],
                            "p50": _ms(quantile(m["wait_buckets"], 0.5)),
                            "p95": _ms(quantile(m["wait_buckets"], 0.95))})
        return {"stats": {k: v for k, v in stats.items() if k != "groups"},
                "groups": len(stats["groups"]), "hour": hour["total"], "minutes": minutes,
                "tasks": hour["tasks"]}

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
        pages = max(1, -(-len(rows) // PAGE))
        page = min(max(page, 1), pages)
        return {"rows": rows[(page - 1) * PAGE: page * PAGE], "total": len(rows),
                "page": page, "pages": pages, "sort": sort, "state": state, "text": text,
                "paused": stats["paused"], "all": len(groups)}

    def _recent_starts(self) -> dict[str, int]:
        return {g: c["started"] for g, c in self.five.get()["groups"].items()}


def why(row: dict[str, Any]) -> str:
    """A lane's state in words: why its jobs wait (or do not)."""
    state = row["state"]
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


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


@dataclass
class JobFilter:
    state: str = "dead"
    group: str = ""
    task: str = ""
    text: str = ""

    def matches(self, row: dict[str, Any]) -> bool:
        if self.group and row.get("group") != self.group:
            return False
        if self.task and row.get("task") != self.task:
            return False
        return not self.text or self.text.lower() in (row.get("error") or "").lower()


def _ids(queue: Queue, f: JobFilter) -> Iterator[list[str]]:
    """The ids of a state, newest first (pending: a group's lane, oldest first), in chunks."""
    k = queue.keys
    c = queue.client
    if f.state == "pending":
        groups = [f.group] if f.group else sorted(queue.groups())
        for g in groups:
            start = 0
            while True:
                chunk = c.zrange(k.lane(g), start, start + CHUNK - 1)
                if not chunk:
                    break
                yield chunk
                start += CHUNK
        return
    key = {"active": k.active, "delayed": k.delayed, "dead": k.dead}[f.state]
    start = 0
    while True:
        chunk = c.zrevrange(key, start, start + CHUNK - 1)
        if not chunk:
            return
        yield chunk
        start += CHUNK


_FIELDS = ("task", "group", "state", "error", "attempts", "created", "finished")


def find_jobs(queue: Queue, f: JobFilter, offset: int = 0,
              limit: int = PAGE) -> tuple[list[dict[str, Any]], int]:
    """(the page of matching jobs, how many match in all)."""
    rows: list[dict[str, Any]] = []
    matched = 0
    plain = not (f.task or f.text or (f.group and f.state != "pending"))
    if plain and f.state != "pending":   # a page of the zset: no row read to count
        return _rows(queue, _page_ids(queue, f, offset, limit)), _count(queue, f)
    if plain:
        ids: list[str] = []
        for chunk in _ids(queue, f):
            ids += chunk
            if len(ids) >= offset + limit:
                break
        return _rows(queue, ids[offset: offset + limit]), _count(queue, f)
    for chunk in _ids(queue, f):
        for job_id, row in zip(chunk, _read(queue, chunk)):
            if row is None or not f.matches(row):
                continue
            if offset <= matched < offset + limit:
                rows.append({"id": job_id, **row})
            matched += 1
    return rows, matched


def _page_ids(queue: Queue, f: JobFilter, offset: int, limit: int) -> list[str]:
    key = {"active": queue.keys.active, "delayed": queue.keys.delayed,
           "dead": queue.keys.dead}[f.state]
    return list(queue.client.zrevrange(key, offset, offset + limit - 1))


def _count(queue: Queue, f: JobFilter) -> int:
    k = queue.keys
    if f.state == "pending":
        groups = [f.group] if f.group else sorted(queue.groups())
        pipe = queue.client.pipeline(transaction=False)
        for g in groups:
            pipe.zcard(k.lane(g))
        return sum(pipe.execute())
    return int(queue.client.zcard({"active": k.active, "delayed": k.delayed,
                                   "dead": k.dead}[f.state]))


def _read(queue: Queue, ids: list[str]) -> list[dict[str, Any] | None]:
    pipe = queue.client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(queue.keys.job(job_id), *_FIELDS)
    out: list[dict[str, Any] | None] = []
    for values in pipe.execute():
        if values[0] is None and values[2] is None:
            out.append(None)
        else:
            out.append(dict(zip(_FIELDS, values)))
    return out


def _rows(queue: Queue, ids: list[str]) -> list[dict[str, Any]]:
    return [{"id": i, **row} for i, row in zip(ids, _read(queue, ids)) if row is not None]


def matching_ids(queue: Queue, f: JobFilter) -> list[str]:
    """Every id matching the filter (for the actions on all that match)."""
    out: list[str] = []
    for chunk in _ids(queue, f):
        if not (f.task or f.text or f.group):
            out += chunk
            continue
        for job_id, row in zip(chunk, _read(queue, chunk)):
            if row is not None and f.matches(row):
                out.append(job_id)
    return out


def job_detail(queue: Queue, job_id: str) -> dict[str, Any] | None:
    view = queue.job(job_id)
    if view is None:
        return None
    payload, prio, fence, origin = queue.client.hmget(queue.keys.job(job_id), "payload",
                                                      "prio", "fence", "origin")
    view.update(payload=payload, priority=int(prio or 0), fence=int(fence or 0))
    return view
