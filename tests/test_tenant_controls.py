"""A tenant's rate and lane cap over all its groups (issue 30): set_tenant_rate and
set_tenant_max_size, on the scripts and on the module (path_app)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from click.testing import CliRunner
from workerproc import WorkerProc

from emqtasks import App, InvalidArgument, InvalidGroup, LaneFull
from emqtasks.cli import main
from emqtasks.ops.check import check, repair
from emqtasks.store.keys import TENANT_MARK
from emqtasks.store.queue import NewJob, Queue
from emqtasks.verdicts import EnqueueVerdict

pytestmark = pytest.mark.timeout(60)


def _send(q: Queue, jobs: list[tuple[str, str, str | None]],
          countdown: float = 0) -> list[EnqueueVerdict]:
    """(id, group, tenant) per job."""
    ms = int(countdown * 1000)
    return q.enqueue_many([NewJob(i, "tc.noop", "{}", g, 1, 60_000, 0, 60, countdown_ms=ms)
                           for i, g, _ in jobs], None, [t for _, _, t in jobs])


def _promote(q: Queue) -> list[Any]:
    return list(q.hot.call("promote", q._k, [100]))


def test_a_tenant_past_its_rate_leaves_the_ring_over_all_its_groups(path_app: App) -> None:
    # Given tenant A at 3 starts per minute over 4 groups, and tenant B unlimited
    q = path_app.queue()
    path_app.set_tenant_rate("A", 3, per=60)
    _send(q, [(f"a-{i}", f"a{i % 4}", "A") for i in range(12)])
    _send(q, [(f"b-{i}", "b", "B") for i in range(12)])
    # When the workers claim all they can at once
    path_app.client.delete(q.keys.wake)
    got = [lease.id for lease in q.claim(20)]
    # Then A started 3 (its rate, whatever the group), B the rest
    assert sum(1 for i in got if i.startswith("a-")) == 3
    assert sum(1 for i in got if i.startswith("b-")) == 12
    # A's mark is off the ring, in twait until its oldest start is a minute old; a 'd' wake
    # re-timed the parked masters (no polling)
    assert TENANT_MARK + "A" not in path_app.client.lrange(q.keys.ring, 0, -1)
    assert path_app.client.zscore(q.keys.twait, "A") is not None
    assert "d" in path_app.client.lrange(q.keys.wake, 0, -1)
    info = path_app.tenant("A")
    assert info["rate"] == (3, 60.0) and info["waits"].startswith("rate")
    assert _promote(q)[1] > 0                        # promote says when A is due
    # When its window has passed (its start times and its wait moved into the past),
    # promote brings it back
    starts = q.keys.tenant_starts("A")
    for i in range(path_app.client.llen(starts)):
        path_app.client.lset(starts, i, 1000 - i)
    path_app.client.zadd(q.keys.twait, {"A": 1000}, xx=True)
    _promote(q)
    assert path_app.client.zscore(q.keys.twait, "A") is None
    assert path_app.tenant("A")["on_ring"]
    assert len(q.claim(10)) == 3                     # its next budget
    assert check(q).ok


def test_clearing_the_rate_returns_a_waiting_tenant_at_once(path_app: App) -> None:
    q = path_app.queue()
    path_app.set_tenant_rate("A", 1, per=60)
    _send(q, [(f"a-{i}", f"a{i % 2}", "A") for i in range(4)])
    assert len(q.claim(4)) == 1
    assert path_app.client.zscore(q.keys.twait, "A") is not None
    path_app.set_tenant_rate("A", None)
    assert path_app.client.zscore(q.keys.twait, "A") is None
    assert len(q.claim(4)) == 3
    # a default rate holds every tenant without its own
    path_app.set_tenant_defaults(rate=(1, 60.0))
    _send(q, [(f"c-{i}", f"c{i}", "C") for i in range(3)])
    assert len(q.claim(3)) == 1
    assert path_app.tenant_defaults()["rate"] == (1, 60.0)


def test_a_live_worker_gives_a_rated_tenant_its_rate_in_total(path_app: App) -> None:
    # Given tenant A at 20 starts/s over 16 groups (30 jobs), tenant B unlimited (30 jobs)
    path_app.set_tenant_rate("A", 20, per=1.0)
    path_app.pause()
    for i in range(30):
        path_app.send_task("f.tick", (f"a{i % 16}", f"a-{i}"), job_id=f"a-{i}",
                           group=f"a{i % 16}", tenant="A")
        path_app.send_task("f.tick", ("b", f"b-{i}"), job_id=f"b-{i}", group="b", tenant="B")
    with WorkerProc(path_app.settings.redis_url, path_app.settings.queue, concurrency=4,
                    modules=("fairness_tasks",), tick=0.5) as w:
        w.wait_ready()
        path_app.resume()
        w.wait_for(lambda: path_app.stats()["pending"] == 0, 20, "the backlog")
        w.wait_for(lambda: all(path_app.queue().status(f"a-{i}") == "done" for i in range(30)),
                   10, "tenant A's jobs")
    a = sorted(int(path_app.job(f"a-{i}")["started"]) for i in range(30))
    b = sorted(int(path_app.job(f"b-{i}")["started"]) for i in range(30))
    # Then no window of a second holds more than 20 of A's starts, over all its groups...
    for i, t in enumerate(a):
        assert sum(1 for u in a[i:] if u < t + 1000) <= 20
    # ...the 30 took about half a second (a burst of 20, then 20 per second)...
    span = (a[-1] - a[0]) / 1000
    assert 0.35 <= span <= 2.0, span
    # ...and B did not wait for A's budget
    assert b[-1] - b[0] < 1000 * span


def test_a_tenants_lane_cap_counts_over_all_its_groups(path_app: App) -> None:
    # Given tenant A capped at 5 waiting jobs
    q = path_app.queue()
    path_app.set_tenant_max_size("A", 5)
    ok = EnqueueVerdict.ENQUEUED
    assert _send(q, [(f"a-{i}", f"a{i % 2}", "A") for i in range(5)]) == [ok] * 5
    # When a sixth comes, in either group or a new one, it is refused, nothing written
    verdicts = _send(q, [("a-5", "a0", "A"), ("a-6", "a9", "A"), ("b-0", "b", "B")])
    assert verdicts == [EnqueueVerdict.FULL, EnqueueVerdict.FULL, EnqueueVerdict.ENQUEUED]
    assert not path_app.client.exists(q.keys.job("a-5"), q.keys.job("a-6"), q.keys.lane("a9"))
    assert path_app.client.hget(q.keys.gtenant, "a9") is None
    with pytest.raises(LaneFull):
        path_app.send_task("tc.noop", job_id="a-7", group="a1", tenant="A")
    # a countdown is not held to the cap (it joins its lane when due), as for a group
    assert _send(q, [("a-8", "a1", "A")], countdown=60) == [EnqueueVerdict.ENQUEUED]
    # a claim frees a place; a batch fills it and stops at the cap
    assert len(q.claim(1)) == 1
    assert _send(q, [("a-10", "a0", "A"), ("a-11", "a1", "A")]) == \
        [EnqueueVerdict.ENQUEUED, EnqueueVerdict.FULL]
    assert path_app.tenant("A")["max_size"] == 5
    # the default cap for every tenant; a tenant's own wins
    path_app.set_tenant_defaults(max_size=1)
    assert _send(q, [("c-0", "c0", "C"), ("c-1", "c1", "C")]) == \
        [EnqueueVerdict.ENQUEUED, EnqueueVerdict.FULL]
    assert _send(q, [("b-1", "b", "B")]) == [EnqueueVerdict.FULL]    # B has 1 waiting
    path_app.set_tenant_max_size("A", None)                         # A: the default now
    assert _send(q, [("a-12", "a0", "A")]) == [EnqueueVerdict.FULL]


@pytest.mark.parametrize("call", [
    lambda a: a.set_tenant_rate("A", 0), lambda a: a.set_tenant_rate("A", -1),
    lambda a: a.set_tenant_rate("A", 5, per=0), lambda a: a.set_tenant_rate("A", 5, per=-1),
    lambda a: a.set_tenant_rate("A", 5, per=math.inf),
    lambda a: a.set_tenant_rate("A", 5, per=math.nan), lambda a: a.set_tenant_rate("A", 2.5),
    lambda a: a.set_tenant_max_size("A", 0), lambda a: a.set_tenant_max_size("A", -3),
    lambda a: a.set_tenant_max_size("A", 1.5), lambda a: a.set_tenant_defaults(max_size=0),
    lambda a: a.set_tenant_defaults(rate=(0, 1.0)),
])
def test_bad_rates_and_caps_are_refused_with_nothing_written(path_app: App, call: Any) -> None:
    with pytest.raises(InvalidArgument):
        call(path_app)
    q = path_app.queue()
    assert not path_app.client.exists(q.keys.trate, q.keys.tmax, q.keys.twait)


@pytest.mark.parametrize("name", ["", "\ud800", "x" * 300, 7])
def test_a_tenant_name_the_group_rules_refuse_is_refused(path_app: App, name: Any) -> None:
    q = path_app.queue()
    with pytest.raises(InvalidGroup):
        path_app.set_tenant_rate(name, 5)
    with pytest.raises(InvalidGroup):
        path_app.set_tenant_max_size(name, 5)
    assert not path_app.client.exists(q.keys.trate, q.keys.tmax)


def test_the_command_line_sets_and_explains_rate_and_cap(path_app: App) -> None:
    q = path_app.queue()
    _send(q, [(f"a-{i}", f"a{i % 2}", "A") for i in range(4)])
    url, name = path_app.settings.redis_url, path_app.settings.queue

    def cli(*args: str, code: int = 0) -> str:
        out = CliRunner().invoke(main, [*args, "--redis-url", url, "--queue", name])
        assert out.exit_code == code, out.output
        return out.output

    assert cli("rate", "--tenant", "A", "1/60") == "rate of tenant A set to 1 per 60s\n"
    assert cli("maxsize", "--tenant", "A", "10") == "lane cap of tenant A set to 10\n"
    assert cli("rate", "a0", "5/1") == "rate of group a0 set to 5 per 1s\n"   # unchanged
    q.claim(1)
    shown = cli("tenant", "A")
    assert shown.startswith("tenant A: waits: rate"), shown
    assert "rate:      1/60s" in shown and "max size:  10" in shown
    assert "tenant_rate_limited" in cli("lane", "a1")             # its group says why
    assert path_app.stats()["tenants"]["A"]["state"] == "rate_limited"
    assert "tenant rate:      2/1s" in cli("defaults", "--tenant-rate", "2/1")
    assert "tenant max_size:  7" in cli("defaults", "--tenant-max-size", "7")
    assert cli("rate", "--tenant", "A", "none") == "rate of tenant A cleared\n"
    assert cli("maxsize", "--tenant", "A", "none") == "lane cap of tenant A cleared\n"
    assert "bad" not in cli("maxsize", "--tenant", "A", "0", code=2)
    assert "rate" in cli("rate", "--tenant", "A", "0/1", code=2)
    # the audit log records each change, as for the other controls
    targets = [e.target for e in path_app.queue().audit_log(20)]
    for said in ("tenant A: 1/60s", "tenant A: 10", "tenant A: None", "tenant rate: 2/1s",
                 "tenant max_size: 7"):
        assert any(said in t for t in targets), (said, targets)


def test_the_checker_and_repair_know_the_new_books(path_app: App) -> None:
    q = path_app.queue()
    path_app.set_tenant_rate("A", 1, per=60)
    path_app.set_tenant_max_size("A", 5)
    _send(q, [(f"a-{i}", f"a{i % 3}", "A") for i in range(5)])
    q.claim(2)
    assert path_app.client.zscore(q.keys.twait, "A") is not None
    assert check(q).ok
    # the derived books lost: repair rebuilds the tenant's wait and its set of groups
    path_app.client.delete(q.keys.twait, q.keys.tenant_groups("A"))
    assert not check(q).ok
    repair(q)
    assert check(q).ok
    assert path_app.client.zscore(q.keys.twait, "A") is not None
    assert path_app.client.smembers(q.keys.tenant_groups("A")) == {"a0", "a1", "a2"}
    assert _send(q, [("a-9", "a0", "A")]) == [EnqueueVerdict.ENQUEUED]     # 4 waiting, then 5
    assert _send(q, [("a-10", "a0", "A")]) == [EnqueueVerdict.FULL]


def test_time_mode_holds_a_tenants_rate_and_returns_it_at_its_virtual_time(
        path_app: App) -> None:
    # Given a time-fair queue: tenant A at 5 starts per second over two busy groups, and
    # tenant B unlimited
    path_app.set_fairness("time")
    q = path_app.queue()
    path_app.set_tenant_rate("A", 5, per=1.0)
    _send(q, [(f"a-{i}", f"a{i % 2}", "A") for i in range(30)])
    _send(q, [(f"b-{i}", "b", "B") for i in range(40)])
    # When the workers claim all they can at once (one call: well within the window)
    path_app.client.delete(q.keys.wake)
    got = [lease.id for lease in q.claim(20)]
    # Then A started its budget, over both its groups, and B the rest; A's mark left `gvt`
    # (its groups stay in its own zset) for twait, with a 'd' wake for the parked masters
    assert sum(1 for i in got if i.startswith("a-")) == 5, got
    assert sum(1 for i in got if i.startswith("b-")) == 15, got
    assert path_app.client.zscore(q.keys.gvt, TENANT_MARK + "A") is None
    assert path_app.client.zcard(q.keys.tenant_gvt("A")) == 2
    assert path_app.client.zscore(q.keys.twait, "A") is not None
    assert "d" in path_app.client.lrange(q.keys.wake, 0, -1)
    info = path_app.tenant("A")
    assert not info["on_ring"] and info["waits"].startswith("rate"), info
    assert check(q).ok
    # and B keeps being served meanwhile
    assert {lease.id[0] for lease in q.claim(5)} == {"b"}
    assert _promote(q)[1] > 0                        # A is not due yet
    assert path_app.client.zscore(q.keys.gvt, TENANT_MARK + "A") is None
    # When its window has passed (its start times and its wait moved into the past)
    starts = q.keys.tenant_starts("A")
    for i in range(path_app.client.llen(starts)):
        path_app.client.lset(starts, i, 1000 - i)
    path_app.client.zadd(q.keys.twait, {"A": 1000}, xx=True)
    own = float(path_app.client.hget(q.keys.gvrun, TENANT_MARK + "A"))
    _promote(q)
    # Then promote returns its mark to `gvt` at its virtual time or the floor, whichever is
    # later (time away banks no credit, and costs none)
    assert path_app.client.zscore(q.keys.twait, "A") is None
    back = path_app.client.zscore(q.keys.gvt, TENANT_MARK + "A")
    floor = float(path_app.client.hget(q.keys.gvrun, "") or 0)
    assert back == max(own, floor), (back, own, floor)
    assert check(q).ok
    # and A shares with B again: its next budget, interleaved with B's claims, first served
    nxt = [lease.id[0] for lease in q.claim(10)]
    assert nxt.count("a") == 5 and nxt[0] == "a", nxt
    assert "aaa" not in "".join(nxt) and "bbb" not in "".join(nxt), nxt
    assert path_app.client.zscore(q.keys.twait, "A") is not None
    # a rate cleared returns a waiting tenant at once in time mode too
    path_app.set_tenant_rate("A", None)
    assert path_app.client.zscore(q.keys.twait, "A") is None
    assert path_app.client.zscore(q.keys.gvt, TENANT_MARK + "A") is not None
    assert check(q).ok


@pytest.mark.parametrize("to", ["turns", "time"])
def test_a_switch_of_mode_after_a_tenants_rate_wait_leaves_one_mark(path_app: App,
                                                                  to: str) -> None:
    # Given tenant A waiting out its rate (its budget of 2 spent) beside tenant B, in the
    # mode the switch leaves, and its window passed before promote ran
    path_app.set_fairness("time" if to == "turns" else "turns")
    q = path_app.queue()
    path_app.set_tenant_rate("A", 2, per=60)
    _send(q, [(f"a-{i}", "a0", "A") for i in range(10)])
    _send(q, [(f"b-{i}", "b0", "B") for i in range(10)])
    path_app.client.delete(q.keys.wake)
    assert sum(1 for lease in q.claim(6) if lease.id.startswith("a-")) == 2
    assert path_app.client.zscore(q.keys.twait, "A") is not None
    starts = q.keys.tenant_starts("A")
    for i in range(path_app.client.llen(starts)):
        path_app.client.lset(starts, i, 1000 - i)
    path_app.client.zadd(q.keys.twait, {"A": 1000}, xx=True)
    # When the queue switches mode (A's mark enters the new ring), then promote runs
    path_app.set_fairness(to)
    _promote(q)
    # Then A's mark stands once, out of twait, and the books agree
    mark = TENANT_MARK + "A"
    if to == "turns":
        assert path_app.client.lrange(q.keys.ring, 0, -1).count(mark) == 1
    else:
        assert path_app.client.zscore(q.keys.gvt, mark) is not None
    assert path_app.client.zscore(q.keys.twait, "A") is None
    assert check(q).ok, check(q)
    # and A and B take turns again, A's next budget of 2 and no more
    nxt = [lease.id[0] for lease in q.claim(6)]
    assert nxt.count("a") == 2, nxt
