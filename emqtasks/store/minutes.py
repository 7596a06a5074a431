"""The per-minute counters the hot verbs keep, decoded: one hash a minute per queue.

The verbs (lua/lib/history.lua ``hist_*``, and their native twins) count into
``QueueKeys.minute(m)``, expiring after the retention (``Queue.set_history``). Per task:
``w<i>:<task>`` the wait time (start - due) histogram (its sum: the starts), ``ws:<task>``
its sum (ms), ``r<i>:<task>`` the run time histogram of the successes (its sum: the
successes), ``rs:<task>`` its sum, ``rt:<task>`` retried, ``dd:<task>`` dead. Per group two
packed fields, ``a:<g>`` = enqueued + started * 2^32 and ``b:<g>`` = succeeded + retried *
2^32 + dead * 2^48; ``oa`` / ``ob`` the same for the groups past the minute's cap, ``na`` /
``nb`` how many groups have a field of that kind. Buckets' upper bounds are BUCKETS_MS,
bucket 16 the rest. The read models on top (summaries, quantiles) are history.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..validate import integer
from .cluster import node_kwargs
from .keys import QueueKeys

#: Upper bounds (ms) of the wait and run time histograms' buckets; one more holds the rest.
BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000,
              1800000)
NBUCKETS = len(BUCKETS_MS) + 1
#: The retention and the groups tracked a minute when the queue has none set (gdefaults
#: ``history`` and ``hgroups``, lua/lib/history.lua).
DEFAULT_HOURS = 24
DEFAULT_MAX_GROUPS = 1000
MAX_HOURS = 24 * 31


@dataclass
class Counts:
    """Counters of one scope (a task, a group, a minute, the queue) over some minutes."""

    enqueued: int = 0
    started: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    wait_ms: int = 0                   # sum of the wait times of the starts
    run_ms: int = 0                    # sum of the run times of the successes
    wait_buckets: list[int] = field(default_factory=lambda: [0] * NBUCKETS)
    run_buckets: list[int] = field(default_factory=lambda: [0] * NBUCKETS)

    def add(self, other: Counts) -> None:
        for name in ("enqueued", "started", "succeeded", "retried", "dead", "wait_ms",
                     "run_ms"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.wait_buckets = [a + b for a, b in zip(self.wait_buckets, other.wait_buckets)]
        self.run_buckets = [a + b for a, b in zip(self.run_buckets, other.run_buckets)]


@dataclass
class Minute:
    """One minute's counters: per task, per group, and the groups past the cap. Tasks count
    no enqueues (the groups do)."""

    minute: int                        # unix minute (the bucket's start is minute * 60 s)
    tasks: dict[str, Counts] = field(default_factory=dict)
    groups: dict[str, Counts] = field(default_factory=dict)
    other: Counts = field(default_factory=Counts)
    #: per tenant its wait histogram (tw<i>:<tenant>, lua/lib/history.lua htenant)
    tenant_waits: dict[str, list[int]] = field(default_factory=dict)


def parse(minute: int, raw: dict[str, str]) -> Minute:
    """A minute's hash (decoded) as counters."""
    m = Minute(minute)
    for f, v in raw.items():
        counter, sep, name = f.partition(":")
        try:
            n = int(v)
        except ValueError:
            continue
        if not sep:
            if counter in ("oa", "ob"):
                _unpack(m.other, counter[1], n)
            continue
        if counter in ("a", "b"):
            _unpack(m.groups.setdefault(name, Counts()), counter, n)
            continue
        if counter == "tn":
            continue
        if counter[:2] == "tw" and counter[2:].isdigit():
            i = int(counter[2:]) - 1
            if 0 <= i < NBUCKETS:
                m.tenant_waits.setdefault(name, [0] * NBUCKETS)[i] += n
            continue
        c = m.tasks.setdefault(name, Counts())
        if counter == "ws":
            c.wait_ms += n
        elif counter == "rs":
            c.run_ms += n
        elif counter == "rt":
            c.retried += n
        elif counter == "dd":
            c.dead += n
        elif counter[:1] in ("w", "r") and counter[1:].isdigit():
            i = int(counter[1:]) - 1
            if 0 <= i < NBUCKETS:
                (c.wait_buckets if counter[0] == "w" else c.run_buckets)[i] += n
    # A task's starts are its wait histogram's sum, its successes its run histogram's.
    for c in m.tasks.values():
        c.started = sum(c.wait_buckets)
        c.succeeded = sum(c.run_buckets)
    return m


def _unpack(c: Counts, kind: str, n: int) -> None:
    if kind == "a":
        c.enqueued += n & 0xFFFFFFFF
        c.started += n >> 32
    else:
        c.succeeded += n & 0xFFFFFFFF
        c.retried += (n >> 32) & 0xFFFF
        c.dead += n >> 48


def server_minute(client: Any, keys: QueueKeys) -> int:
    """The server's current unix minute (on a cluster, the clock of the queue's node)."""
    secs, _ = client.time(**node_kwargs(client, keys.ring))
    return int(secs) // 60


def read(client: Any, keys: QueueKeys, minutes: int, end: int | None = None) -> list[Minute]:
    """The last ``minutes`` minutes up to ``end`` (unix minute; default: the server's now),
    oldest first, missing minutes as zeros."""
    minutes = integer(minutes, "minutes", 1, MAX_HOURS * 60)
    end = server_minute(client, keys) if end is None else end
    span = list(range(end - minutes + 1, end + 1))
    pipe = client.pipeline(transaction=False)
    for m in span:
        pipe.hgetall(keys.minute(m))
    return [parse(m, _decoded(raw)) for m, raw in zip(span, pipe.execute())]


def _decoded(raw: dict[Any, Any]) -> dict[str, str]:
    if raw and isinstance(next(iter(raw)), bytes):
        return {k.decode("utf-8", "replace"): v.decode() for k, v in raw.items()}
    return dict(raw)
