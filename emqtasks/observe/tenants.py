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
from .history import quantile

#: The windows of waits(): minutes back from the server's current one (included).
WAIT_WINDOWS = (1, 5, 60)


def jain(xs: list[float]) -> float | None:
    """Jain's fairness index: 1 when every x is equal, 1/n when one takes all."""
    if not xs or not any(xs):
        return None
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def shares(queue: Queue, minutes: int = 5) -> dict[str, Any]:
    """Per tenant over the last ``minutes``: its claims, its share of them and the share
    it is entitled to; ``jain``: per minute (oldest first) the index of the served tenants'
    claims over their weights; ``untracked``: claims of groups past the history's cap;
    ``per_minute``: per minute (oldest first) its start and each served tenant's claims
    and entitled share that minute."""
    k, c = queue.keys, queue.client
    rows = history.read(c, k, minutes)
    pipe = c.pipeline(transaction=False)
    pipe.hgetall(k.gtenant)
    pipe.hgetall(k.tweight)
    owner, weights = pipe.execute()
    default = int(weights.get("", 1))
    named = set(owner.values())

    def weight(t: str) -> int:
        return int(weights.get(t, default)) if t in named else 1

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
        "per_minute": [(m.minute, {t: (n, weight(t) / sum(weight(u) for u in served))
                                   for t, n in served.items()})
                       for m, served in zip(rows, per_minute)],
    }


def timeline(shares_read: dict[str, Any], tenant: str) -> list[dict[str, Any]]:
    """From shares(): per minute (oldest first) the tenant's share of that minute's claims
    (``received``) and the share its weight entitled it to among the tenants served that
    minute (``entitled``), both None in a minute it was not served (then nothing says
    it was backlogged: see the module's note)."""
    out = []
    for minute, served in shares_read["per_minute"]:
        total = sum(n for n, _ in served.values())
        mine = served.get(tenant)
        out.append({"t": minute,
                    "received": mine[0] / total if mine else None,
                    "entitled": mine[1] if mine else None})
    return out


def waits(queue: Queue, tenants: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Per tenant (all those with a histogram in the last hour, or ``tenants``): its wait
    time (start - due, ms) p50 / p95 / p99 and its starts over the last 1, 5 and 60
    minutes, keyed "1m", "5m", "60m" (None quantiles when it started nothing there).

    From the history's per-tenant wait histograms (tw<i>:<tenant>, one HINCRBY per claim of
    a tenant's job, lua/lib/history.lua): the history kept per group counts starts but no
    waits, so a tenant's cannot be summed from its groups'. A group without a tenant has no
    such histogram (its task's wait histograms hold its waits); a tenant past the history's
    cap of tenants in a minute (``hgroups``) has none that minute."""
    rows = history.read(queue.client, queue.keys, max(WAIT_WINDOWS))
    names = set(tenants) if tenants is not None else {
        t for m in rows for t in m.tenant_waits}
    out: dict[str, dict[str, Any]] = {}
    for t in sorted(names):
        per: dict[str, Any] = {}
        for w in WAIT_WINDOWS:
            buckets = [0] * history.NBUCKETS
            for m in rows[-w:]:
                for i, n in enumerate(m.tenant_waits.get(t, ())):
                    buckets[i] += n
            per[f"{w}m"] = {"starts": sum(buckets), "p50_ms": quantile(buckets, 0.5),
                            "p95_ms": quantile(buckets, 0.95),
                            "p99_ms": quantile(buckets, 0.99)}
        out[t] = per
    return out


def tenant_view(queue: Queue, tenant: str) -> dict[str, Any]:
    """Queue.tenant (its groups, backlog, controls, why it waits) with ``wait``: its wait
    percentiles over the last 1, 5 and 60 minutes (waits()), and ``oldest_age``: the age
    (s) of its oldest waiting job, the oldest of its groups' (None when none waits)."""
    from .lanes import lane

    info = queue.tenant(tenant)
    info["wait"] = waits(queue, [info["tenant"]])[info["tenant"]]
    ages = [lane(queue, g)["oldest_age"] for g, n in info["groups"].items() if n]
    ages = [a for a in ages if a is not None]
    info["oldest_age"] = max(ages) if ages else None
    return info


def with_waits(queue: Queue, stats: dict[str, Any]) -> dict[str, Any]:
    """stats() with each tenant's row given its ``wait`` (waits())."""
    got = waits(queue, list(stats["tenants"]))
    for t, row in stats["tenants"].items():
        row["wait"] = got[t]
    return stats
