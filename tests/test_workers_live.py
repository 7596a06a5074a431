"""Live workers: each master's heartbeat, App.workers() and `emqtasks workers`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
import worker_tasks as wt
from day2 import wait_until
from workerproc import WorkerProc

from emqtasks import App, __version__
from emqtasks._dev.localserver import LocalRedis

pytestmark = pytest.mark.timeout(90)


def _cli(url: str, queue: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, EMQ_REDIS_URL=url, EMQ_QUEUE=queue)
    return subprocess.run([sys.executable, "-m", "emqtasks", *args], env=env, text=True,
                          capture_output=True, timeout=30)


def test_a_running_master_is_listed_with_its_heartbeat_and_leaves_at_its_stop(app: App) -> None:
    # Given a worker with two children
    with WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=2, tick=0.3) as w:
        w.wait_ready()
        # Then it is listed at once (the start writes a beat), with what it says of itself
        w.wait_for(lambda: app.workers(), 10)
        (row,) = app.workers()
        assert row["pid"] == w.pid and row["host"] == socket.gethostname()
        assert row["queues"] == [app.settings.queue] and row["concurrency"] == 2
        assert row["version"] == __version__ and abs(row["started"] - time.time()) < 60
        # When its children run long jobs, Then a later beat counts them busy
        handles = [app.send_task(wt.sleepy, (f"b{i}", 3.0)) for i in range(2)]
        w.wait_for(lambda: app.workers()[0]["busy"] == 2, 10)
        for h in handles:
            h.get(timeout=20)
        # And the CLI lists it too
        out = _cli(app.settings.redis_url, app.settings.queue, "workers", "--json")
        assert out.returncode == 0, out.stderr
        assert [r["pid"] for r in json.loads(out.stdout)] == [w.pid]
        text = _cli(app.settings.redis_url, app.settings.queue, "workers")
        assert str(w.pid) in text.stdout and "/2" in text.stdout
        assert w.stop() == 0
    # When it stopped, Then it is gone from the list
    assert app.workers() == []
    assert "no live workers" in _cli(app.settings.redis_url, app.settings.queue,
                                     "workers").stdout


def test_a_killed_master_expires_after_a_few_ticks(app: App) -> None:
    w = WorkerProc(app.settings.redis_url, app.settings.queue, concurrency=1, tick=1.0)
    try:
        w.wait_ready()
        w.wait_for(lambda: app.workers(), 10)
        w.kill()
    finally:
        w.kill()
    # 3 ticks (at least 3 s): the key expires by itself, the index entry is dropped on read
    wait_until(lambda: not app.workers(), 15, "the killed master's heartbeat to expire")
    assert app.workers() == []
    assert app.client.hlen(app.queue().keys.base + "workers") == 0


def _calls(client: Any) -> dict[str, int]:
    stats = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()
            if k != "cmdstat_info"}


def test_the_heartbeat_keeps_an_idle_master_within_one_command_a_second() -> None:
    # Given an idle master on a server of its own, with a 1 s tick (ten times the default)
    with LocalRedis() as server:
        app = App(redis_url=server.url, queue="idle")
        with WorkerProc(server.url, "idle", concurrency=1, tick=1.0) as w:
            w.wait_ready(30)
            w.wait_for(lambda: app.workers(), 10)
            time.sleep(2.0)
            before = _calls(app.client)
            time.sleep(6.0)
            after = _calls(app.client)
            delta = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
            print(f"idle master, 1 s tick, in 6 s: {delta}")
            # Then the beat is two commands a tick (SET, HSET), sent with the tick's reap in
            # one round trip; the round trips of a tick stay reap, promote and one BLPOP
            # (scripts' own calls counted apart): at the default 10 s tick, 0.4 a second.
            # The reap script also raises the queue's clock mark (an HSET a tick, counted
            # here on the Lua path; the module's own writes are not commands).
            assert 5 <= delta.get("set", 0) <= 7
            assert delta.get("hset", 0) in (delta["set"], 2 * delta["set"]), delta
            top = delta.get("evalsha", 0) + delta.get("blpop", 0)
            assert top <= 3 * 7, delta
            assert w.stop() == 0
        app.close()
