"""The dashboard at size: the lane table (lanetable.py) agrees with stats() without its
SCAN, the lanes page of 10,000 groups reads no keyspace per request, and searches of the
dead jobs are bounded per page, counted in full before "all that match" runs, and act only
on the jobs the count saw (lua/find.lua)."""

from __future__ import annotations

import re
import time

import pytest
from dashsrv import DashServer
from helpers import new_job

from emqtasks.dashboard import views
from emqtasks.observe.lanes import stats as queue_stats
from emqtasks.observe.lanetable import LaneTable
from emqtasks.store.queue import Queue

pytestmark = pytest.mark.timeout(180)


def _dead(queue: Queue, errors: list[str], group: str = "g", task: str = "t.dead",
          prefix: str = "d") -> list[str]:
    """Jobs in `dead` through the verbs: enqueued with one attempt, claimed, failed."""
    ids = [f"{prefix}{i}-{time.monotonic_ns()}" for i in range(len(errors))]
    queue.enqueue_many([new_job(i, group=group, max_attempts=1)._replace(task=task)
                        for i in ids])
    for error in errors:
        (lease,) = queue.claim()
        queue.retry(lease, error, 0, True)
    return ids


def _scans(queue: Queue) -> int:
    return int(queue.client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))


def test_the_lane_table_agrees_with_stats(queue: Queue) -> None:
    # Given lanes in every state, settings of their own and by default, and priorities
    for g, n in (("paused", 2), ("limited", 2), ("rated", 3)):
        queue.enqueue_many([new_job(f"{g}{i}", group=g) for i in range(n)])
    queue.pause_group("paused")
    queue.set_group_limit("limited", 1)
    queue.set_group_rate("rated", 1, 600)
    while queue.claim(1):   # one job of each starts: then limited and rated wait
        pass
    for g, n in (("ready", 3), ("weighted", 1)):
        queue.enqueue_many([new_job(f"{g}{i}", group=g) for i in range(n)])
    queue.enqueue_many([new_job("p-low", group="prio")._replace(priority=5),
                        new_job("p-high", group="prio")._replace(priority=-5)])
    queue.set_group_limit("configured-only", 4)
    queue.set_group_defaults(weight=2)
    queue.set_group_weight("weighted", 5)
    for paused in (False, True):
        if paused:
            queue.pause()
        table, stats = LaneTable(queue).stats(), queue_stats(queue)
        # Then the totals and every group's row are the same, but for the oldest age (read
        # a moment apart; the head's age where several priorities wait)
        assert {k: v for k, v in table.items() if k != "groups"} == \
            {k: v for k, v in stats.items() if k != "groups"}
        assert table["groups"].keys() == stats["groups"].keys()
        for g, row in stats["groups"].items():
            mine = table["groups"][g]
            assert {k: v for k, v in mine.items() if k != "oldest_age"} == \
                {k: v for k, v in row.items() if k != "oldest_age"}, g
            assert (mine["oldest_age"] is None) == (row["oldest_age"] is None), g
        states = {g: r["state"] for g, r in table["groups"].items()}
        assert states["configured-only"] == "empty"
        if not paused:
            assert (states["paused"], states["limited"], states["rated"], states["ready"]) \
                == ("paused", "at_limit", "rate_limited", "ready")
    # And exact() reads rows as lanes.view does
    assert LaneTable(queue).exact(["prio"])["prio"]["state"] == "queue_paused"


def test_the_lane_table_agrees_with_stats_in_time_mode(queue: Queue) -> None:
    # Given a time-fair queue where two groups ran jobs (busy time in the last minute) and
    # both still wait
    queue.set_fairness("time")
    for g in ("a", "b"):
        queue.enqueue_many([new_job(f"{g}{i}", group=g) for i in range(4)])
    for _ in range(2):
        for lease in queue.claim(2):
            time.sleep(0.01)
            queue.ack(lease)
    table, stats = LaneTable(queue).stats(), queue_stats(queue)
    # Then the mode, the ring (the time ring counts) and each group's busy and target share
    # read the same as stats()
    assert table["fairness"] == stats["fairness"] == "time"
    assert table["ring"] == stats["ring"] >= 1
    assert table["groups"].keys() == stats["groups"].keys() != set()
    for g, row in stats["groups"].items():   # a drained group's lane is gone from both
        for key in ("busy_s", "busy_share", "target_share"):
            assert table["groups"][g][key] == row[key], (g, key)
    assert sum(r["busy_s"] for r in table["groups"].values()) > 0


def test_the_lanes_page_of_10000_groups_reads_no_keyspace_per_request(queue: Queue) -> None:
    queue.enqueue_many([new_job(f"x{i}-{k}", group=f"tenant-{i:05d}")
                        for i in range(10_000) for k in range(i % 3 + 1)])
    with DashServer([queue]) as d:
        view = d.dash.views[queue.name]
        status, body, _ = d.request("/lanes?sort=group&page=3")
        assert status == 200 and '"lane-total">10000</span> of 10000 groups' in body
        assert "tenant-00100" in body and "tenant-00150" not in body
        scans = _scans(queue)
        t0 = time.monotonic()
        for page in (1, 100, 200):
            view.stats._value = None   # past the 1 s cache: the whole table is read again
            status, body, _ = d.request(f"/lanes?sort=group&page={page}")
            assert status == 200 and f"page {page} of 200" in body
        elapsed = time.monotonic() - t0
        assert _scans(queue) == scans      # the lane SCAN runs once a minute, not per read
        assert elapsed < 20, elapsed       # generous: a loaded 2-core machine
        assert "tenant-09999" in body


def test_a_filtered_dead_search_is_bounded_and_all_that_match_is_counted_first(
        queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(views, "SEARCH_BUDGET", 150)
    monkeypatch.setattr(views, "FIND_CHUNK", 50)
    beta = _dead(queue, ["OSError: beta is down"] * 300, prefix="b")
    alpha = _dead(queue, ["KeyError: ALPHA went wrong"] * 10, prefix="a")   # the newest
    with DashServer([queue]) as d:
        # A page of a search looks at a bounded part of the set: its count is "at least"
        _, body, _ = d.request("/dead?text=alpha")
        assert "10+ match" in body and body.count('name="id"') == 10
        assert "requeue all that match…" in body
        _, body, _ = d.request("/dead?text=beta")
        assert "51+ match" in body and body.count('name="id"') == 50
        _, body, _ = d.request("/dead?text=beta&page=2")
        assert body.count('name="id"') == 50
        # Asking for all that match counts them all first, and writes nothing
        status, body, _ = d.request("/dead/confirm", {"verb": "requeue", "text": "alpha",
                                                      "csrf": d.csrf(), "back": "/dead"})
        assert status == 200 and "10 dead jobs match" in body
        bound = re.search(r'name="bound" value="([^"]+)"', body)
        assert bound and queue.client.zcard(queue.keys.dead) == 310
        # A job that dies after the count is left alone
        late = _dead(queue, ["KeyError: alpha again"], prefix="late")
        status, _, headers = d.request("/dead/requeue", {
            "scope": "filter", "text": "alpha", "bound": bound.group(1),
            "csrf": d.csrf(), "back": "/dead"})
        assert status == 303 and headers["Location"].endswith("done=10")
        assert {queue.status(i) for i in alpha} == {"pending"}
        assert queue.status(late[0]) == "dead"
        # Cancel all 300 that match, counted the same way (the cancels pipelined)
        _, body, _ = d.request("/dead/confirm", {"verb": "cancel", "text": "BETA",
                                                 "csrf": d.csrf(), "back": "/dead"})
        assert "300 dead jobs match" in body
        bound = re.search(r'name="bound" value="([^"]+)"', body)
        assert bound
        status, _, headers = d.request("/dead/cancel", {
            "scope": "filter", "text": "BETA", "bound": bound.group(1),
            "csrf": d.csrf(), "back": "/dead"})
        assert headers["Location"].endswith("done=300")
        assert {queue.status(i) for i in beta} == {"cancelled"}
    # A small set is searched to its end: the count is exact and the action direct
    with DashServer([queue]) as d:
        monkeypatch.setattr(views, "SEARCH_BUDGET", 50_000)
        _, body, _ = d.request("/dead?text=again")
        assert "1 match" in body and "requeue all 1 that match" in body


def test_find_filters_on_the_server(queue: Queue) -> None:
    ids = _dead(queue, ["ValueError: One", "ValueError: two", "TypeError: ONE"],
                group="acme", task="t.a")
    other = _dead(queue, ["ValueError: one"], group="zeta", task="t.b")
    queue.enqueue_many([new_job(f"pend{i}", group="acme")._replace(
        task="t.a" if i % 2 else "t.b") for i in range(6)])
    q = queue

    def found(state: str, **kw: str) -> list[str]:
        return views.matching_ids(q, views.JobFilter(state, kw.get("group", ""),
                                                     kw.get("task", ""), kw.get("text", "")))

    def newest_first(*chosen: str) -> list[str]:   # the dead set's order (ties by id)
        return [i for i in q.client.zrevrange(q.keys.dead, 0, -1) if i in chosen]

    assert found("dead", text="one") == newest_first(other[0], ids[2], ids[0])
    assert found("dead", text="one", group="acme") == newest_first(ids[2], ids[0])
    assert found("dead", task="t.b") == other
    assert found("pending", group="acme", task="t.a") == ["pend1", "pend3", "pend5"]
    assert found("pending", task="t.b", group="") == []                # no groups given
    assert views.matching_ids(q, views.JobFilter("pending", "", "t.b", ""),
                              groups=["acme", "zeta"]) == ["pend0", "pend2", "pend4"]
    # A bound (a time of death) leaves out the jobs that died later
    score = q.client.zscore(q.keys.dead, ids[1])
    everyone = q.client.zrevrange(q.keys.dead, 0, -1, withscores=True)
    assert views.matching_ids(q, views.JobFilter("dead"), bound=repr(score)) == \
        [i for i, s in everyone if s <= score]
    assert views.matching_ids(q, views.JobFilter("dead"), bound=repr(score - 10**6)) == []


def test_the_lane_table_and_the_search_run_on_a_cluster() -> None:
    from cluster import ClusterServers

    from emqtasks import App

    servers = ClusterServers.start_or_skip()
    app = App(redis_url=servers.url, queue=f"cq-{time.monotonic_ns()}")
    try:
        q = app.queue()
        ids = _dead(q, ["ValueError: on a cluster"], group="g9")
        q.enqueue_many([new_job(f"c{i}", group=f"g{i % 7}") for i in range(30)])
        q.pause_group("g3")
        table = LaneTable(q).stats()
        stats = queue_stats(q)
        assert {g: r["state"] for g, r in table["groups"].items()} == \
            {g: r["state"] for g, r in stats["groups"].items()}
        assert table["pending"] == stats["pending"] == 30 and table["dead"] == 1
        assert views.matching_ids(q, views.JobFilter("dead", text="CLUSTER")) == ids
        with DashServer([q]) as d:
            status, body, _ = d.request("/lanes?state=paused")
            assert status == 200 and 'data-group="g3"' in body
            assert d.request("/metrics")[0] == 200
    finally:
        app.purge()
        app.close()
        servers.close()


def test_the_overview_draws_the_wait_times_as_svg(queue: Queue) -> None:
    queue.enqueue_many([new_job(f"w{i}", group="acme") for i in range(3)])
    for lease in queue.claim(3):
        queue.ack(lease)
    with DashServer([queue]) as d:
        status, body, _ = d.request("/")
    assert status == 200
    chart = body.split('<div id="wait-chart">', 1)[1].split("</div>", 1)[0]
    assert chart.startswith('<svg class="lines"') and "<script" not in chart
    assert "<polyline" in chart or "<circle" in chart   # this minute's starts are drawn
