"""The fairness controls: per-group rate limits, RateLimited back-offs, lane caps,
defaults for every group, priorities inside a lane, and each lane's state."""

from __future__ import annotations

import time

import pytest
from helpers import count_keys, make_task
from workerproc import WorkerProc

from emqtasks import App, InvalidArgument, LaneFull, RateLimited
from emqtasks.cli import main
from emqtasks.ops.check import check, repair
from emqtasks.store.queue import Queue

pytestmark = pytest.mark.timeout(90)


def _starts(app: App, group: str) -> list[tuple[str, int]]:
    rows = app.client.lrange(f"t:{app.settings.queue}:starts:{group}", 0, -1)
    return [(tag, int(ms)) for tag, ms in (row.rsplit(":", 1) for row in rows)]


def _claimed_at(app: App, ids: list[str]) -> list[int]:
    """The server time of each job's (last) claim, from its row."""
    return sorted(int(app.job(i)["started"]) for i in ids)


def _worker(app: App, concurrency: int = 4) -> WorkerProc:
    w = WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=concurrency,
                   modules=("fairness_tasks",), tick=0.5)
    w.wait_ready()
    return w


def test_a_rate_limited_group_keeps_its_rate_and_another_group_runs_at_full_speed(
        app: App) -> None:
    # Given a group held to 5 jobs/s with 40 waiting, and another group with 200
    app.set_group_rate("slow", 5, per=1.0)
    app.pause()
    slow = [app.send_task("f.tick", ("slow", f"s{i}"), job_id=f"slow-{i}", group="slow").id
            for i in range(40)]
    fast = [app.send_task("f.tick", ("fast", f"f{i}"), job_id=f"fast-{i}", group="fast").id
            for i in range(200)]
    with _worker(app) as w:
        began = time.monotonic()
        app.resume()
        w.wait_for(lambda: all(app.queue().status(i) == "done" for i in fast), 30,
                   "the fast group")
        fast_took = time.monotonic() - began
        w.wait_for(lambda: all(app.queue().status(i) == "done" for i in slow), 30,
                   "the slow group")
        w.stop()
    claimed = _claimed_at(app, slow)
    # Then no window of one second holds more than 5 of its claims...
    for i, t in enumerate(claimed):
        assert sum(1 for u in claimed[i:] if u < t + 1000) <= 5
    # ...the 40 took about 8 s (a burst of 5, then 5 per second)...
    span = (claimed[-1] - claimed[0]) / 1000
    assert 6.5 <= span <= 10.0, span
    # ...and the other group did not wait for them
    assert fast_took < span / 2
    assert check(app.queue()).ok


def test_rate_limited_from_a_task_backs_the_group_off_without_spending_an_attempt(
        app: App) -> None:
    app.pause()
    app.send_task("f.partner", ("partner", "p1"), job_id="p1", group="partner")
    app.send_task("f.partner", ("partner", "p2"), job_id="p2", group="partner")
    others = [app.send_task("f.tick", ("other", f"o{i}"), job_id=f"o{i}", group="other").id
              for i in range(30)]
    with _worker(app, concurrency=1) as w:   # one child: nothing of the group runs twice
        app.resume()
        w.wait_for(lambda: app.queue().status("p2") == "done", 30, "the partner jobs")
        w.wait_for(lambda: all(app.queue().status(i) == "done" for i in others), 30,
                   "the other group")
        w.stop()
    starts = sorted(ms for _, ms in _starts(app, "partner"))
    first_429 = starts[0]
    # The group sat out ~2 s after each 429 (p1's, then p2's first ask)...
    assert starts[1] - first_429 >= 1800
    assert len(starts) == 4
    # ...the job's attempts did not grow (one attempt spent: the run that succeeded)...
    assert app.job("p1")["attempts"] == 1
    assert app.job("p1")["state"] == "done"
    # ...and the other group kept running meanwhile
    assert any(first_429 < ms < first_429 + 1800 for _, ms in _starts(app, "other"))
    assert check(app.queue()).ok


def test_a_full_lane_refuses_delay_and_map_reports_full_per_call(app: App,
                                                                queue: Queue) -> None:
    t = make_task(app, group=lambda g, *_: g)
    app.set_group_max_size("capped", 3)
    for i in range(3):
        assert t.delay("capped", i).verdict == "enqueued"
    before = count_keys(queue)
    with pytest.raises(LaneFull):
        t.delay("capped", 99)
    assert count_keys(queue) == before
    # map() does not raise: each handle carries its verdict
    app.set_group_max_size("batch", 3)
    handles = t.map([("batch", i) for i in range(10)])
    assert [h.verdict for h in handles] == ["enqueued"] * 3 + ["full"] * 7
    assert [app.job(h.id) is None for h in handles] == [False] * 3 + [True] * 7
    # A countdown is not held to the cap (it joins the lane when due); clearing lifts it
    assert t.apply_async(("capped", 7), countdown=30).verdict == "enqueued"
    app.set_group_max_size("capped", None)
    assert t.delay("capped", 100).verdict == "enqueued"
    # duplicate stays as it was
    h = t.apply_async(("capped", 1), job_id="same")
    assert t.apply_async(("capped", 1), job_id="same").duplicate and h.verdict == "enqueued"
    assert check(queue).ok


def test_defaults_hold_new_groups_and_explicit_settings_win(app: App, queue: Queue) -> None:
    t = make_task(app, group=lambda g, *_: g)
    app.set_group_defaults(limit=1)
    t.map([("newcomer", i) for i in range(3)])
    assert len(queue.claim(3)) == 1                      # held to the default limit
    assert app.lane("newcomer")["state"] == "at_limit"
    assert app.lane("newcomer")["limit_source"] == "default"
    app.set_group_limit("newcomer", 2)                    # an explicit limit wins
    assert len(queue.claim(3)) == 1
    assert app.lane("newcomer")["limit_source"] == "group"
    app.set_group_limit("newcomer", None)                 # back to the default
    app.clear_group_defaults()                            # ...and then to none
    assert len(queue.claim(3)) == 1
    assert app.group_defaults() == {}
    assert check(queue).ok


def test_changing_a_default_moves_waiting_lanes_on_and_off_the_ring(app: App,
                                                                   queue: Queue) -> None:
    t = make_task(app, group=lambda g, *_: g)
    t.map([(g, i) for g in ("a", "b") for i in range(2)])
    queue.claim(2)                                        # one of each in flight
    app.set_group_defaults(limit=1)
    assert queue.client.llen(queue.keys.ring) == 0        # both now at their limit
    assert check(queue).ok
    app.clear_group_defaults("limit")
    assert sorted(queue.client.lrange(queue.keys.ring, 0, -1)) == ["a", "b"]
    assert check(queue).ok


def test_priorities_order_one_lane_and_never_jump_another_groups_turn(app: App,
                                                                      queue: Queue) -> None:
    t = make_task(app, group=lambda g, *_: g)
    app.pause_group("A")
    for name, prio in (("p5a", 5), ("p0a", 0), ("p5b", 5), ("m3", -3), ("p0b", 0)):
        t.apply_async(("A", name), job_id=name, priority=prio)
    t.map([("B", i) for i in range(5)], priority=0)
    app.resume_group("A")
    claimed = [lease for _ in range(10) for lease in queue.claim(1)]
    a_order = [lease.id for lease in claimed if lease.group == "A"]
    assert a_order == ["m3", "p0a", "p0b", "p5a", "p5b"]
    groups = [lease.group for lease in claimed]
    assert groups == ["B", "A"] * 5 or groups == ["A", "B"] * 5
    assert check(queue).ok


def test_every_lane_state_reads_back_through_stats_and_lane(app: App, queue: Queue) -> None:
    t = make_task(app, group=lambda g, *_: g)
    app.set_group_limit("empty", 2)
    t.delay("ready", 1)
    t.delay("paused", 1)
    app.pause_group("paused")
    t.map([("limited", 1), ("limited", 2)])
    app.set_group_limit("limited", 1)
    t.map([("rated", 1), ("rated", 2)])
    app.set_group_rate("rated", 1, per=60)
    leases = {lease.group for lease in queue.claim(10)}
    assert {"limited", "rated", "ready"} <= leases
    t.delay("ready", 2)
    groups = app.stats()["groups"]
    expected = {"empty": "empty", "ready": "ready", "paused": "paused",
                "limited": "at_limit", "rated": "rate_limited"}
    for g, state in expected.items():
        assert groups[g]["state"] == state, g
        assert app.lane(g)["state"] == state, g
    rated = app.lane("rated")
    assert rated["rate"] == (1, 60.0) and rated["rate_source"] == "group"
    assert 55 < rated["ready_at"] - time.time() <= 61
    assert groups["ready"]["ready_at"] is None and groups["ready"]["oldest_age"] >= 0
    assert groups["empty"]["oldest_age"] is None
    app.pause()
    assert app.lane("ready")["state"] == "queue_paused"
    app.resume()
    assert check(queue).ok
    # repair rebuilds the ring and gwait from the lanes and the settings
    queue.client.delete(queue.keys.ring, queue.keys.gwait)
    assert not check(queue).ok
    repair(queue)
    assert check(queue).ok
    assert app.lane("rated")["state"] == "rate_limited"


@pytest.mark.parametrize("bad", [
    lambda app: app.set_group_rate("g", 0),
    lambda app: app.set_group_rate("g", -1),
    lambda app: app.set_group_rate("g", 5, per=0),
    lambda app: app.set_group_rate("g", 5, per=float("nan")),
    lambda app: app.set_group_rate("g", True),
    lambda app: app.set_group_max_size("g", -1),
    lambda app: app.set_group_defaults(rate=(0, 1)),
    lambda app: app.set_group_defaults(limit=0),
    lambda app: make_task(app).apply_async((1,), priority=101),
    lambda app: make_task(app).apply_async((1,), priority=-101),
    lambda app: make_task(app).map([(1,)], priority=2.5),
    lambda app: RateLimited(-1),
])
def test_bad_values_get_a_named_error_and_change_nothing(app: App, queue: Queue,
                                                        bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgument):
        bad(app)
    assert count_keys(queue) == 0


@pytest.mark.parametrize("args", [["rate", "g", "10/0"], ["rate", "g", "0/1"],
                                  ["rate", "g", "fast"], ["maxsize", "g", "-1"],
                                  ["defaults", "--rate", "5/0"], ["defaults", "--limit", "0"]])
def test_bad_values_on_the_command_line_are_one_line_and_exit_2(app: App, queue: Queue,
                                                               args: list[str]) -> None:
    from click.testing import CliRunner

    result = CliRunner().invoke(main, [*args, "--redis-url", app.settings.redis_url,
                                       "-Q", app.settings.queue])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1
    assert "emqtasks: error:" in result.output
    assert count_keys(queue) == 0


def test_the_commands_set_show_and_clear(app: App) -> None:
    from click.testing import CliRunner

    where = ["--redis-url", app.settings.redis_url, "-Q", app.settings.queue]
    run = CliRunner().invoke
    assert run(main, ["rate", "acme", "5/2", *where]).exit_code == 0
    assert app.lane("acme")["rate"] == (5, 2.0)
    assert run(main, ["maxsize", "acme", "10", *where]).exit_code == 0
    assert run(main, ["defaults", "--limit", "3", "--rate", "100/60", *where]).exit_code == 0
    shown = run(main, ["defaults", *where]).output
    assert "limit:" in shown and "100/60s" in shown
    out = run(main, ["lane", "acme", *where]).output
    assert "group acme: empty" in out and "5/2s" in out and "(default)" in out
    assert run(main, ["rate", "acme", "none", *where]).exit_code == 0
    assert app.lane("acme")["rate"] == (100, 60.0)
    assert run(main, ["defaults", "--limit", "none", "--rate", "none", *where]).exit_code == 0
    assert app.group_defaults() == {}
