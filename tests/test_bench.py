"""`emqtasks bench --quick --json` as users run it: a smoke test of the benchmark command.

The fairness and peer benchmarks run alone, first: they measure shares and rates that other
load would skew. The others only check that their figures were measured, and wait mostly on
worker start-ups and fixed windows: the first of them to run starts all that are selected at
once, each on its own private server(s), and each test then checks its own.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from emqtasks.native import module_path

#: The benchmarks run side by side, by the test that checks each: its command's arguments.
_TOGETHER: dict[str, list[str]] = {
    # 500 jobs a drain (2,000 by default with --quick): each figure is still measured
    "test_quick_bench_reports_throughput_and_fairness": ["--quick", "--jobs", "500", "--json"],
    "test_quick_workflow_bench_a_chain_step_rides_on_the_ack": [
        "--workflows", "--quick", "--json"],
    # One request per page (--quick asks 3 for a median): each page is still timed
    "test_quick_dashboard_bench_times_the_pages_on_10000_groups": [
        "--dashboard", "--quick", "--runs", "1", "--json"],
    "test_the_cluster_benchmark_reports_one_to_three_queues": [
        "--cluster", "--quick", "--jobs", "300", "--json"],
    "test_the_server_cpu_bench_splits_each_path_per_verb_beside_the_floor": [
        "--server-cpu", "--quick", "--jobs", "300", "--json"],
    "test_the_tracing_bench_measures_a_drain_off_with_the_api_and_with_the_sdk": [
        "--tracing", "--quick", "--jobs", "300", "--json"],
}


def _can_run(name: str) -> bool:
    """False where the test skips (so its benchmark is not started for nothing)."""
    if "dashboard" in name:
        return importlib.util.find_spec("jinja2") is not None
    if "cluster" in name:
        return shutil.which("redis-server") is not None
    return True


class _Bench:
    """``emqtasks bench ARGS`` started now, its output in files (pipes left unread while
    another test runs could fill and stall it)."""

    def __init__(self, args: list[str], folder: Path) -> None:
        self.args = [sys.executable, "-m", "emqtasks.cli", "bench", *args]
        self.out: IO[str] = open(folder / "stdout", "w+")
        self.err: IO[str] = open(folder / "stderr", "w+")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(self.args, stdout=self.out, stderr=self.err, text=True)

    def result(self, timeout: float) -> subprocess.CompletedProcess[str]:
        """Its exit, within ``timeout`` seconds of its start (as subprocess.run's timeout)."""
        try:
            self.proc.wait(max(0.0, self.started + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.close()
            raise
        self.out.seek(0)
        self.err.seek(0)
        return subprocess.CompletedProcess(self.args, self.proc.returncode, self.out.read(),
                                           self.err.read())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.out.close()
        self.err.close()


@pytest.fixture(scope="module")
def benches(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, _Bench]]:
    """Every selected benchmark of _TOGETHER, started at once."""
    selected = {item.name for item in request.session.items
                if item.module is request.module and item.name in _TOGETHER}
    started = {name: _Bench(_TOGETHER[name], tmp_path_factory.mktemp("bench"))
               for name in sorted(selected) if _can_run(name)}
    try:
        yield started
    finally:
        for bench in started.values():
            bench.close()


def _run(benches: dict[str, _Bench], request: pytest.FixtureRequest,
         timeout: float) -> subprocess.CompletedProcess[str]:
    """The result of the test's own benchmark (started on its own if the fixture did not)."""
    name = request.node.name
    if name not in benches:
        benches[name] = _Bench(_TOGETHER[name], Path(tempfile.mkdtemp(prefix="emq-bench-")))
    return benches[name].result(timeout)


_PEERS = [m for m in ("huey", "dramatiq") if importlib.util.find_spec(m) is not None]


@pytest.mark.skipif(not _PEERS, reason="neither huey nor dramatiq installed: "
                                        "pip install 'emqtasks[peers]'")
@pytest.mark.timeout(150)
def test_quick_peer_bench_measures_each_installed_peer_side_by_side() -> None:
    # Given Huey and/or Dramatiq installed, When the quick peer comparison runs
    proc = subprocess.run(
        [sys.executable, "-m", "emqtasks.cli", "bench", "--peers", "--quick", "--json"],
        check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)

    # Then emqtasks (on the module, and on the scripts when the module is built: the bench's
    # server loads it) and every installed peer have positive throughput and Redis figures
    ours = {"emqtasks", "emq-lua"} if module_path() is not None else {"emqtasks"}
    assert set(report["systems"]) == {*ours, *_PEERS}, report["skipped"]
    for name, system in report["systems"].items():
        figures = system["figures"]
        for key in ("enqueue_one_jobs_s", "enqueue_bulk_jobs_s", "drain_jobs_s",
                    "drain_cmds_per_job", "drain_redis_cpu_us_per_job",
                    "wake_latency_p50_ms"):
            assert figures[key] is not None and figures[key] > 0, (name, key, report["notes"])
        assert figures["idle_cmds_per_s"] is not None, name
        assert figures["flood_before_quiet"] is not None, (name, report["notes"])
    # And each peer (the Lua column too) has a ratio emqtasks/peer for the drain
    for peer in {*_PEERS, *ours} - {"emqtasks"}:
        assert report["ratios"][peer]["drain_jobs_s"] > 0
    # And no drain got stuck
    assert not [n for n in report["notes"] if "stuck" in n or "did not" in n], report["notes"]


@pytest.mark.timeout(150)
def test_quick_fairness_bench_prints_the_share_table_and_claim_costs() -> None:
    # Given the CLI, When the quick turns-vs-time benchmark runs on its own private server
    proc = subprocess.run(
        [sys.executable, "-m", "emqtasks.cli", "bench", "--fairness", "--quick", "--json"],
        check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    figures = report["figures"]
    # Then turns gives the light group a sliver of the pool and time about half
    assert figures["light_share_turns"] < 0.2, report
    assert 0.3 < figures["light_share_time"] < 0.7, report
    # the share table, then the tenant flood's, then time mode's with tenants
    shares = report["shares"]
    assert len(shares) == 14, shares
    assert any(line.startswith("time mode,") for line in shares), shares
    assert figures["tenant_time_ratio"] is not None, report
    # And the tenant flood: B's jobs all start within its first 30 claims with two levels
    assert figures["tenant_flood_last_b_two_level"] <= 30, report
    assert figures["tenant_flood_last_b_groups_only"] > figures["tenant_flood_last_b_two_level"]
    # And every claim cost was measured
    for mode in ("turns", "time"):
        assert figures[f"claim_cpu_us_{mode}_10"] > 0
        assert figures[f"claim_cost_ratio_{mode}"] is not None


@pytest.mark.timeout(150)
def test_quick_bench_reports_throughput_and_fairness(
        benches: dict[str, _Bench], request: pytest.FixtureRequest) -> None:
    # Given the CLI, When the quick benchmark runs on its own private server
    proc = _run(benches, request, timeout=120)
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


def test_quick_workflow_bench_a_chain_step_rides_on_the_ack(
        benches: dict[str, _Bench], request: pytest.FixtureRequest) -> None:
    # Given the CLI, When the quick workflow benchmark runs on its own private server
    proc = _run(benches, request, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout)["figures"]
    # Then a chain step costs the round trips of a plain job (one script call: the
    # hand-over rides on the ack), and the chord's callback ran once
    assert figures["wf_trips_plain"] == pytest.approx(1.0, abs=0.01)
    assert figures["wf_trips_chain"] == pytest.approx(figures["wf_trips_plain"], abs=0.01)
    assert figures["wf_chord_callbacks"] == 1
    for key in ("wf_chain_steps", "wf_chord_members", "wf_chain_enqueue"):
        assert figures[key] > 0, key


@pytest.mark.timeout(120)
def test_the_tracing_bench_measures_a_drain_off_with_the_api_and_with_the_sdk(
        benches: dict[str, _Bench], request: pytest.FixtureRequest) -> None:
    proc = _run(benches, request, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["jobs"] == 300 and report["worker_problems"] == []
    for mode in ("off", "api", "sdk"):
        assert report["figures"][mode]["drain"] > 0, mode
        assert report["figures"][mode]["worker_cpu_us"] > 0, mode


@pytest.mark.timeout(300)
def test_quick_dashboard_bench_times_the_pages_on_10000_groups(
        benches: dict[str, _Bench], request: pytest.FixtureRequest) -> None:
    pytest.importorskip("jinja2")
    proc = _run(benches, request, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["groups"] == 10_000 and report["dead"] == 20_000
    for key in ("dash_lanes_ms", "dash_lanes_page100_ms", "dash_dead_ms",
                "dash_dead_search_ms", "dash_dead_count_ms", "dash_metrics_ms"):
        assert report["figures"][key] > 0, key


@pytest.mark.timeout(120)
def test_the_cluster_benchmark_reports_one_to_three_queues(
        benches: dict[str, _Bench], request: pytest.FixtureRequest) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server binary on PATH: cannot start a Redis Cluster")
    proc = _run(benches, request, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)["rows"]
    assert [r["queues"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["one_server_jobs_s"] > 0 and r["cluster_jobs_s"] > 0
        assert r["cluster_shards_used"] == r["queues"]   # each queue on its own shard


@pytest.mark.timeout(150)
def test_the_server_cpu_bench_splits_each_path_per_verb_beside_the_floor(
        benches: dict[str, _Bench], request: pytest.FixtureRequest) -> None:
    # Given the CLI, When `bench --server-cpu` runs (a private server per path)
    proc = _run(benches, request, 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    paths = ["lua"] + (["native"] if module_path() is not None else [])
    for path in paths:
        res = report["results"][path]
        # Then each path has its floor: a PING, an empty EVALSHA, an empty verb
        assert set(res["floor"]) == {"ping", "evalsha_empty", "verb_empty"}, res
        assert all(v > 0 for v in res["floor"].values()), res
        # And the server's CPU per enqueue and per drained job, split per command
        # (the scripts' path: FCALL of the library where the server has Functions, else
        # EVALSHA)
        lua = "fcall" if "fcall" in res["enqueue"]["verbs"] else "evalsha"
        verbs = {"native": ("emq.enqueue", "emq.ack"), "lua": (lua, lua)}[path]
        for kind, verb in zip(("enqueue", "drain"), verbs):
            assert res[kind]["cpu_us"] > 0, res
            assert res[kind]["verbs"][verb]["per_unit"] >= 1.0, res[kind]
        # the drained job's own INCR is counted in its figure
        assert res["drain"]["verbs"]["incrby"]["per_unit"] == 1.0, res["drain"]


@pytest.mark.timeout(60)
def test_the_lua_probe_splits_the_helpers_and_the_steps_of_ack() -> None:
    # Given the probe of where a Lua verb's time goes, When it runs 50 times each script
    proc = subprocess.run([sys.executable, "-m", "emqtasks._dev.bench.luaprobe", "-n", "50"],
                          check=False, capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Then each verb's helpers are timed and sized, and every probed step of ack is there
    for verb in ("enqueue", "claim", "ack", "extend"):
        assert f"  {verb} " in proc.stdout, proc.stdout
    for step in ("the helpers", "the fence", "the history", "the claim of the next job"):
        assert f"  {step} " in proc.stdout, proc.stdout
