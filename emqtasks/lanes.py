"""Why is this lane waiting? One group's view: its books, its effective settings (its own or
the defaults for every group) and the state that says what holds it back."""

from __future__ import annotations

from typing import Any

from .store.cluster import node_kwargs
from .store.keys import PRIO_SPAN

DEFAULT_FIELDS = ("limit", "rate", "max_size", "weight")
STATES = ("ready", "empty", "paused", "queue_paused", "at_limit", "rate_limited")


def parse_rate(text: str | None) -> tuple[int, float] | None:
    """"max:per_ms" as stored -> (max_jobs, per seconds)."""
    if not text:
        return None
    count, per_ms = text.split(":")
    return int(count), int(per_ms) / 1000


def split_score(score: float) -> tuple[int, int]:
    """A lane score -> (priority, enqueue time ms)."""
    prio = round(score / PRIO_SPAN)
    return prio, int(score - prio * PRIO_SPAN)


_BOOK_HASHES = ("gactive", "glimit", "gweight", "grate", "gmax", "gdefaults")
#: How many replies queue_books adds to a pipeline.
BOOK_REPLIES = len(_BOOK_HASHES) + 6


def queue_books(pipe: Any, keys: Any) -> None:
    """Queue on a pipeline the reads every view of groups shares (BOOK_REPLIES replies,
    for make_books)."""
    for name in _BOOK_HASHES:
        pipe.hgetall(getattr(keys, name))
    pipe.smembers(keys.gpaused)
    pipe.exists(keys.paused)
    pipe.zrange(keys.gwait, 0, -1, withscores=True)
    pipe.get(keys.fairness)
    pipe.zrange(keys.gvt, 0, -1)
    pipe.hgetall(keys.busy)


def make_books(replies: list[Any], now: int) -> dict[str, Any]:
    """The books from queue_books' replies and the server's time (ms); ``lanes`` and
    ``busy`` per group are the caller's to fill."""
    n = len(_BOOK_HASHES)
    books: dict[str, Any] = dict(zip(_BOOK_HASHES, replies[0:n]))
    gpaused, paused, gwait, fairness, gvt, busy = replies[n:n + 6]
    books.update(now_ms=now, gpaused=gpaused, paused=bool(paused), gwait=dict(gwait),
                 lanes={}, fairness="time" if fairness == "time" else "turns", gvt=gvt,
                 busy_total=minute_ms(busy, now), busy={})
    return books


def server_ms(client: Any, keys: Any) -> int:
    """The server's clock (ready_at and oldest_age are server times); on a cluster, the
    clock of the node that holds the queue (a cluster pipeline refuses TIME)."""
    secs, micros = client.time(**node_kwargs(client, keys.ring))
    return int(secs) * 1000 + int(micros) // 1000


def read_books(client: Any, keys: Any, groups: list[str]) -> dict[str, Any]:
    """Everything the views of these groups need, in one pipelined round trip."""
    now = server_ms(client, keys)
    pipe = client.pipeline(transaction=False)
    queue_books(pipe, keys)
    for g in groups:
        pipe.hgetall(keys.group_busy(g))
    for g in groups:
        pipe.zcard(keys.lane(g))
        pipe.zrange(keys.lane(g), 0, 0, withscores=True)
        pipe.zrange(keys.lane(g), -1, -1, withscores=True)
    replies = pipe.execute()
    books = make_books(replies, now)
    per_group = replies[BOOK_REPLIES:]
    rest = per_group[len(groups):]
    for i, g in enumerate(groups):
        books["busy"][g] = minute_ms(per_group[i], now)
        books["lanes"][g] = (rest[3 * i], rest[3 * i + 1], rest[3 * i + 2])
    return books


def minute_ms(slots: dict[str, str], now_ms: int) -> int:
    """Busy ms over the last minute from a busy hash (10 s slot -> ms): the current slot and
    the five before it."""
    current = now_ms // 10_000
    return sum(int(ms) for slot, ms in slots.items() if current - 6 < int(slot) <= current)


def shares(books: dict[str, Any], g: str, weight: int, pending: int) -> dict[str, Any]:
    """The group's share of the queue's busy time over the last minute (jobs claimed in time
    mode), and in time mode its target share: its weight over the weights of the groups
    competing now (on the time ring, and itself if it has work waiting)."""
    total = books["busy_total"]
    busy = books["busy"][g]
    target = None
    if books["fairness"] == "time" and pending:
        competing = set(books["gvt"]) | {g}
        weights = sum(effective_weight(books, h) for h in competing)
        target = weight / weights
    return {"busy_s": busy / 1000, "busy_share": busy / total if total else None,
            "target_share": target}


def effective_weight(books: dict[str, Any], g: str) -> int:
    own = books["gweight"].get(g)
    return int(own if own is not None else books["gdefaults"].get("weight") or 1)


def oldest_ms(client: Any, lane_key: str, first: list[Any], last: list[Any]) -> int | None:
    """Enqueue time of the lane's oldest waiting job: the head of each priority present."""
    if not first:
        return None
    low, high = split_score(first[0][1])[0], split_score(last[0][1])[0]
    oldest = split_score(first[0][1])[1]
    prio = low
    while prio < high:   # several priorities wait: look at the head of each (rare)
        nxt = client.zrangebyscore(lane_key, (prio + 1) * PRIO_SPAN, "+inf",
                                   start=0, num=1, withscores=True)
        if not nxt:
            break
        prio, stamp = split_score(nxt[0][1])
        oldest = min(oldest, stamp)
    return oldest


def view(client: Any, keys: Any, g: str, books: dict[str, Any]) -> dict[str, Any]:
    """One group's row of stats()['groups'] (and what App.lane returns)."""
    pending, first, last = books["lanes"][g]
    return group_row(g, pending, oldest_ms(client, keys.lane(g), first, last), books)


def group_row(g: str, pending: int, oldest: int | None, books: dict[str, Any]) -> dict[str, Any]:
    """A group's row from the books: its effective settings (and where each comes from), its
    state and why it waits, its oldest job's age, its busy share (``books["busy"][g]``)."""
    defaults = books["gdefaults"]
    own = {"limit": books["glimit"].get(g), "rate": books["grate"].get(g),
           "max_size": books["gmax"].get(g), "weight": books["gweight"].get(g)}
    eff = {f: own[f] if own[f] is not None else defaults.get(f) for f in DEFAULT_FIELDS}
    active = int(books["gactive"].get(g, 0))
    limit = int(eff["limit"]) if eff["limit"] is not None else None
    waiting_until = books["gwait"].get(g)
    now = books["now_ms"]
    if not pending:
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
        state = "ready"
    return {
        "pending": pending, "active": active, "limit": limit,
        "weight": int(eff["weight"] or 1), "paused": g in books["gpaused"],
        "rate": parse_rate(eff["rate"]),
        "max_size": int(eff["max_size"]) if eff["max_size"] is not None else None,
        **{f"{f}_source": None if eff[f] is None else ("group" if own[f] is not None
                                                        else "default")
           for f in ("limit", "rate", "max_size", "weight")},
        "state": state,
        "ready_at": (waiting_until / 1000 if state == "rate_limited" else None),
        "oldest_age": None if oldest is None else max(0.0, (now - oldest) / 1000),
        **shares(books, g, int(eff["weight"] or 1), pending),
    }
