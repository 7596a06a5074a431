"""The chaos soak, short: a few thousand jobs over 50 groups while children, masters,
connections and an AOF (appendfsync always) server are killed, poisoned rows are written,
the server is filled, a master is frozen and a pool partitioned. The long form is
``emqtasks bench --chaos SECONDS``; its figures are in the README (Reliability)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from emqtasks._dev.chaos import EVENTS, Soak

SECONDS = 25


@pytest.mark.timeout(300)
def test_no_acknowledged_job_is_lost_under_chaos() -> None:
    # Given two pools and a producer, When every kind of fault strikes at random for 25 s
    report = Soak(SECONDS, rate=150).run()
    print("\n".join(report.lines()))
    # Then each fault happened, and every promise held: each acknowledged enqueue done (or,
    # for the jobs made to fail, dead), each poisoned job dead with its reason, nothing
    # lost, nothing else dead, the queue clean (after a repair of poisoned books only)
    assert all(report.events[name] >= 1 for name in EVENTS), report.events
    assert report.jobs > 1000
    assert report.lost == [] and report.unexpected_dead == [] and report.undead == []
    assert sum(report.poisoned.values()) >= 1 and report.unburied == []
    assert report.check_ok, report.violations
    assert report.ok, "\n".join(report.lines())
    # Duplicates are allowed (at-least-once) and only counted; a bound far above what a
    # lost ack gives (16 extra runs in 24,020 jobs over 60 s) still catches a broken fence
    assert report.max_runs <= 5 and report.extra_runs < report.jobs // 20


def test_the_chaos_command_refuses_a_server_it_would_not_own() -> None:
    out = subprocess.run([sys.executable, "-m", "emqtasks.cli", "bench", "--chaos", "10",
                          "--redis-url", "redis://127.0.0.1:1/0"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0 and "private server of its own" in out.stderr


@pytest.mark.parametrize("seconds", ["nan", "inf", "-inf", "0", "-5", "4", "3601", "soon"])
def test_a_chaos_duration_that_is_not_a_finite_span_is_one_line_and_exit_2(
        seconds: str) -> None:
    out = subprocess.run([sys.executable, "-m", "emqtasks.cli", "bench", "--chaos", seconds],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("emqtasks: error: "), \
        out.stderr
    assert "--chaos" in out.stderr and out.stdout == ""
