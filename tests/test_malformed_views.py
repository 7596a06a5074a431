"""What the read-only views show of a wrongly typed key or an unreadable book (issue #24): the
healthy groups are listed, a broken group is shown as broken (``state`` "corrupt" and a
``corrupt`` line naming the key), a job key of the wrong type is a CorruptKey naming it, and
no view raises a raw redis error; the CLI says it in one line, the dashboard in a page."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from dashsrv import DashServer
from helpers import make_task

from emqtasks import App, Queue
from emqtasks.errors import CorruptKey
from emqtasks.observe.lanes import stats as queue_stats
from emqtasks.observe.lanetable import LaneTable
from emqtasks.observe.metrics import Exporter

pytestmark = pytest.mark.timeout(60)


def _lanes(app: App) -> Queue:
    """Group `bad` with two jobs waiting, and three healthy groups with one each."""
    t = make_task(app, name="tests.malformed", group=lambda g, i: g)
    t.map([("bad", 0), ("bad", 1), *((f"ok{i}", i) for i in range(3))])
    return app.queue()


def _string(q: Queue, key: str) -> None:
    q.client.delete(key)
    q.client.set(key, "x")


def _slot() -> str:
    return str(int(time.time() * 1000) // 10_000)


#: fault -> (how to spoil group `bad`, the key its `corrupt` line names)
GROUP_FAULTS: dict[str, tuple[Callable[[Queue], Any], Callable[[Queue], str]]] = {
    "its lane is a string": (lambda q: _string(q, q.keys.lane("bad")),
                             lambda q: q.keys.lane("bad")),
    "its gactive is not an integer": (lambda q: q.client.hset(q.keys.gactive, "bad", "abc"),
                                      lambda q: q.keys.gactive),
    "its limit is not an integer": (lambda q: q.client.hset(q.keys.glimit, "bad", "two"),
                                    lambda q: q.keys.glimit),
    "its weight is not an integer": (lambda q: q.client.hset(q.keys.gweight, "bad", "x"),
                                     lambda q: q.keys.gweight),
    "its lane cap is not an integer": (lambda q: q.client.hset(q.keys.gmax, "bad", "x"),
                                       lambda q: q.keys.gmax),
    "its rate is over 15 digits": (
        lambda q: q.client.hset(q.keys.grate, "bad", "1234567890123456:1000"),
        lambda q: q.keys.grate),
    "its busy book is a string": (lambda q: _string(q, q.keys.group_busy("bad")),
                                  lambda q: q.keys.group_busy("bad")),
    "its busy book holds text": (
        lambda q: q.client.hset(q.keys.group_busy("bad"), _slot(), "x"),
        lambda q: q.keys.group_busy("bad")),
}


def _assert_rows(q: Queue, groups: dict[str, dict[str, Any]], key: str) -> None:
    assert sorted(groups) == ["bad", "ok0", "ok1", "ok2"]
    for g in ("ok0", "ok1", "ok2"):
        assert groups[g]["state"] == "ready" and groups[g]["pending"] == 1, groups[g]
        assert groups[g]["corrupt"] is None
    assert groups["bad"]["state"] == "corrupt", groups["bad"]
    assert key in groups["bad"]["corrupt"], groups["bad"]


@pytest.mark.parametrize("fault", sorted(GROUP_FAULTS))
def test_stats_lists_the_healthy_groups_and_shows_the_broken_one(app: App, fault: str) -> None:
    # Given group `bad` whose books cannot be read, and three healthy groups
    q = _lanes(app)
    spoil, key_of = GROUP_FAULTS[fault]
    spoil(q)
    key = key_of(q)
    # When the views read the queue, Then every group is listed, `bad` as broken
    assert q.groups() == {"bad", "ok0", "ok1", "ok2"}
    stats = app.stats()
    _assert_rows(q, stats["groups"], key)
    assert stats["pending"] >= 3
    _assert_rows(q, LaneTable(q).stats()["groups"], key)      # the dashboard's, /metrics'
    # And one group's view says the same
    row = app.lane("bad")
    assert row["state"] == "corrupt" and key in row["corrupt"]
    assert app.lane("ok0")["corrupt"] is None


def test_a_book_hash_of_the_wrong_type_costs_every_group_but_no_view(app: App) -> None:
    # Given the queue's glimit (every group's limits) holding a string
    q = _lanes(app)
    _string(q, q.keys.glimit)
    # When the views read the queue, Then the groups are listed, each shown as broken,
    # and the queue names the key
    assert q.groups() == {"bad", "ok0", "ok1", "ok2"}
    for stats in (app.stats(), LaneTable(q).stats()):
        assert f"{q.keys.glimit} holds a string" in " ".join(stats["corrupt"])
        assert {r["state"] for r in stats["groups"].values()} == {"corrupt"}
    assert f"{q.keys.glimit} holds a string" in app.lane("ok0")["corrupt"]


def test_a_queue_wide_key_of_the_wrong_type_is_named_by_stats(app: App) -> None:
    q = _lanes(app)
    _string(q, q.keys.delayed)
    _string(q, q.keys.tally)
    for stats in (app.stats(), LaneTable(q).stats()):
        text = " ".join(stats["corrupt"])
        assert f"{q.keys.delayed} holds a string" in text
        assert f"{q.keys.tally} holds a string" in text
        assert stats["delayed"] == 0 and stats["groups"]["ok0"]["state"] == "ready"


def _cli(app: App, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, EMQ_REDIS_URL=app.settings.redis_url,
               EMQ_QUEUE=app.settings.queue)
    return subprocess.run([sys.executable, "-m", "emqtasks", *args], env=env, text=True,
                          capture_output=True, timeout=30)


def test_the_stats_and_lane_commands_show_a_broken_group_in_one_line(app: App) -> None:
    q = _lanes(app)
    q.client.hset(q.keys.glimit, "bad", "two")
    _string(q, q.keys.lane("ok2"))
    out = _cli(app, "stats")
    assert out.returncode == 0 and out.stderr == "", out.stderr
    bad = [line for line in out.stdout.splitlines() if "corrupt" in line]
    assert len(bad) == 2, out.stdout
    assert bad[0].startswith("bad ") and f"{q.keys.glimit}" in bad[0]
    assert bad[1].startswith("ok2 ") and f"{q.keys.lane('ok2')} holds a string" in bad[1]
    assert any(line.startswith("ok0 ") and "ready" in line for line in out.stdout.splitlines())
    watched = _cli(app, "stats", "--watch", "--watch-count", "1")
    assert watched.returncode == 0 and "Traceback" not in watched.stderr, watched.stderr
    assert f"{q.keys.lane('ok2')} holds a string" in watched.stdout
    lane = _cli(app, "lane", "bad")
    assert lane.returncode == 0 and lane.stderr == "", lane.stderr
    assert lane.stdout.splitlines()[0] == (f"group bad: corrupt: its limit ({q.keys.glimit}) "
                                           "is 'two', not an integer")


def test_the_lanes_page_and_metrics_show_a_broken_group(app: App) -> None:
    q = _lanes(app)
    _string(q, q.keys.lane("bad"))
    with DashServer([q]) as d:
        status, body, _ = d.request("/lanes")
        assert status == 200, body
        assert f"{q.keys.lane('bad')} holds a string" in body and "ok0" in body
        assert d.request("/lanes?state=corrupt")[0] == 200
        assert d.request("/")[0] == 200
        status, text, _ = d.request("/metrics")
        assert status == 200
        assert f'emqtasks_groups{{queue="{q.name}",state="corrupt"}} 1' in text


# -- job rows ---------------------------------------------------------------------------------

def _dead(app: App, q: Queue, n: int) -> list[str]:
    t = make_task(app, name="tests.dead", group="d")
    ids = [t.delay(i).id for i in range(n)]
    for _ in ids:
        (lease,) = q.claim()
        q.retry(lease, "boom", 0, True)
    return ids


def test_a_job_key_of_the_wrong_type_is_a_corrupt_key_naming_it(app: App) -> None:
    q = app.queue()
    good, bad = _dead(app, q, 2)
    _string(q, q.keys.job(bad))
    # App.job and a handle's view: a named error, not WRONGTYPE
    with pytest.raises(CorruptKey, match=f"{q.keys.job(bad)} holds a string") as caught:
        app.job(bad)
    assert caught.value.keys == (q.keys.job(bad),)
    assert app.job(good)["state"] == "dead"
    # dead_jobs: every dead job listed, the broken one saying why
    views = {j["id"]: j for j in app.dead_jobs()}
    assert views[good]["corrupt"] is None and views[good]["error"] == "boom"
    assert f"{q.keys.job(bad)} holds a string" in views[bad]["corrupt"]


def test_the_job_and_dead_commands_say_a_broken_job_in_one_line(app: App) -> None:
    q = app.queue()
    good, bad = _dead(app, q, 2)
    _string(q, q.keys.job(bad))
    out = _cli(app, "job", bad)
    assert out.returncode == 1 and out.stdout == "", out
    assert out.stderr.count("\n") == 1 and f"{q.keys.job(bad)} holds a string" in out.stderr
    dead = _cli(app, "dead")
    assert dead.returncode == 0 and dead.stderr == "", dead.stderr
    assert good in dead.stdout and f"{q.keys.job(bad)} holds a string" in dead.stdout


def test_the_job_page_names_a_job_key_of_the_wrong_type(app: App) -> None:
    q = app.queue()
    _good, bad = _dead(app, q, 2)
    _string(q, q.keys.job(bad))
    with DashServer([q]) as d:
        status, body, _ = d.request(f"/job?id={bad}")
        assert 400 <= status < 600 and "internal error" not in body
        assert f"{q.keys.job(bad)} holds a string" in body


@pytest.mark.parametrize("path", ["/dead", "/jobs?state=dead", "/jobs?state=pending",
                                  "/jobs?state=dead&task=tests.dead"])
def test_the_job_lists_show_the_healthy_jobs_past_a_broken_key(app: App, path: str) -> None:
    # Given a dead job key and a lane holding strings
    q = app.queue()
    good, bad = _dead(app, q, 2)
    _string(q, q.keys.job(bad))
    waiting = make_task(app, name="tests.wait", group=lambda g: g).map([("a",), ("b",)])
    _string(q, q.keys.lane("a"))
    with DashServer([q]) as d:
        status, body, _ = d.request(path)
        assert status == 200, body
        assert (waiting[1].id if "pending" in path else good) in body


def test_a_handles_status_names_a_job_key_of_the_wrong_type(app: App) -> None:
    handle = make_task(app).delay(1)
    q = app.queue()
    _string(q, q.keys.job(handle.id))
    with pytest.raises(CorruptKey, match=f"{q.keys.job(handle.id)} holds a string"):
        handle.status()


# -- /metrics: the stale-ack tally --------------------------------------------------------------

def test_metrics_count_the_stale_acks(app: App) -> None:
    q = app.queue()
    make_task(app).delay(1)
    (lease,) = q.claim()
    assert q.release(lease)
    assert not q.ack(lease).verdict            # refused: the lease is not current
    assert queue_stats(q)["stale_acks"] == 1
    text = Exporter([q]).render()
    assert "# TYPE emqtasks_stale_acks_total counter" in text
    assert f'emqtasks_stale_acks_total{{queue="{q.name}"}} 1' in text
