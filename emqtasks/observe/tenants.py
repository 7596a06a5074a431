"""Fairness between tenants as the history saw it: each tenant's claims over the last
minutes against the share its weight entitles it to, and Jain's fairness index per minute.

From the per-minute counters the verbs already keep (store/minutes.py: per group its starts
a minute, for up to ``hgroups`` groups a minute; the rest are counted together and cannot
be told apart: ``untracked``). A group is counted for its tenant of now (a group with none
is its own tenant, named by the group); the tenants "served" in a window are those that
started a job in it, and one's entitled share is its weight over theirs (H-FSC's share of
the backlogged classes, seen from the claims: a tenant backlogged but never served in the
window would not count, so the figure flatters a starved tenant — the flood measurements
of tests/test_tenants.py assert the claims themselves).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..store import minutes as history
from ..store.queue import Queue


def jain(xs: list[float]) -> float | None:
    """Jain's fairness index: 1 when every x is equal, 1/n when one takes all."""
    if not xs or not any(xs):
        return None
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def shares(queue: Queue, minutes: int = 5) -> dict[str, Any]:
    """Per tenant over the last ``minutes``: its claims, its share of them and the share
    it is entitled to; ``jain``: per minute (oldest first) the index of the served tenants'
    claims over their weights; ``untracked``: claims of groups past the history's cap."""
    k, c = queue.keys, queue.client
    rows = history.read(c, k, minutes)
    pipe = c.pipeline(transaction=False)
    pipe.hgetall(k.gtenant)
    pipe.hgetall(k.tweight)
    owner, weights = pipe.execute()
    default = int(weights.get("", 1))

    def weight(t: str) -> int:
        return int(weights.get(t, default)) if t in set(owner.values()) else 1

    per_minute: list[Counter[str]] = []
    for m in rows:
        served: Counter[str] = Counter()
        for g, counts in m.groups.items():
            if counts.started:
                served[owner.get(g, g)] += counts.started
        per_minute.append(served)
    total: Counter[str] = sum(per_minute, Counter())
    claims = sum(total.values())
    weight_sum = sum(weight(t) for t in total) or 1
    return {
        "minutes": minutes,
        "tenants": {t: {"claims": n, "share": n / claims, "entitled": weight(t) / weight_sum}
                    for t, n in sorted(total.items())},
        "jain": [(m.minute, jain([n / weight(t) for t, n in served.items()]))
                 for m, served in zip(rows, per_minute)],
        "untracked": sum(m.other.started for m in rows),
    }
