"""`emqtasks bench --quick --json` as users run it: a smoke test of the benchmark command."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.timeout(150)
def test_quick_bench_reports_throughput_and_fairness() -> None:
    # Given the CLI, When the quick benchmark runs on its own private server
    proc = subprocess.run(
        [sys.executable, "-m", "emqtasks.cli", "bench", "--quick", "--json"],
        check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    figures = report["figures"]

    # Then every throughput figure is a positive rate
    for key in ("enqueue_one_jobs_s", "enqueue_batch_jobs_s", "drain_10_groups_jobs_s",
                "drain_1_group_jobs_s", "enqueue_batch_many_groups_jobs_s",
                "drain_many_groups_jobs_s"):
        assert figures[key] is not None and figures[key] > 0, (key, report["notes"])
    # And the Redis-side and latency figures were measured
    assert figures["drain_cmds_per_job"] > 0
    assert figures["wake_latency_p50_ms"] is not None and figures["wake_latency_p50_ms"] > 0
    assert figures["idle_cmds_per_s"] is not None
    # And a quiet group's job starts before 10 jobs of a flood backlog have
    assert figures["fairness_flood_before_quiet"] is not None
    assert figures["fairness_flood_before_quiet"] < 10, report["rows"]
    # And no drain got stuck
    assert not [n for n in report["notes"] if n.startswith("stuck")], report["notes"]
