"""The one list of a queue's groups: each group with a lane, and each group a book names.

``Queue.groups()`` (stats(), the defaults verb), the lane table and the checker all list a
queue's groups by this rule; they differ only in how they find the lanes (a SCAN each call,
a SCAN at most every minute, the checker's SCAN of every key).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .keys import TENANT_MARK, QueueKeys

#: The books that name groups, and the type of each: the rings (turns and time mode), the
#: jobs in flight, the settings, the back-offs, the groups held back, the paused ones.
GROUP_BOOKS = (("ring", "list"), ("gvt", "zset"), ("gactive", "hash"), ("glimit", "hash"),
               ("gweight", "hash"), ("grate", "hash"), ("gmax", "hash"), ("gbackoff", "hash"),
               ("gwait", "zset"), ("gpaused", "set"))


def queue_group_books(pipe: Any, keys: QueueKeys) -> None:
    """Queue on a pipeline the reads of the names in each of GROUP_BOOKS (in its order)."""
    for name, kind in GROUP_BOOKS:
        key = keys.named(name)
        if kind == "hash":
            pipe.hkeys(key)
        elif kind == "set":
            pipe.smembers(key)
        elif kind == "list":
            pipe.lrange(key, 0, -1)
        else:
            pipe.zrange(key, 0, -1)


def group_names(lanes: Iterable[str], books: Mapping[str, Any]) -> set[str]:
    """The groups of ``lanes`` and of each of GROUP_BOOKS, ``books`` by name (any iterable
    of group names: a list, the keys of a hash, a set); a book read as an error (a key of
    the wrong type, from a pipeline run with ``raise_on_error=False``) names none."""
    found = set(lanes)
    for name, _ in GROUP_BOOKS:
        names = books[name]
        if not isinstance(names, Exception):
            # (the ring holds tenants' marks beside groups: lua/lib/ring.lua)
            found.update(n for n in names if not n.startswith(TENANT_MARK))
    return found
