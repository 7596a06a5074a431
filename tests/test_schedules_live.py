"""Periodic schedules in real worker processes on a real server: several masters and one job
per slot, catch-up after downtime, overlap control, a cron schedule declared in code firing
end to end, the CLI reaching a running worker, and the idle cost of schedules."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
import schedule_tasks  # noqa: F401  (a producer that imports its tasks: App.schedule knows them)
from workerproc import HERE as TASKS
from workerproc import WorkerProc

from emqtasks import App
from emqtasks._dev.localserver import LocalRedis
from emqtasks.schedules.schedule import ScheduleStore

pytestmark = pytest.mark.timeout(120)
MODULES = ("schedule_tasks",)
CATCHUP_LINE = re.compile(r"schedule '(?P<name>[^']+)': (?P<n>\d+) missed slot\(s\) after "
                          r"(?P<last>\d+) up to (?P<t0>\d+); catch-up '(?P<policy>\w+)' "
                          r"enqueues (?P<k>\d+)")


def _slots(app: App, name: str) -> dict[int, dict[str, Any]]:
    """slot -> job row view, for the rows of one schedule's slots."""
    q = app.queue()
    prefix = q.keys.job(f"sched:{name}:")
    out = {}
    for key in q.scan(prefix + "*"):
        tail = key[len(prefix):]
        if tail.isdigit():
            view = app.job(f"sched:{name}:{tail}")
            if view is not None:
                out[int(tail)] = view
    return dict(sorted(out.items()))


def _now(app: App) -> float:
    return ScheduleStore(app.queue()).server_seconds()


def _wait(what: str, predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _started(url: str, queue: str, n: int = 1, **options: Any) -> list[WorkerProc]:
    workers = [WorkerProc(url, queue, modules=options.pop("modules", MODULES), **options)
               for _ in range(n)]
    for w in workers:
        w.wait_ready(30)
    return workers


def _stop(workers: list[WorkerProc]) -> None:
    """A warm stop of them all at once (one SIGTERM each), each exit checked."""
    for w in workers:
        if w.proc.poll() is None:
            w.signal(15)
    for w in workers:
        try:
            w.proc.wait(30)
        finally:
            w.stop(5)
        assert w.proc.returncode == 0, w.output()


# -- a cron schedule declared in code, observed in the background of this module ------------

@pytest.fixture(scope="module")
def cron_worker(redis_url: str) -> Iterator[tuple[WorkerProc, App]]:
    queue = f"t-cron-{uuid.uuid4().hex[:8]}"
    app = App(redis_url=redis_url, queue=queue)
    worker = _started(redis_url, queue, modules=("cron_tasks",), concurrency=1, tick=0.5)[0]
    yield worker, app
    worker.stop(30)
    app.purge()
    app.close()


@pytest.fixture(scope="module", autouse=True)
def _cron_runs_while_the_other_tests_do(cron_worker: tuple[WorkerProc, App]) -> None:
    """Started with the module's first test, so the minute-long wait overlaps the others."""


# -- several masters, one job per slot -------------------------------------------------------

def test_three_workers_enqueue_every_slot_exactly_once(redis_url: str, app: App) -> None:
    app.schedule("three", "s.tick", every=1, args=("three",))
    workers = _started(redis_url, app.settings.queue, n=3, concurrency=1)
    try:
        start = _now(app)
        time.sleep(5.0)    # five slots, each raced for by the three masters
        end = _now(app)
        # No more slots (the masters see it within a tick), and the last ones run out: a
        # warm stop right after a slot was enqueued would leave its job waiting.
        app.unschedule("three")
        _wait("the last slots to run", lambda: all(
            r["state"] == "done" for r in _slots(app, "three").values()), 15)
    finally:
        _stop(workers)
    rows = _slots(app, "three")
    span = [s for s in rows if start < s <= end]
    assert span == list(range(span[0], span[0] + len(span))), "a slot is missing"
    # the whole seconds the window crossed, give or take the one at either edge (a slot at
    # the window's end may be fired a tick later: 4 of 5 in a window of 5.0007 s)
    crossed = math.floor(end) - math.floor(start)
    assert abs(len(span) - crossed) <= 1, (len(span), crossed, end - start)
    assert all(r["state"] == "done" and r["attempts"] == 1 for r in rows.values())
    runs = int(app.queue().client.hget(f"t:{app.settings.queue}:runs", "three") or 0)
    assert runs == len(rows)                               # each slot's job ran once
    assert all("schedules kept by this master: three" in w.output() for w in workers)


# -- catch-up after downtime -----------------------------------------------------------------

def test_catch_up_after_downtime_latest_all_none(redis_url: str, app: App) -> None:
    for policy in ("latest", "all", "none"):
        app.schedule(f"cu-{policy}", "s.tick", every=1, args=(policy,), catchup=policy)
    workers = _started(redis_url, app.settings.queue, concurrency=1)
    store = ScheduleStore(app.queue())
    _wait("a first slot of each", lambda: all(
        "lastid" in store.state().get(f"cu-{p}", {}) for p in ("latest", "all", "none")), 10)
    _stop(workers)
    state = store.state()
    last = {p: int(state[f"cu-{p}"]["last"]) for p in ("latest", "all", "none")}
    _wait("five missed slots", lambda: _now(app) >= max(last.values()) + 5.3, 20)
    workers = _started(redis_url, app.settings.queue, concurrency=1)
    try:
        lines = {}
        _wait("the catch-up lines", lambda: len(lines.update(
            {m["policy"]: m for m in CATCHUP_LINE.finditer(workers[0].output())})
            or lines) == 3, 10)
        t0 = int(lines["all"]["t0"])
        _wait("a live slot", lambda: all(max(_slots(app, f"cu-{p}")) > t0
                                         for p in ("latest", "all", "none")), 10)
    finally:
        _stop(workers)
    for policy, m in lines.items():
        missed = list(range(last[policy] + 1, int(m["t0"]) + 1))
        assert int(m["n"]) == len(missed) >= 5
        fired = [s for s in _slots(app, f"cu-{policy}") if last[policy] < s <= int(m["t0"])]
        expected = {"latest": missed[-1:], "all": missed, "none": []}[policy]
        assert fired == expected, (policy, fired, missed)
        assert int(m["k"]) == len(expected)


# -- overlap control -------------------------------------------------------------------------

def test_overlap_false_never_has_two_jobs_of_a_schedule_in_flight(redis_url: str,
                                                                  app: App) -> None:
    app.schedule("slow", "s.slow", every=1, args=("slow", 2.2), overlap=False)
    key = f"t:{app.settings.queue}:spans:slow"
    workers = _started(redis_url, app.settings.queue, concurrency=3)
    try:
        # two runs of 2.2 s ended, and two slots skipped meanwhile (~5 s): three children
        # free, each second's slot refused while a run is in flight
        _wait("two runs and two skipped slots", lambda: app.queue().client.llen(key) >= 2
              and sum(r["state"] == "skipped" for r in _slots(app, "slow").values()) >= 2, 20)
    finally:
        _stop(workers)   # a warm stop lets the running job finish
    spans = sorted(tuple(map(float, s.split())) for s in app.queue().client.lrange(key, 0, -1))
    assert len(spans) >= 2
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end, spans
    rows = _slots(app, "slow")
    skipped = [r for r in rows.values() if r["state"] == "skipped"]
    assert len(skipped) >= 2 and "still active" in (skipped[0]["error"] or "")
    assert len([r for r in rows.values() if r["state"] == "done"]) == len(spans)


# -- the CLI reaches a running worker --------------------------------------------------------

def _cli(url: str, queue: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(TASKS), os.environ.get("PYTHONPATH")])))   # for -A schedule_tasks
    return subprocess.run([sys.executable, "-m", "emqtasks.cli", *args, "--redis-url", url,
                           "-Q", queue], capture_output=True, text=True, timeout=30, env=env)


def test_schedule_add_run_remove_from_the_cli_reach_a_running_worker(redis_url: str,
                                                                     app: App) -> None:
    q = app.settings.queue
    runs = f"t:{q}:runs"
    client = app.queue().client
    workers = _started(redis_url, q, concurrency=1)
    try:
        bad = _cli(redis_url, q, "schedule", "add", "nope", "s.nope", "--every", "1")
        assert bad.returncode == 2 and "'s.nope'" in bad.stderr and not app.schedules()
        # The queue's first schedule: the task is known through its module (-A), as for
        # `emqtasks worker`; from then on the workers note what they serve on the queue.
        added = _cli(redis_url, q, "schedule", "add", "cli", "s.tick", "--every", "1",
                     "--args", '["cli"]', "-A", "schedule_tasks")
        assert added.returncode == 0, added.stderr
        _wait("runs of the added schedule", lambda: int(client.hget(runs, "cli") or 0) >= 2, 8)
        plain = _cli(redis_url, q, "schedule", "add", "cli2", "s.tick", "--every", "3600",
                     "--args", '["cli2"]')
        assert plain.returncode == 0, plain.stderr
        assert _cli(redis_url, q, "schedule", "remove", "cli2").returncode == 0
        listed = json.loads(_cli(redis_url, q, "schedules", "--json").stdout)
        assert [(r["name"], r["spec"], r["args"]) for r in listed] == [("cli", "every 1s",
                                                                        ["cli"])]
        ran = _cli(redis_url, q, "schedule", "run", "cli")
        job_id = ran.stdout.strip()
        assert ran.returncode == 0 and job_id.startswith("sched:cli:run-"), ran.stderr
        _wait("the extra run", lambda: (app.job(job_id) or {}).get("state") == "done", 8)
        removed = _cli(redis_url, q, "schedule", "remove", "cli")
        assert removed.returncode == 0, removed.stderr
        time.sleep(1.0)                          # within one tick (0.2 s), and a slot's run
        before = int(client.hget(runs, "cli") or 0)
        time.sleep(2.0)
        assert int(client.hget(runs, "cli") or 0) == before
        assert _cli(redis_url, q, "schedule", "remove", "cli").returncode == 1
    finally:
        _stop(workers)


# -- idle cost -------------------------------------------------------------------------------

def _calls(client: Any) -> dict[str, int]:
    stats = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()
            if k not in ("cmdstat_info",)}


def test_ten_hourly_schedules_cost_an_idle_worker_no_commands(tmp_path: Any) -> None:
    minute = (datetime.now(timezone.utc).minute + 30) % 60   # far from now: nothing fires
    with LocalRedis() as with_s, LocalRedis() as without_s:
        queue = "idle"
        app = App(redis_url=with_s.url, queue=queue)
        for i in range(10):
            app.schedule(f"hourly-{i}", "s.tick", cron=f"{minute} * * * *", args=(f"h{i}",))
        workers = [WorkerProc(server.url, queue, modules=MODULES, concurrency=1, tick=1.0)
                   for server in (with_s, without_s)]
        try:
            for w in workers:
                w.wait_ready(30)
            time.sleep(2.5)                           # past the start-up commands
            clients = [app.queue().client, App(redis_url=without_s.url).client]
            first = [_calls(c) for c in clients]
            time.sleep(6.0)
            last = [_calls(c) for c in clients]
        finally:
            _stop(workers)
        deltas = [{k: b[k] - a.get(k, 0) for k in b if b[k] - a.get(k, 0)}
                  for a, b in zip(first, last)]
        rates = [sum(d.values()) / 6.0 for d in deltas]
        print("commands/s with 10 hourly schedules / with none:", rates, deltas)
        # Both read the schedules' version once per tick; ticks may land 1 apart in 6 s.
        per_tick = sum(deltas[1].values()) / 6.0
        assert rates[0] <= rates[1] + per_tick / 6.0 + 0.01, deltas
        assert abs(deltas[0].get("get", 0) - deltas[1].get("get", 0)) <= 1, deltas
        app.close()


# -- the cron schedule declared in code, end to end (last: its wait overlapped the others) --

def test_a_cron_schedule_declared_in_code_fires_in_a_live_worker(
        cron_worker: tuple[WorkerProc, App], redis_url: str) -> None:
    worker, app = cron_worker
    q = app.settings.queue
    key = f"t:{q}:minutely"
    _wait("the minutely cron slot", lambda: app.queue().client.llen(key) >= 1, 75)
    worker.stop(30)
    rows = _slots(app, "c.minutely")
    assert rows and all(s % 60 == 0 for s in rows)
    ran = [float(x) for x in app.queue().client.lrange(key, 0, -1)]
    assert len(ran) == len(rows) and all(r["state"] == "done" for r in rows.values())
    assert 0 <= ran[0] - min(rows) < 5
    listed = json.loads(_cli(redis_url, q, "schedules", "--json").stdout)   # no worker now
    assert [(r["name"], r["spec"], r["tz"], r["origin"]) for r in listed] == [
        ("c.minutely", "cron * * * * *", "Europe/Paris", "code")]
    assert listed[0]["last_id"] == f"sched:c.minutely:{max(rows)}"
    assert listed[0]["last_state"] == "done"
