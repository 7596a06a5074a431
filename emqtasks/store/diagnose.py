"""Why a verb refused: the keys of the wrong type and the unreadable books it could have read.

A producer's CorruptKey (``Queue.corrupt``) says these lines; ``emqtasks check`` (check.py)
reads the whole queue by the same rules (keys.expected_type, settings.queue_book_faults).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .keys import NAMED_TYPES, QueueKeys, expected_type
from .plan import Pipe, Recorder, Steps, run
from .settings import queue_book_faults

#: The books of a group a claim or an enqueue reads (settings.book_faults).
_GROUP_BOOKS = ("gactive", "gturn", "glimit", "gmax", "gweight", "grate")


def diagnose(client: Any, keys: QueueKeys, groups: Iterable[str] = ()) -> list[str]:
    """The queue's named keys, and these groups' lanes and start times, that are of the
    wrong type, and these groups' books a claim or an enqueue cannot read; one line each."""
    return run(diagnose_plan(keys, groups), client)


def diagnose_plan(keys: QueueKeys, groups: Iterable[str] = ()) -> Steps[list[str]]:
    """diagnose as a plan (plan.py), for the sync and the async queue alike."""
    groups = sorted(set(groups))
    names = [*NAMED_TYPES, *(keys.name_of(key) for g in groups
                             for key in (keys.lane(g), keys.starts(g)))]
    pipe = Recorder()
    for name in names:
        pipe.type(keys.named(name))
    found, wrong = [], set()
    for name, kind in zip(names, (yield Pipe(pipe.cmds))):
        want = expected_type(name)
        if want and kind not in (want, "none"):
            wrong.add(name)
            found.append(f"key {keys.named(name)} holds a {kind}, not a {want}")
    books: dict[str, Any] = {"gdefaults": {}}
    pipe = Recorder()
    reads = [b for b in _GROUP_BOOKS if b not in wrong]
    for book in reads:
        for g in groups:
            pipe.hget(keys.named(book), g)
    if "gdefaults" not in wrong:
        pipe.hgetall(keys.gdefaults)
    replies = yield Pipe(pipe.cmds)
    for n, book in enumerate(reads):
        values = replies[n * len(groups):(n + 1) * len(groups)]
        books[book] = {g: v for g, v in zip(groups, values) if v is not None}
    if "gdefaults" not in wrong:
        books["gdefaults"] = replies[-1]
    for book in _GROUP_BOOKS:
        books.setdefault(book, {})
    return found + [fault.line for fault in queue_book_faults(books, groups, keys)]
