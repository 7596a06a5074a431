"""Every lane of a queue in one cheap read: the dashboard's and /metrics' view of 10,000 groups.

``lanes.stats()`` finds the groups by a SCAN of the keyspace (every job row included: with
200,000 dead jobs that is 200,000 keys a call) and reads three commands per group. The lane
table lists the same groups (store/groups.py) from the structures that name them -- an open
group with jobs is on the ring (``ring``, or ``gvt`` in time mode) or in ``gwait``, a closed
one is paused (``gpaused``) or at its limit (``gactive``), a configured one is in its
settings' hashes -- with a SCAN of the lanes at most every ``SCAN_EVERY`` seconds for a lane
that a fault left outside them. Per group it
reads two commands (ZCARD and the lane's head), run on the server by lua/lanes.lua
LANES_CHUNK groups a call.

Each row has the keys of a ``stats()["groups"]`` row (lanes.view); ``oldest_age`` is the
age of the lane's head, which is its oldest job unless several priorities wait (then the
head is the lowest priority's oldest): ``exact()`` reads given rows as lanes.view does.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from redis.exceptions import ResponseError

from ..store.groups import group_names
from ..store.queue import LANES_CHUNK, Queue
from . import lanes
from .lanes import queue_marks, read_marks, split_score

SCAN_EVERY = 60.0


class LaneTable:
    """The lane table of one queue; keeps the periodic lane SCAN between reads."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self._scanned: set[str] = set()
        self._scanned_at = float("-inf")
        self._lock = threading.Lock()

    def _lanes_seen(self) -> set[str]:
        with self._lock:
            if time.monotonic() - self._scanned_at > SCAN_EVERY:
                k = self.queue.keys
                self._scanned = {k.group_of_lane(key) for key in self.queue.scan(k.lane_pattern)}
                self._scanned_at = time.monotonic()
            return set(self._scanned)

    def stats(self) -> dict[str, Any]:
        """What ``lanes.stats()`` returns, read without a SCAN per call."""
        q = self.queue
        k, c = q.keys, q.client
        pipe = c.pipeline(transaction=False)
        lanes.queue_books(pipe, k)
        pipe.lrange(k.ring, 0, -1)
        pipe.hgetall(k.gbackoff)
        for key in (k.delayed, k.dead, k.active):
            pipe.zcard(key)
        queue_marks(pipe, k)
        shared = pipe.execute(raise_on_error=False)
        books = lanes.make_books(c, k, shared, lanes.server_ms(c, k))
        faults: list[str] = books["faults"]
        ring, gbackoff, delayed, dead, active = (
            lanes.readable(c, key, r, empty, faults) for key, r, empty in zip(
                (k.ring, k.gbackoff, k.delayed, k.dead, k.active),
                shared[lanes.BOOK_REPLIES:], ([], {}, 0, 0, 0)))
        marks = shared[lanes.BOOK_REPLIES + 5:]
        names = sorted(group_names(self._lanes_seen(),
                                   {**books, "ring": ring, "gbackoff": gbackoff}))
        lane: dict[str, tuple[int, int | None]] = {}
        for i in range(0, len(names), LANES_CHUNK):
            lane.update(self._chunk(books, names[i:i + LANES_CHUNK]))
        mode, paused, gvt = books["fairness"], books["paused"], books["gvt"]
        groups = {g: lanes.group_row(g, *lane[g], books) for g in names}
        return {"queue": q.name, "paused": bool(paused), "fairness": mode,
                "pending": sum(r["pending"] for r in groups.values()),
                "active": int(active), "delayed": int(delayed), "dead": int(dead),
                "ring": len(ring) + len(gvt),
                **read_marks(c, k, marks, books["now_ms"], faults), "corrupt": faults,
                "groups": groups, "tenants": lanes.tenant_rows(groups, books)}

    def _chunk(self, books: dict[str, Any],
               names: list[str]) -> dict[str, tuple[int, int | None]]:
        """lua/lanes.lua on these groups: each one's backlog and the enqueue time of its
        lane's head (returned), and its busy time (into ``books["busy"]``). A key
        it cannot read fails the call: then these groups are read as lanes.read_books
        does, which names the key in the group's ``corrupt`` (a fault's rare path)."""
        q = self.queue
        out: dict[str, tuple[int, int | None]] = {}
        try:
            heads = q.lane_heads(names)
        except ResponseError:
            exact = lanes.read_books(q.client, q.keys, names)
            for g in names:
                pending, first, _last = exact["lanes"][g]
                books["busy"][g] = exact["busy"][g]
                if g in exact["corrupt"]:
                    books["corrupt"][g] = exact["corrupt"][g]
                out[g] = (pending, split_score(first[0][1])[1] if first else None)
            return out
        for g, h in zip(names, heads):
            books["busy"][g] = h.busy_ms
            out[g] = (h.pending, None if h.head_score is None else split_score(h.head_score)[1])
        return out

    def exact(self, names: list[str]) -> dict[str, dict[str, Any]]:
        """These groups' rows as lanes.view reads them (oldest job across priorities)."""
        if not names:
            return {}
        q = self.queue
        books = lanes.read_books(q.client, q.keys, names)
        return {g: lanes.view(q.client, q.keys, g, books) for g in names}


