"""Several queues per worker: strict order, weights, waking for either, bad -Q lists."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import day2_tasks as d2
import pytest
from day2 import cleanup, enqueue, key, start, wait_until
from workerproc import HERE

from emqtasks import App

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def two(app: App):  # type: ignore[no-untyped-def]
    """Two more queue names on the test's server, purged afterwards."""
    a, b = f"qa-{uuid.uuid4().hex[:8]}", f"qb-{uuid.uuid4().hex[:8]}"
    yield a, b
    for name in (a, b):
        app.queue(name).purge()
    cleanup(app, a, b)


def _order(app: App, first: str) -> list[str]:
    # the tasks record under the worker's first queue
    return list(app.client.lrange(key(app, "order", first), 0, -1))


def test_strict_order_serves_a_before_any_b(app: App, two: tuple[str, str]) -> None:
    a, b = two
    # Given both queues backlogged while the worker is not there
    enqueue(app, d2.sync_record, [(f"b:{i}",) for i in range(40)], queue=b)
    enqueue(app, d2.sync_record, [(f"a:{i}",) for i in range(40)], queue=a)
    # When one child serves -Q a,b
    with start(app, concurrency=1, queues=f"{a},{b}") as w:
        wait_until(lambda: len(_order(app, a)) >= 80, 30, "80 jobs", w.output)
    # Then every a job started before any b job, and each knew its queue
    order = _order(app, a)
    assert [t[0] for t in order] == ["a"] * 40 + ["b"] * 40, order
    queue_of = app.client.hgetall(key(app, "queue_of", a))
    assert {queue_of[f"a:{i}"] for i in range(40)} == {a}
    assert {queue_of[f"b:{i}"] for i in range(40)} == {b}


def test_weights_serve_three_to_one(app: App, two: tuple[str, str]) -> None:
    a, b = two
    enqueue(app, d2.sync_record, [(f"a:{i}",) for i in range(400)], queue=a)
    enqueue(app, d2.sync_record, [(f"b:{i}",) for i in range(400)], queue=b)
    with start(app, concurrency=2, queues=f"{a}:3,{b}:1") as w:
        wait_until(lambda: len(_order(app, a)) >= 400, 60, "400 jobs", w.output)
        w.stop()
    first = _order(app, a)[:400]
    # served with both backlogged: 3:1 within 10%
    ratio = sum(1 for t in first if t[0] == "a") / max(1, sum(1 for t in first if t[0] == "b"))
    assert 2.7 <= ratio <= 3.3, ratio


def test_one_worker_wakes_for_either_queue(app: App, two: tuple[str, str]) -> None:
    a, b = two
    with start(app, concurrency=2, queues=f"{a},{b}") as w:
        time.sleep(0.5)   # parked
        latencies = []
        for i, q in enumerate([a, b, b, a, b, a]):
            sent = time.monotonic()
            enqueue(app, d2.sync_record, [(f"w:{i}",)], queue=q)
            wait_until(lambda i=i: len(_order(app, a)) > i, 5, f"job {i}", w.output)
            latencies.append(time.monotonic() - sent)
            time.sleep(0.2)
        # "the usual latency": a few ms; generous for a shared 2-core machine
        assert sorted(latencies)[len(latencies) // 2] < 0.25, latencies
        assert max(latencies) < 2.0, latencies


def test_weighted_worker_serves_a_lone_queue_fully(app: App, two: tuple[str, str]) -> None:
    a, b = two
    enqueue(app, d2.sync_record, [(f"b:{i}",) for i in range(50)], queue=b)
    with start(app, concurrency=2, queues=f"{a}:5,{b}:1") as w:
        wait_until(lambda: len(_order(app, a)) >= 50, 30, "50 jobs of b", w.output)


def _worker_cli(app: App, *args: str) -> subprocess.CompletedProcess[str]:
    import os

    env = dict(os.environ, PYTHONPATH=str(HERE))
    return subprocess.run([sys.executable, "-m", "emqtasks.cli", "worker", "-A", "day2_tasks",
                           "--redis-url", app.settings.redis_url, *args],
                          capture_output=True, text=True, timeout=30, env=env)


@pytest.mark.parametrize("args, says", [
    (["-Q", "a,,b"], "an empty queue name"),
    (["-Q", "a:0,b:1"], "must be an integer >= 1"),
    (["-Q", "a:x,b:1"], "must be an integer >= 1"),
    (["-Q", "a,b,a"], "'a' is listed twice"),
    (["-Q", "a:2,b"], "give every queue a weight"),
    (["-Q", "a,b{x}"], "invalid queue name"),
    (["--async-concurrency", "0"], "--async-concurrency"),
])
def test_bad_worker_input_is_one_line_and_exit_2(app: App, args: list[str], says: str) -> None:
    result = _worker_cli(app, *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("emqtasks: error:"), result.stderr
    assert says in lines[0], lines[0]


def test_stats_names_each_queue_of_a_list(app: App, two: tuple[str, str]) -> None:
    import json

    from click.testing import CliRunner

    from emqtasks.cli import main

    a, b = two
    enqueue(app, d2.sync_record, [(f"a:{i}",) for i in range(3)], queue=a)
    enqueue(app, d2.sync_record, [(f"b:{i}",) for i in range(2)], queue=b)
    url = app.settings.redis_url
    out = CliRunner().invoke(main, ["stats", "--redis-url", url, "-Q", f"{a},{b}"])
    assert out.exit_code == 0, out.output
    assert f"queue {a}: 3 pending" in out.output and f"queue {b}: 2 pending" in out.output
    out = CliRunner().invoke(main, ["stats", "--redis-url", url, "-Q", f"{a}:3,{b}:1",
                                    "--json"])
    data = json.loads(out.output)
    assert [(q["queue"], q["pending"]) for q in data["queues"]] == [(a, 3), (b, 2)]
