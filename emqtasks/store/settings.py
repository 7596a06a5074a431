"""A group's settings as the verbs read them: its own, else the default for every group.

The rule is lua/lib/settings.lua's (``limit_of``, ``rate_of``, ``max_size_of``,
``weight_of``; the module's twin in emq.c), and which stored values a claim cannot read is
lua/lib/seat.lua's (``group_seat``). This is the one Python copy of both, for the views
(lanes.py) and the checker (check.py, and a refused verb's CorruptKey);
tests/test_store_settings.py runs the script's functions and these on every setting.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from .keys import QueueKeys

#: The settings a group has of its own or by default (``gdefaults`` fields), each in a
#: book of its own (a hash: group -> stored text).
SETTINGS = ("limit", "rate", "max_size", "weight")
OWN_BOOK = {"limit": "glimit", "rate": "grate", "max_size": "gmax", "weight": "gweight"}
#: What a line calls each setting.
_CALLED = {"limit": "limit", "rate": "rate", "max_size": "lane cap", "weight": "weight"}
#: The order the lines name them in: the integers a claim reads, then the rate.
_CHECKED = ("limit", "max_size", "weight", "rate")
#: A rate as the rate and defaults verbs store it: "max_jobs:per_ms".
RATE = re.compile(r"([0-9]+):([0-9]+)")
_INT = re.compile(r"0|-?[1-9][0-9]{0,14}")

#: The books these functions read, by name (hgetall replies: group -> text), ``gturn``
#: optional; ``gdefaults`` is setting -> text.
Books = Mapping[str, Mapping[str, str]]


def int_ok(value: str | None) -> bool:
    """Integer text as every writer stores it (lua/lib/core.lua int_ok)."""
    return value is not None and _INT.fullmatch(value) is not None


def parse_rate(text: str | None) -> tuple[int, float] | None:
    """"max:per_ms" as stored -> (max_jobs, per seconds)."""
    if not text:
        return None
    count, per_ms = text.split(":")
    return int(count), int(per_ms) / 1000


class Setting(NamedTuple):
    """A group's effective setting: the stored text a verb reads (None: unset), and whether
    it is the group's own (else the default's, or unset)."""

    value: str | None
    own: bool


def effective(books: Books, g: str, name: str) -> Setting:
    """The group's own setting, else the default for every group, else unset."""
    own = books[OWN_BOOK[name]].get(g)
    if own is not None:
        return Setting(own, True)
    return Setting(books["gdefaults"].get(name), False)


def weight(books: Books, g: str) -> int:
    """The group's effective weight; 1 when unset or unreadable (as the rotation reads it)."""
    value = effective(books, g, "weight").value
    return int(value) if value is not None and unreadable("weight", value) is None else 1


def unreadable(name: str, value: str | None) -> str | None:
    """Why a claim cannot read a setting's stored text (lua/lib/seat.lua), or None."""
    if value is None:
        return None
    if name == "rate":
        numbers = RATE.fullmatch(value)   # any other text is read as no rate
        return ("over 15 digits a number"
                if numbers and max(len(numbers[1]), len(numbers[2])) > 15 else None)
    if name == "weight":
        return None if int_ok(value) and int(value) >= 1 else "not an integer >= 1"
    return None if int_ok(value) else "not an integer"


class BookFault(NamedTuple):
    """One value of a group's books a claim cannot read: the book it is in (``gdefaults``
    for a default) and the line naming it ("its limit (KEY) is 'two', not an integer")."""

    book: str
    line: str


def book_faults(books: Books, g: str, keys: QueueKeys) -> list[BookFault]:
    """Why a claim cannot read group g's books (lua/lib/seat.lua group_seat): its jobs in
    flight, its turn count (when ``books`` has ``gturn``), each effective setting; [] for
    a group a claim can read."""
    out = []
    for book, what in (("gactive", "jobs in flight"), ("gturn", "turn count")):
        value = books.get(book, {}).get(g)
        if value is not None and not int_ok(value):
            out.append(BookFault(book, f"its {what} ({keys.named(book)}) is {value!r}, "
                                       "not an integer"))
    for name in _CHECKED:
        value, own = effective(books, g, name)
        why = unreadable(name, value)
        if why:
            out.append(_fault(keys, name, value, own, why))
    return out


def queue_book_faults(books: Books, groups: Sequence[str], keys: QueueKeys) -> list[BookFault]:
    """book_faults for a queue, each a whole line: the defaults' once (every group without
    a setting of its own reads them), then each group's own books."""
    out = []
    for name in _CHECKED:
        value = books["gdefaults"].get(name)
        why = unreadable(name, value)
        if why:
            book, line = _fault(keys, name, value, False, why)
            out.append(BookFault(book, f"{line}: a claim skips the group"))
    for g in groups:
        out += [BookFault(book, f"group {g}: {line}: a claim skips the group")
                for book, line in book_faults(books, g, keys) if book != "gdefaults"]
    return out


def _fault(keys: QueueKeys, name: str, value: str | None, own: bool, why: str) -> BookFault:
    book = OWN_BOOK[name] if own else "gdefaults"
    where = f"its {_CALLED[name]}" if own else f"the default {_CALLED[name]}"
    return BookFault(book, f"{where} ({keys.named(book)}) is {value!r}, {why}")
