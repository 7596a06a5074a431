"""Why is this lane waiting? One group's view: its books, its effective settings (its own or
the defaults for every group) and the state that says what holds it back."""

from __future__ import annotations

import re
from typing import Any

from ..store.cluster import node_kwargs
from ..store.keys import PRIO_SPAN

DEFAULT_FIELDS = ("limit", "rate", "max_size", "weight")
STATES = ("ready", "empty", "paused", "queue_paused", "at_limit", "rate_limited", "corrupt")


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
#: The other shared books: (name in QueueKeys, what a missing or unreadable key reads as).
_BOOK_OTHERS: tuple[tuple[str, Any], ...] = (("gpaused", set()), ("paused", 0), ("gwait", []),
                                             ("fairness", None), ("gvt", []), ("busy", {}))
#: How many replies queue_books adds to a pipeline.
BOOK_REPLIES = len(_BOOK_HASHES) + len(_BOOK_OTHERS)
_INT = re.compile(r"0|-?[1-9][0-9]{0,14}")


def int_ok(value: str | None) -> bool:
    """Integer text as every writer stores it (lua/lib/core.lua int_ok)."""
    return value is not None and _INT.fullmatch(value) is not None


def readable(client: Any, key: str, reply: Any, empty: Any, faults: list[str]) -> Any:
    """A reply of a pipeline run with ``raise_on_error=False``: a key of the wrong type reads
    as ``empty`` and adds one line naming it to ``faults`` (a view shows what it can of a
    queue a producer-ACL user spoilt, never a raw WRONGTYPE); any other error is raised."""
    if not isinstance(reply, Exception):
        return reply
    if not str(reply).startswith("WRONGTYPE"):
        raise reply
    faults.append(f"{key} holds a {client.type(key)}")
    return empty


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


def make_books(client: Any, keys: Any, replies: list[Any], now: int) -> dict[str, Any]:
    """The books from queue_books' replies and the server's time (ms); ``lanes`` and
    ``busy`` per group are the caller's to fill, and ``corrupt`` per group (the lines
    naming what of the group's own keys cannot be read). ``faults``: the shared books of
    the wrong type (read as empty); those of the groups' settings go to every group's row."""
    shared: list[str] = []      # the groups' settings and books: every row shows them
    others: list[str] = []
    n = len(_BOOK_HASHES)
    hashes = [readable(client, getattr(keys, name), reply, {}, shared)
              for name, reply in zip(_BOOK_HASHES, replies[:n])]
    values = [readable(client, getattr(keys, name), reply, empty, others)
              for (name, empty), reply in zip(_BOOK_OTHERS, replies[n:BOOK_REPLIES])]
    books: dict[str, Any] = dict(zip(_BOOK_HASHES, hashes))
    gpaused, paused, gwait, fairness, gvt, busy = values
    books.update(now_ms=now, gpaused=gpaused, paused=bool(paused), gwait=dict(gwait),
                 lanes={}, fairness="time" if fairness == "time" else "turns", gvt=gvt,
                 busy={}, corrupt={}, faults=shared + others, shared_faults=shared,
                 base=keys.base)
    books["busy_total"] = minute_ms(busy, now) or 0
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
    replies = pipe.execute(raise_on_error=False)
    books = make_books(client, keys, replies, now)
    per_group = replies[BOOK_REPLIES:]
    rest = per_group[len(groups):]
    for i, g in enumerate(groups):
        faults: list[str] = []
        slots = readable(client, keys.group_busy(g), per_group[i], {}, faults)
        lane = rest[3 * i:3 * i + 3]
        spoilt = [r for r in lane if isinstance(r, Exception)]
        if spoilt:      # the three reads of one key: one line
            lane = [readable(client, keys.lane(g), spoilt[0], 0, faults), [], []]
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
    if books["fairness"] == "time" and pending:
        competing = set(books["gvt"]) | {g}
        weights = sum(effective_weight(books, h) for h in competing)
        target = weight / weights
    return {"busy_s": busy / 1000, "busy_share": busy / total if total else None,
            "target_share": target}


def effective_weight(books: dict[str, Any], g: str) -> int:
    """The group's weight (its own, else the default, else 1); 1 when it cannot be read."""
    own = books["gweight"].get(g)
    w = own if own is not None else books["gdefaults"].get("weight")
    return int(w) if int_ok(w) and int(w) >= 1 else 1


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


#: A group's settings a claim reads as integers: (field, its own book, what it is called).
_INT_SETTINGS = (("limit", "glimit", "limit"), ("max_size", "gmax", "lane cap"),
                 ("weight", "gweight", "weight"))
_SETTING_NAMES = {field: name for field, _, name in _INT_SETTINGS}


def _setting(books: dict[str, Any], g: str, field: str, book: str) -> tuple[Any, str]:
    """A setting's stored text (the group's own, else the default) and the words naming
    where it is: "its limit (BASE glimit)", or "the default limit (BASE gdefaults)"."""
    own = books[book].get(g)
    name = _SETTING_NAMES.get(field, field)
    if own is not None:
        return own, f"its {name} ({books['base']}{book})"
    return books["gdefaults"].get(field), f"the default {name} ({books['base']}gdefaults)"


def book_faults(g: str, books: dict[str, Any]) -> list[str]:
    """Why a claim cannot read the group's books (lua/lib/seat.lua group_seat, and what
    emqtasks check says): one line each, naming the key; [] for a healthy group."""
    out = [*books["shared_faults"], *books["corrupt"].get(g, ())]
    active = books["gactive"].get(g)
    if active is not None and not int_ok(active):
        out.append(f"its jobs in flight ({books['base']}gactive) is {active!r}, "
                   "not an integer")
    for field, book, _ in _INT_SETTINGS:
        value, where = _setting(books, g, field, book)
        least = 1 if field == "weight" else None
        if value is not None and not (int_ok(value) and (least is None or int(value) >= 1)):
            out.append(f"{where} is {value!r}, not an integer{' >= 1' if least else ''}")
    rate, where = _setting(books, g, "rate", "grate")
    numbers = re.fullmatch(r"([0-9]+):([0-9]+)", rate or "")
    if numbers and max(len(numbers[1]), len(numbers[2])) > 15:
        out.append(f"{where} is {rate!r}, over 15 digits a number")
    return out


def _int(text: Any) -> int | None:
    return int(text) if int_ok(text) else None


def group_row(g: str, pending: int, oldest: int | None, books: dict[str, Any]) -> dict[str, Any]:
    """A group's row from the books: its effective settings (and where each comes from), its
    state and why it waits, its oldest job's age, its busy share (``books["busy"][g]``).

    A group whose books a claim cannot read (book_faults) has the state "corrupt" and
    ``corrupt`` says why, one line naming each key (None for a healthy group); what of its
    settings cannot be read shows as unset (a weight as 1, jobs in flight as 0)."""
    faults = book_faults(g, books)
    defaults = books["gdefaults"]
    own = {"limit": books["glimit"].get(g), "rate": books["grate"].get(g),
           "max_size": books["gmax"].get(g), "weight": books["gweight"].get(g)}
    eff = {f: own[f] if own[f] is not None else defaults.get(f) for f in DEFAULT_FIELDS}
    active = _int(books["gactive"].get(g, "0")) or 0
    limit = _int(eff["limit"])
    weight = effective_weight(books, g)
    rate = eff["rate"]
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
        state = "ready"
    return {
        "pending": pending, "active": active, "limit": limit,
        "weight": weight, "paused": g in books["gpaused"],
        # a rate a claim reads as none (not max:per_ms) shows as none
        "rate": parse_rate(rate) if re.fullmatch(r"[0-9]+:[0-9]+", rate or "") else None,
        "max_size": _int(eff["max_size"]),
        **{f"{f}_source": None if eff[f] is None else ("group" if own[f] is not None
                                                        else "default")
           for f in ("limit", "rate", "max_size", "weight")},
        "state": state,
        "ready_at": (waiting_until / 1000 if state == "rate_limited" else None),
        "oldest_age": None if oldest is None else max(0.0, (now - oldest) / 1000),
        **shares(books, g, weight, pending),
        "corrupt": "; ".join(faults) if faults else None,
    }
