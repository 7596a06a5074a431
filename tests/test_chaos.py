"""The chaos soak, short: a few thousand jobs over 50 groups while children, masters,
connections and an AOF (appendfsync always) server are killed, poisoned rows are written,
the server is filled, stalled and its clock stepped (with libfaketime), a master is frozen
and a pool partitioned; then the soak's history is checked (history_check.py, proven able
to fail by tests/test_history_check.py). The long form is
``emqtasks bench --chaos SECONDS``; its figures are in the README (Reliability). The
``--sentinel`` mode's short run: failovers of a Sentinel-managed primary with durable writes."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import redis
from faults import wait_until

from emqtasks._dev.chaos import EVENTS, OPTIONAL, SENTINEL_EVENTS, Soak
from emqtasks._dev.chaos_report import Report
from emqtasks._dev.localserver import LocalRedis
from emqtasks._dev.relay import Relay

#: One of each kind of fault comes first (~0.9 s apart; the soak goes on past its time until
#: all ten have struck; nine without libfaketime), and well over 1,000 jobs at 180 a second.
SECONDS = 10


@pytest.mark.timeout(300)
def test_no_acknowledged_job_is_lost_under_chaos() -> None:
    # Given two pools and a producer, When every kind of fault strikes at random for 10 s
    # (longer if one has not struck yet)
    # (a partition of 2.5-4 s here: long enough to outlast the lease and the socket timeout)
    report = Soak(SECONDS, rate=180, partition_seconds=(2.5, 4.0)).run()
    print("\n".join(report.lines()))
    # Then each fault happened, and every promise held: each acknowledged enqueue done (or,
    # for the jobs made to fail, dead), each poisoned job dead with its reason, nothing
    # lost, nothing else dead, the queue clean (after a repair of poisoned books only)
    assert all(report.events[name] >= 1 for name in EVENTS if name not in report.skipped), \
        report.events
    assert set(report.skipped) <= set(OPTIONAL), report.skipped
    assert report.jobs > 1000
    assert report.lost == [] and report.unexpected_dead == [] and report.undead == []
    assert sum(report.poisoned.values()) >= 1 and report.unburied == []
    assert report.check_ok, report.violations
    # and its history holds: every acknowledged enqueue (jobs, chords) ran to done or dead,
    # no job started again after its ack was acknowledged, no fenced-out holder's result
    # was stored, no chord's callback started before its members ended, every get() read
    # the stored result
    assert report.operations.get("ack ok", 0) > 1000 and report.operations.get("get ok", 0) > 0
    assert report.chords > 0
    assert report.history_violations == [], "\n".join(report.history_violations)
    assert report.ok, "\n".join(report.lines())
    # Duplicates are allowed (at-least-once) and only counted; a bound far above what a
    # lost ack gives (16 extra runs in 24,020 jobs over 60 s) still catches a broken fence
    assert report.max_runs <= 5 and report.extra_runs < report.jobs // 20


@pytest.mark.timeout(120)
def test_no_acknowledged_job_is_lost_over_sentinel_failovers() -> None:
    # Given a primary, two replicas and three sentinels, the producer and workers on its
    # redis+sentinel:// URL with durable writes (a replica's copy before a call returns),
    # When the primary is SIGKILLed and a replica promoted, again and again, among kills and
    # freezes of the workers, for 5 s (longer until each fault has struck, two failovers)
    report = Soak(5, rate=180, sentinel=True).run()
    print("\n".join(report.lines()))
    # Then there were failovers, and no acknowledged enqueue or ack was lost over them:
    # every enqueue that returned ran to done (or dead by its retry policy), no job whose ack
    # was acknowledged started again, check is clean, the history holds
    assert set(report.events) == {*SENTINEL_EVENTS, "worker_restarts"}
    assert all(report.events[name] >= 1 for name in SENTINEL_EVENTS), report.events
    assert report.events["failovers"] >= 2, report.events
    assert report.jobs > 500 and report.operations.get("ack ok", 0) > 500
    assert report.lost == [] and report.unexpected_dead == [] and report.undead == []
    assert report.check_ok, report.violations
    assert report.history_violations == [], "\n".join(report.history_violations)
    assert report.ok, "\n".join(report.lines())


def test_a_worker_error_over_sentinel_fails_the_soak_and_on_one_server_is_counted() -> None:
    # Given two clean soaks' reports whose workers logged one ERROR (a child that exited on
    # a reply it took for a refusal, as one did over a failover before the fix)
    error = "worker-0.log: ERROR child 3 exited ... Refused: the previous master is now a slave"
    sentinel = Report(120, 29, "7.0.15", 2, 3, jobs=100, check_ok=True, sentinel=True,
                      worker_errors=[error])
    single = Report(120, 29, "7.0.15", 2, 3, jobs=100, check_ok=True, worker_errors=[error])
    # Then over Sentinel the soak fails (a failover is an outage to ride out) and on one
    # server, where poisoned rows and a full server make workers log what they handle, the
    # error is reported but not judged
    assert not sentinel.ok and "FAILED" in sentinel.lines()[-1]
    assert single.ok and "worker log errors: 1" in "\n".join(single.lines())


def test_sentinel_without_chaos_is_refused_in_one_line() -> None:
    out = subprocess.run([sys.executable, "-m", "emqtasks.cli", "bench", "--sentinel"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "--chaos" in out.stderr, out.stderr


def test_a_stalled_relay_is_a_partition_that_delivers_when_it_heals(
        private_redis: LocalRedis) -> None:
    # Given a client behind the relay the soak partitions one pool with
    relay = Relay(private_redis.port)
    client = redis.Redis(port=relay.port, socket_timeout=0.3, retry=None)
    server = private_redis.client()
    try:
        assert client.ping()
        # When the relay stalls, a call times out, and a command sent into the partition by a
        # client that then gives up and closes is not run yet
        relay.stall()
        with pytest.raises(redis.exceptions.TimeoutError):
            client.ping()
        with socket.create_connection(("127.0.0.1", relay.port)) as raw:
            raw.sendall(b"INCR healed\r\n")
        assert server.get("healed") is None
        # Then once it resumes, what was sent arrives, and calls are answered again
        relay.resume()
        wait_until(lambda: server.get("healed") == "1", 5, "the command sent into the partition")
        assert client.ping()
    finally:
        client.close()
        server.close()
        relay.close()


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
