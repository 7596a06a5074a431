"""Faults of the server: SCRIPT FLUSH under a running worker; Redis SIGKILLed under load, with
AOF (no acknowledged job lost) and without persistence (the worker neither wedges nor spins)."""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

import fault_tasks as ft
import pytest
import redis
from faults import Rec, assert_clean, enqueue, quiet, start_worker, wait_until

from emqtasks import App
from emqtasks._dev.localserver import LocalRedis
from emqtasks.ops.check import check, repair
from emqtasks.store.functions import functions_wanted, library

# -- SCRIPT FLUSH under a running worker -------------------------------------------------

@pytest.mark.timeout(60)
def test_script_flush_under_a_running_worker_is_transparent(private_redis: LocalRedis,
                                                            queue_name: str) -> None:
    app = App(redis_url=private_redis.url, queue=queue_name)
    q = app.queue()
    admin = private_redis.client()
    r = Rec(admin, queue_name)
    stop = threading.Event()
    flushes = [0]

    def flusher() -> None:
        rnd = random.Random(8)
        while not stop.wait(0.02 + rnd.random() * 0.08):
            admin.script_flush()
            flushes[0] += 1

    try:
        with start_worker(app.settings.redis_url, queue_name) as w:
            thread = threading.Thread(target=flusher, daemon=True)
            thread.start()
            tags = [f"s{i % 3}:{i}" for i in range(300)]
            for i in range(0, len(tags), 20):
                enqueue(app, ft.count, [(t,) for t in tags[i:i + 20]])
                time.sleep(0.1)
            wait_until(lambda: len(r.all_runs()) == len(tags), 30, "every job run", w)
            stop.set()
            thread.join(5)
            wait_until(lambda: quiet(q), 10, "a quiet queue", w)
            assert all(v == 1 for v in r.all_runs().values())
            assert w.proc.poll() is None and w.stop() == 0
            out = w.log_path.read_text()
            assert "Traceback" not in out and "error" not in out.lower(), out[-3000:]
            assert flushes[0] >= 10
        assert_clean(q)
    finally:
        stop.set()
        app.close()


# -- Redis SIGKILLed under load ----------------------------------------------------------

def _load(app: App, tags: list[str], batch: int, pause: float, ok: list[str],
          failed: list[str], progress: threading.Event, at: int) -> None:
    """Enqueue in batches at a steady pace; a batch that raised is recorded as refused
    (it may or may not have been applied) and the producer moves on."""
    for i in range(0, len(tags), batch):
        chunk = tags[i:i + batch]
        try:
            enqueue(app, ft.count, [(t,) for t in chunk])
            ok.extend(chunk)
        except (redis.RedisError, OSError):
            failed.extend(chunk)
            time.sleep(0.1)
        if i + batch >= at:
            progress.set()
        time.sleep(pause)


def _commands(client: Any) -> int:
    stats = client.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k not in ("cmdstat_info",))


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.timeout(120)
def test_redis_crash_with_aof_always_under_load_loses_no_acknowledged_job(
        queue_name: str) -> None:
    with LocalRedis(persist=True) as srv:
        app = App(redis_url=srv.url, queue=queue_name)
        q = app.queue()
        tags = [f"g{i % 16}:{i}" for i in range(6_000)]   # the crash at 3,000, 3,000 after
        ok: list[str] = []
        failed: list[str] = []
        halfway = threading.Event()
        try:
            with start_worker(srv.url, queue_name, concurrency=4, tick=0.1) as w:
                loader = threading.Thread(target=_load, args=(app, tags, 100, 0.03, ok, failed,
                                                              halfway, 3000), daemon=True)
                loader.start()
                assert halfway.wait(30)
                # A consumer that will never come back holds a few leases across the crash
                zombie = q.claim(5)
                assert len(zombie) == 5
                srv.kill()              # SIGKILL: a crash, no shutdown save
                time.sleep(1.5)         # longer than the 1 s leases
                srv.start()             # same port, same AOF directory
                loader.join(60)
                assert not loader.is_alive()
                r = Rec(srv.client(), queue_name)
                wait_until(lambda: set(ok) <= set(r.all_runs()), 60,
                           "every acknowledged job to complete", w)
                wait_until(lambda: quiet(q), 20, "a quiet queue", w)
                runs = r.all_runs()
                assert all(runs[t] >= 1 for t in ok)
                zombie_ids = {lease.id for lease in zombie}
                assert all(q.status(i) == "done" for i in zombie_ids)
                out = w.output()
                assert "Redis unavailable" in out and "Redis is back" in out
                assert "reaped expired leases" in out
                if "Lua scripts" in out:   # the restarted server was sent the scripts again,
                    # or runs them as a library (store/functions.py: kept in the AOF)
                    admin = srv.client()
                    assert (int(admin.info("memory")["number_of_cached_scripts"]) > 0
                            or (functions_wanted()
                                and library()[0] in str(admin.execute_command("FUNCTION",
                                                                              "LIST"))))
                    admin.close()
                assert w.proc.poll() is None
                print(f"{len(ok)} acknowledged, {len(failed)} refused by the outage, "
                      f"{sum(v > 1 for v in runs.values())} ran twice")
                assert_clean(q)
                assert w.stop() == 0
        finally:
            app.close()


@pytest.mark.timeout(120)
def test_redis_crash_without_persistence_does_not_wedge_or_spin_the_worker(
        queue_name: str) -> None:
    with LocalRedis() as srv:
        app = App(redis_url=srv.url, queue=queue_name)
        q = app.queue()
        tags = [f"g{i % 16}:{i}" for i in range(6_000)]   # the crash at 3,000, 3,000 after
        ok: list[str] = []
        failed: list[str] = []
        halfway = threading.Event()
        try:
            # tick 2 s: the tick is the idle cost (reap + promote + one park per tick, and
            # commandstats counts the commands the two scripts run inside as well)
            with start_worker(srv.url, queue_name, concurrency=4, tick=2.0) as w:
                loader = threading.Thread(target=_load, args=(app, tags, 100, 0.03, ok, failed,
                                                              halfway, 3000), daemon=True)
                loader.start()
                assert halfway.wait(30)
                admin = srv.client()
                r = Rec(admin, queue_name)
                done_before = set(r.all_runs())   # the records die with the data too
                srv.kill()
                time.sleep(1.5)
                srv.start()             # empty: everything of before is gone
                loader.join(60)
                assert not loader.is_alive()
                wait_until(lambda: quiet(q), 30, "the surviving backlog to drain", w)
                done = done_before | set(r.all_runs())
                lost = [t for t in ok if t not in done]
                print(f"{len(ok)} acknowledged, {len(failed)} refused by the outage, "
                      f"{len(lost)} acknowledged but lost with the unpersisted data")
                # The worker carries on: new work after the restart runs, each job once
                fresh = [f"new{i % 4}:{i}" for i in range(200)]
                enqueue(app, ft.count, [(t,) for t in fresh])
                wait_until(lambda: all(r.runs(t) == 1 for t in fresh), 20, "fresh jobs", w)
                wait_until(lambda: quiet(q), 10, "a quiet queue", w)
                # ... and idles cheaply: no spin, few commands
                time.sleep(1.5)
                pids = [w.pid, *w.children()]
                cpu0 = sum(_cpu(p) for p in pids)
                before = _commands(admin)
                time.sleep(2.0)
                rate = (_commands(admin) - before) / 2.0
                cpu = sum(_cpu(p) for p in pids) - cpu0
                print(f"idle: {rate:.1f} commands/s, {cpu:.2f} s CPU in 2 s")
                assert rate < 10, rate
                assert cpu < 0.3, cpu
                report = check(q)
                if not report.ok:
                    print("before repair:", report.violations)
                    repair(q)
                assert_clean(q)
                assert w.proc.poll() is None and w.stop() == 0
        finally:
            app.close()
