"""Periodic schedules against a real server, without workers: the schedule verb (put, drop,
fire and its marker), App.schedule / unschedule / schedules / run_schedule, bad input, and
the master's Scheduler driven in-process as two masters would."""

from __future__ import annotations

import time
from typing import Any

import pytest
import schedule_tasks

from emqtasks import (
    App,
    FireVerdict,
    InvalidCron,
    InvalidInterval,
    InvalidScheduleName,
    UnknownSchedule,
    UnknownTask,
    UnknownTimezone,
)
from emqtasks.producer.registry import Registry
from emqtasks.schedules.schedule import (
    ScheduleStore,
    build_slot_job,
    make_schedule,
    register_declared,
    slot_id,
)
from emqtasks.worker.child import Runner
from emqtasks.worker.scheduler import Scheduler

pytestmark = pytest.mark.timeout(60)


def _registry() -> Registry:
    reg = Registry()
    for t in (schedule_tasks.tick, schedule_tasks.quick, schedule_tasks.slow):
        reg.add(t)
    return reg


def _wait_server_past(store: ScheduleStore, moment: float, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while store.server_seconds() < moment:
        assert time.monotonic() < deadline, "the server clock did not move"
        time.sleep(0.02)


def _stored(app: App) -> dict[str, str]:
    q = app.queue()
    return dict(q.client.hgetall(q.keys.schedules))


# -- the verb ------------------------------------------------------------------------------

def test_a_slot_is_refused_a_second_time_even_after_its_row_is_gone(app: App) -> None:
    """result_ttl=0 deletes a finished row at once: the marker alone refuses the slot."""
    store = ScheduleStore(app.queue())
    s = app.schedule("quick", schedule_tasks.quick, every=1, args=("q",))
    spec = schedule_tasks.quick.spec
    now = int(store.server_seconds())
    slot = s.timing.latest_at_or_before(now) or now
    _wait_server_past(store, slot + 1.001)   # the put marked slots up to its own second
    slot += 1
    job = build_slot_job(spec, s, slot_id("quick", slot), 1_000_000)
    assert store.fire(s, slot, job).verdict == FireVerdict.ENQUEUED
    outcome = Runner(app.queue(), _registry()).run_once()
    assert outcome is not None and outcome.verdict == "done"
    assert app.job(job.id) is None                       # ttl 0: the row is gone
    again = store.fire(s, slot, job)
    assert (again.verdict, again.last) == (FireVerdict.DUPLICATE, slot)
    older = build_slot_job(spec, s, slot_id("quick", slot - 1), 1_000_000)
    assert store.fire(s, slot - 1, older).verdict == FireVerdict.DUPLICATE
    assert app.job(older.id) is None
    future = build_slot_job(spec, s, slot_id("quick", slot + 60), 1_000_000)
    assert store.fire(s, slot + 60, future).verdict == FireVerdict.EARLY
    assert app.job(future.id) is None
    assert app.unschedule("quick") is True
    assert store.fire(s, slot + 1, job._replace(id=slot_id("quick", slot + 1))).verdict \
        == FireVerdict.GONE
    assert app.queue().claim(1) == []


def test_a_slot_joins_a_full_lane_and_is_not_counted_as_enqueued(app: App) -> None:
    """A slot's row has the same writer as a producer's job (lua/lib/jobrow.lua new_job),
    with the differences lua/schedule.lua gives: no lane cap (the slot is marked handled
    before its job is written: a refusal would lose it), no count in the history's
    `enqueued`."""
    # Given a lane at its cap, and a schedule into it that owes its slot
    app.set_group_max_size("capped", 1)
    app.send_task(schedule_tasks.quick, ("a",), group="capped")
    s = app.schedule("capq", schedule_tasks.quick, every=1, args=("q",), group="capped")
    store = ScheduleStore(app.queue())
    slot = int(store.server_seconds())
    app.queue().client.hset(app.queue().keys.schedstate, "capq:last", slot - 1)
    job = build_slot_job(schedule_tasks.quick.spec, s, slot_id("capq", slot), 1_000_000)
    # When the slot fires
    assert store.fire(s, slot, job).verdict == FireVerdict.ENQUEUED
    # Then its job waits in the full lane, and only the producer's job counts as enqueued
    assert app.lane("capped")["pending"] == 2
    assert app.history(minutes=1)["groups"]["capped"]["enqueued"] == 1


def test_put_bumps_the_version_only_on_change_and_the_marker_only_on_new_timing(
        app: App) -> None:
    store = ScheduleStore(app.queue())
    v0 = store.version()
    app.schedule("p1", schedule_tasks.tick, every=5, args=("a",))
    v1 = store.version()
    last1 = int(store.state()["p1"]["last"])
    assert v1 != v0 and abs(last1 - store.server_seconds()) < 5
    app.schedule("p1", schedule_tasks.tick, every=5, args=("a",))      # unchanged
    assert store.version() == v1
    app.queue().client.hset(app.queue().keys.schedstate, "p1:last", last1 - 100)
    app.schedule("p1", schedule_tasks.tick, every=5, args=("b",))      # args only
    assert store.version() != v1 and int(store.state()["p1"]["last"]) == last1 - 100
    app.schedule("p1", schedule_tasks.tick, every=7, args=("b",))      # new timing
    assert int(store.state()["p1"]["last"]) >= last1                   # owes nothing before


# -- the App API ---------------------------------------------------------------------------

def test_app_schedules_lists_spec_next_run_and_the_last_job(app: App) -> None:
    app.schedule("daily", schedule_tasks.tick, cron="30 2 * * *", tz="Europe/Paris",
                 args=("d",), catchup="all", overlap=False)
    app.schedule("often", "s.tick", every=3, args=("o",), jitter=0.5)
    infos = {i.name: i for i in app.schedules()}
    assert set(infos) == {"daily", "often"}
    d = infos["daily"]
    assert (d.task, d.spec, d.tz, d.last_id, d.last_state) == (
        "s.tick", "cron 30 2 * * *", "Europe/Paris", None, None)
    assert d.next_run is not None and d.next_run.timestamp() > time.time()
    assert d.to_dict()["catchup"] == "all" and d.to_dict()["overlap"] is False
    o = infos["often"]
    assert o.next_run is not None and int(o.next_run.timestamp()) % 3 == 0
    handle = app.run_schedule("often")
    assert handle.id.startswith("sched:often:run-") and handle.status() == "pending"
    assert app.queue().claim(1)[0].id == handle.id
    with pytest.raises(UnknownSchedule, match="'nope'"):
        app.run_schedule("nope")
    assert app.unschedule("often") is True and app.unschedule("often") is False
    assert [i.name for i in app.schedules()] == ["daily"]


@pytest.mark.parametrize("call, error, quoted", [
    (dict(name="b1", task="s.nope", every=5), UnknownTask, "'s.nope'"),
    (dict(name="b2", task="s.tick", cron="0 0 * *", args=("x",)), InvalidCron, "'0 0 * *'"),
    (dict(name="b3", task="s.tick", cron="0 9 * * *", tz="Moon/Base", args=("x",)),
     UnknownTimezone, "'Moon/Base'"),
    (dict(name="b4", task="s.tick", every=0.2, args=("x",)), InvalidInterval, "0.2"),
    (dict(name="sched:b5", task="s.tick", every=5, args=("x",)), InvalidScheduleName,
     "'sched:b5'"),
])
def test_bad_input_is_refused_at_the_call_and_nothing_is_stored(
        app: App, call: dict[str, object], error: type[Exception], quoted: str) -> None:
    before = ScheduleStore(app.queue()).version()
    name, task = call.pop("name"), call.pop("task")
    with pytest.raises(error) as err:
        app.schedule(name, task, **call)  # type: ignore[arg-type]
    assert quoted in str(err.value)
    assert _stored(app) == {} and ScheduleStore(app.queue()).version() == before


def test_arguments_that_do_not_fit_the_task_are_refused(app: App) -> None:
    from emqtasks import InvalidSchedule

    with pytest.raises(InvalidSchedule, match="cannot be called"):
        app.schedule("fits", schedule_tasks.slow, every=5, args=("only-one",))
    assert _stored(app) == {}


def test_worker_start_stores_code_schedules_and_drops_the_undeclared_ones(app: App) -> None:
    store = ScheduleStore(app.queue())
    specs = {t.name: t.spec for t in _registry().tasks().values()}
    code = make_schedule("c1", "s.tick", every=60, args=("c",))
    assert register_declared(store, [code], specs) == (["c1"], [])
    app.schedule("rt", "s.tick", every=60, args=("r",))          # stored at runtime
    assert register_declared(store, [code], specs) == ([], [])   # unchanged: no bump
    assert register_declared(store, [], specs) == ([], ["c1"])   # gone from the code
    assert set(_stored(app)) == {"rt"}                           # runtime ones stay
    assert store.task_known("s.tick") is not None and store.task_known("s.nope") is None
    with pytest.raises(UnknownTask):
        register_declared(store, [make_schedule("c2", "s.nope", every=5)], specs)


# -- the Scheduler, as masters run it --------------------------------------------------------

def test_two_schedulers_enqueue_each_slot_once_and_honour_jitter(app: App) -> None:
    app.schedule("two", schedule_tasks.tick, every=1, args=("two",), jitter=0.4)
    a, b = Scheduler(_registry()), Scheduler(_registry())
    b.run_due(app.queue())
    b.offset = (b.offset or 0.0) + 0.3       # a skewed clock: the script judges by the server
    end = time.monotonic() + 3.2
    q = app.queue()
    while time.monotonic() < end:
        wait = min(a.run_due(q), b.run_due(q))
        time.sleep(min(max(wait, 0.005), 0.2))
    ids = sorted(q.client.zrange(q.keys.delayed, 0, -1, withscores=True))
    slots = [int(i.rsplit(":", 1)[1]) for i, _ in ids]
    assert len(slots) >= 2 and slots == list(range(slots[0], slots[0] + len(slots)))
    for job_id, due in ids:
        slot = int(job_id.rsplit(":", 1)[1])
        assert slot * 1000 <= due <= slot * 1000 + 400 + 300   # jitter (+ firing late)
    assert q.claim(1) == []                                    # all still delayed (jitter)


def test_a_scheduler_picks_up_a_removed_schedule_on_its_next_look(app: App) -> None:
    app.schedule("gone", schedule_tasks.tick, every=1, args=("g",))
    s = Scheduler(_registry())
    s.run_due(app.queue())
    assert set(s.entries) == {"gone"}
    app.unschedule("gone")
    s.run_due(app.queue(), look=False)
    assert set(s.entries) == {"gone"}         # no look, no read
    s.run_due(app.queue(), look=True)
    assert s.entries == {}


# -- the command line, without a worker ------------------------------------------------------

def test_the_schedule_commands_without_a_worker(app: App, redis_url: str) -> None:
    from click.testing import CliRunner

    from emqtasks.cli import main

    q = app.settings.queue

    def run(*args: str) -> Any:
        return CliRunner().invoke(main, [*args, "--redis-url", redis_url, "-Q", q])

    unknown = run("schedule", "add", "s1", "s.tick", "--every", "5", "--args", '["x"]')
    assert unknown.exit_code == 2 and "'s.tick'" in unknown.output    # no worker noted it
    added = run("schedule", "add", "s1", "s.tick", "--every", "5", "--args", '["x"]',
                "-A", "schedule_tasks")                               # known through -A
    assert added.exit_code == 0, added.output
    assert "schedule s1 stored: s.tick every 5s (UTC)" in added.output
    misfit = run("schedule", "add", "s2", "s.slow", "--every", "5", "-A", "schedule_tasks")
    assert misfit.exit_code == 2 and "cannot be called" in misfit.output
    paris = run("schedule", "add", "s3", "s.tick", "--cron", "0 9 * * mon-fri", "--tz",
                "Europe/Paris", "--args", '["p"]', "--no-overlap", "-A", "schedule_tasks")
    assert paris.exit_code == 0, paris.output
    table = run("schedules").output.splitlines()
    assert table[0].split() == ["name", "task", "spec", "tz", "next", "run", "last", "job",
                                "state"]
    assert table[1].split()[:3] == ["s1", "s.tick", "every"]
    assert "Europe/Paris" in table[2] and ("+0200" in table[2] or "+0100" in table[2])
    assert {s.name: s.schedule.overlap for s in app.schedules()} == {"s1": True, "s3": False}
    assert run("schedule", "run", "nope").exit_code == 1
    assert run("schedule", "remove", "nope").exit_code == 1
    assert run("schedule", "remove", "s1").exit_code == 0
    assert run("schedule", "add", "s4", "s.tick", "--every", "x").exit_code == 2
    assert [s.name for s in app.schedules()] == ["s3"]


# -- on a Redis Cluster ----------------------------------------------------------------------

@pytest.mark.timeout(90)
def test_schedules_on_a_redis_cluster_live_in_the_queues_slot() -> None:
    from cluster import ClusterServers

    from emqtasks.store.keys import QueueKeys

    servers = ClusterServers.start_or_skip()
    try:
        name = servers.queues_on_every_shard("sc")[1]
        app = App(redis_url=servers.url, queue=name)
        app.schedule("cl", schedule_tasks.tick, every=1, args=("cl",))
        sched = Scheduler(_registry())
        store = ScheduleStore(app.queue())
        sched.run_due(app.queue())
        _wait_server_past(store, min(e.next for e in sched.entries.values()) + 0.01)
        sched.run_due(app.queue())
        # The first look fires too when the schedule's second has already turned: take
        # every firing, and the last one listed is one of them, running.
        leases = app.queue().claim(10)
        assert leases and {(x.id[:9], x.task) for x in leases} == {("sched:cl:", "s.tick")}
        info = app.schedules()[0]
        assert info.name == "cl" and info.last_state == "active"
        assert info.last_id == max((x.id for x in leases), key=lambda i: int(i.rsplit(":", 1)[1]))
        owner = servers.master_of_queue(name)
        with servers.node(owner) as node:   # every key of it on the queue's node
            held = set(node.scan_iter(match=QueueKeys(name).all_pattern, count=1000))
        assert {app.queue().keys.schedules, app.queue().keys.schedstate,
                app.queue().keys.schedver} <= held
        assert app.unschedule("cl") is True
        app.purge()
        app.close()
    finally:
        servers.close()
