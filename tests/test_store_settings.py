"""One rule each, in the store: a group's effective settings, which books a claim cannot
read, and the list of a queue's groups; the views, the checker and the scripts agree."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from emqtasks import App
from emqtasks.observe.lanes import lane as lane_view
from emqtasks.observe.lanetable import LaneTable
from emqtasks.ops.check import check
from emqtasks.store import scripts
from emqtasks.store.queue import NewJob, Queue
from emqtasks.store.settings import OWN_BOOK, SETTINGS, book_faults, effective
from emqtasks.verdicts import EnqueueVerdict

#: lib/settings.lua's answer for group ARGV[1], each compared in the script with the text
#: Python found effective (ARGV[2..5]: "1" + text, or "0" for unset) read as the verbs read
#: it; and whether lib/seat.lua's group_seat (a claim) can read the group's books.
PROBE = """
local g = ARGV[1]
local function given(s) if string.sub(s, 1, 1) == '1' then return string.sub(s, 2) end end
local m, per = rate_of(g)
local pm, pp = nil, nil
if given(ARGV[5]) then pm, pp = string.match(given(ARGV[5]), '^(%d+):(%d+)$') end
local function yes(b) if b then return 1 end return 0 end
return {yes(limit_of(g) == given(ARGV[2])), yes(max_size_of(g) == given(ARGV[3])),
        yes(weight_of(g) == tonumber(given(ARGV[4]) or '1')),
        yes(m == tonumber(pm) and per == tonumber(pp)), yes(group_seat(g, false))}
"""

#: Stored texts tried for each setting, as its own and as the default: unset, fine, out of
#: range, not a number, empty (and for a rate, a number of 16 digits).
VALUES: dict[str, tuple[str | None, ...]] = {
    "limit": (None, "3", "0", "x", ""),
    "max_size": (None, "3", "0", "x", ""),
    "weight": (None, "3", "0", "x", ""),
    "rate": (None, "5:1000", "x", "", "1234567890123456:1"),
}


def _probe(q: Queue) -> Any:
    """The loader's helpers of a verb that includes settings.lua and seat.lua, and PROBE."""
    body = scripts.source("repair")
    helpers = body[: body.index("-- repair:")]
    return lambda *args: q.client.eval(helpers + PROBE, len(q.keys.fixed), *q.keys.fixed,
                                       *args)


def _books(q: Queue) -> dict[str, dict[str, str]]:
    names = ("gactive", *OWN_BOOK.values(), "gdefaults")
    return {name: q.client.hgetall(q.keys.named(name)) for name in names}


def _arg(value: str | None) -> str:
    return "0" if value is None else "1" + value


def test_the_effective_setting_is_the_scripts_for_every_setting(queue: Queue) -> None:
    probe = _probe(queue)
    cases = 0
    for name in SETTINGS:
        for n, (own, default) in enumerate(itertools.product(VALUES[name], repeat=2)):
            # Given a group with this setting of its own, and this default for every group
            g = f"{name}-{n}"
            queue.client.delete(queue.keys.gdefaults)
            if own is not None:
                queue.client.hset(queue.keys.named(OWN_BOOK[name]), g, own)
            if default is not None:
                queue.client.hset(queue.keys.gdefaults, name, default)
            # When Python reads its effective settings, and lib/settings.lua does
            books = _books(queue)
            python = {s: effective(books, g, s).value for s in ("limit", "max_size", "weight",
                                                              "rate")}
            limit, cap, weight, rate, seat = probe(g, *map(_arg, python.values()))
            # Then they are the same value, for every setting
            assert (limit, cap, weight, rate) == (1, 1, 1, 1), (name, own, default, python)
            # And Python names a fault exactly when the verb cannot read the setting:
            # a claim (group_seat) its limit, weight and rate, an enqueue its lane cap
            faults = book_faults(books, g, queue.keys)
            if name == "max_size":
                [verdict] = queue.enqueue_many([NewJob(f"j-{g}", "t", "{}", g, 1, 1000, 0,
                                                       60)])
                assert (verdict == EnqueueVerdict.UNREADABLE) == bool(faults), (own, default)
            else:
                assert seat == (0 if faults else 1), (name, own, default, faults)
            cases += 1
    assert cases == 100


def test_the_checker_and_a_lane_view_name_the_same_unreadable_default(app: App,
                                                                     queue: Queue) -> None:
    # Given a group waiting, and a default weight no claim can read (0; the checker read
    # only whether a default weight was an integer)
    app.client.hset(queue.keys.gdefaults, "weight", "0")
    queue.enqueue_many([NewJob("w-1", "t", "{}", "acme", 1, 1000, 0, 60)])
    # When the lane is viewed and the queue checked
    row = lane_view(queue, "acme")
    report = check(queue)
    # Then both name the default, in the same words
    assert row["state"] == "corrupt"
    assert row["corrupt"] == f"the default weight ({queue.keys.gdefaults}) is '0', not an " \
                             "integer >= 1"
    assert f"{row['corrupt']}: a claim skips the group" in report.violations
    assert f"{row['corrupt']}: a claim skips the group" in report.bad_settings


@pytest.mark.parametrize("mode", ["turns", "time"])
def test_every_list_of_a_queues_groups_is_the_same(app: App, queue: Queue, mode: str) -> None:
    # Given a lane table that has scanned the lanes already (it does so once a minute)
    table = LaneTable(queue)
    queue.set_fairness(mode)
    queue.enqueue_many([NewJob("a-1", "t", "{}", "acme", 1, 1000, 0, 60)])
    assert set(table.stats()["groups"]) == {"acme"}
    # And groups known in every other way: a new lane (in time mode on `gvt` only), a
    # group with only a setting, one known only to a book (backing off)
    queue.enqueue_many([NewJob("n-1", "t", "{}", "newcomer", 1, 1000, 0, 60)])
    queue.set_group_limit("configured", 2)
    app.client.hset(queue.keys.gbackoff, "backing", 1)
    want = {"acme", "newcomer", "configured", "backing"}
    # When each lists the queue's groups, Then they list the same
    assert queue.groups() == want
    assert set(table.stats()["groups"]) == want
    assert set(check(queue).group_names) == want
