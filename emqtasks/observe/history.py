"""History kept in the server, read back: summaries of the per-minute counters the verbs keep.

The rows and their decoding are the store's (store/minutes.py: one hash a minute per queue,
counted by the verbs, expiring after the retention, App.set_history); this module sums them
over minutes, tasks and groups, and reads the wait time quantiles off the histograms.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..store.minutes import (
    BUCKETS_MS,
    DEFAULT_HOURS,
    DEFAULT_MAX_GROUPS,
    MAX_HOURS,
    NBUCKETS,
    Counts,
    Minute,
    parse,
)

if TYPE_CHECKING:
    from ..store.queue import Queue

__all__ = ["BUCKETS_MS", "DEFAULT_HOURS", "DEFAULT_MAX_GROUPS", "MAX_HOURS", "NBUCKETS",
           "OUTCOMES", "Counts", "Minute", "counts_dict", "parse", "quantile", "queue_total",
           "report", "summary"]

OUTCOMES = ("succeeded", "retried", "dead")


def counts_dict(c: Counts) -> dict[str, Any]:
    """A scope's counters as the views show them, with the wait time's p50 and p95."""
    return {"enqueued": c.enqueued, "started": c.started,
            "succeeded": c.succeeded, "retried": c.retried, "dead": c.dead,
            "wait_ms_sum": c.wait_ms, "run_ms_sum": c.run_ms,
            "wait_buckets": list(c.wait_buckets), "run_buckets": list(c.run_buckets),
            "wait_p50_ms": quantile(c.wait_buckets, 0.5),
            "wait_p95_ms": quantile(c.wait_buckets, 0.95)}


def quantile(buckets: list[int], q: float) -> float | None:
    """The q-quantile (ms) of a histogram, interpolated within its bucket; None if empty."""
    total = sum(buckets)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(buckets):
        if n and seen + n >= rank:
            low = 0 if i == 0 else BUCKETS_MS[i - 1]
            high = BUCKETS_MS[i] if i < len(BUCKETS_MS) else BUCKETS_MS[-1] * 2
            return float(low + (high - low) * max(0.0, rank - seen) / n)
        seen += n
    return float(BUCKETS_MS[-1])


def minute_total(m: Minute) -> Counts:
    """One minute's queue totals."""
    return queue_total(m.tasks, m.groups, m.other)


def queue_total(tasks: dict[str, Counts], groups: dict[str, Counts], other: Counts) -> Counts:
    """The queue's: the tasks' counters, with enqueued from the groups (tasks have none)."""
    out = Counts()
    for c in tasks.values():
        out.add(c)
    out.enqueued = sum(g.enqueued for g in groups.values()) + other.enqueued
    return out


def report(queue: Queue, minutes: int = 60, end: int | None = None) -> dict[str, Any]:
    """The last ``minutes`` minutes of counters of a queue (summary), up to the unix minute
    ``end`` (default: the server's current minute), with its history settings."""
    rows = queue.minutes(minutes, end)
    hours, cap = queue.history_settings()
    return {"queue": queue.name, "retention_hours": hours, "max_groups": cap,
            **summary(rows)}


def summary(rows: Iterable[Minute]) -> dict[str, Any]:
    """Per minute totals, and per task and per group over all of them."""
    per_minute: list[dict[str, Any]] = []
    tasks: dict[str, Counts] = {}
    groups: dict[str, Counts] = {}
    other = Counts()
    for m in rows:
        t = minute_total(m)
        per_minute.append({"minute": m.minute * 60, **counts_dict(t)})
        for name, c in m.tasks.items():
            tasks.setdefault(name, Counts()).add(c)
        for name, c in m.groups.items():
            groups.setdefault(name, Counts()).add(c)
        other.add(m.other)
    return {"minutes": per_minute, "total": counts_dict(queue_total(tasks, groups, other)),
            "tasks": {k: counts_dict(v) for k, v in sorted(tasks.items())},
            "groups": {k: _group_dict(v) for k, v in sorted(groups.items())},
            "other_groups": _group_dict(other)}


def _group_dict(c: Counts) -> dict[str, Any]:
    return {"enqueued": c.enqueued, "started": c.started, "succeeded": c.succeeded,
            "retried": c.retried, "dead": c.dead}
