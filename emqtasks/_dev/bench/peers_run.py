"""`emqtasks bench --peers`: run each system's scenarios in turn and print them side by side."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import click
import redis

from ...config import redacted
from ...store.cluster import is_cluster_url
from ...store.selection import loaded_version
from ..localserver import LocalRedis
from . import producers
from .core import CHUNK, FEW_GROUPS, Bench, BenchError, Sizes, median, percentile, say, tree_pss_mb
from .harness import exit_on_signal, open_server
from .peers import (
    FULL_RUNS,
    LATENCY_SAMPLES,
    PEER_CLASSES,
    PEER_IDLE_SECONDS,
    Peer,
    PeerWorker,
    Row,
    dramatiq_shape,
    installed,
    rows_for,
)
from .scenarios import (
    fairness_drill,
    scenario_drain,
    scenario_latency_and_idle,
)

#: The emqtasks column run on the Lua scripts (EMQ_NATIVE=off), beside the native one.
LUA = "emq-lua"


# -- the scenarios ------------------------------------------------------------------------------
@contextmanager
def peer_worker(b: Bench, peer: Peer) -> Iterator[PeerWorker]:
    """The peer's worker, up (every process polling) and warmed up (a burst drained)."""
    w = peer.start_worker()
    try:
        w.wait_up(peer.ready)
        warm, n = peer.key("warm"), 4 * b.sizes.concurrency
        for _ in range(n):
            peer.send("noop", (warm,))
        if b.wait_count(warm, n, timeout=30)[0] is None:
            raise BenchError(f"the {peer.name} warm-up jobs did not run:\n{w.output()}")
        assert w.start_seconds is not None
        b.worker_starts.append(w.start_seconds)
        time.sleep(0.5)
        yield w
    finally:
        began = time.monotonic()
        code = w.stop()
        b.worker_stops.append(time.monotonic() - began)
        problems = w.problems()
        if code not in (0, None, -signal.SIGTERM):
            problems.append(f"worker exited with {code}")
        b.worker_problems.extend(f"[{peer.name}] {p}" for p in problems)


def measure_peer(b: Bench, peer: Peer,
                 idle_seconds: float) -> tuple[dict[str, float | None], dict[str, float]]:
    """The figures, and the drain's Redis commands per job by command."""
    s = b.sizes
    out: dict[str, float | None] = {}
    mix: dict[str, float] = {}

    one = peer.key("one")
    out.update(_producer_figures(
        "enqueue_one", producers.one_by_one(lambda i: peer.stage_one("noop", (one,)),
                                            s.one_by_one)))
    out.update(_producer_figures(
        "enqueue_threads", producers.threaded(lambda i: peer.stage_one("noop", (one,)),
                                              s.one_by_one)))
    peer.discard_staged()

    done = peer.key("done")
    calls = [(done,)] * s.jobs
    began = time.perf_counter()
    peer.stage_many("noop", calls)   # the drain's backlog, waiting under the staging name
    out["enqueue_bulk_jobs_s"] = s.jobs / (time.perf_counter() - began)

    with peer_worker(b, peer) as w:
        mix = _peer_drain(b, peer, w, done, out)
        _peer_latency(b, peer, out)
        _peer_idle(b, peer, w, idle_seconds, out)
        _peer_fairness(b, peer, out)
    return out, mix


def _peer_drain(b: Bench, peer: Peer, w: PeerWorker, done: str,
                out: dict[str, float | None]) -> dict[str, float]:
    """Release the staged backlog and time it to the last job; the commands it cost."""
    s, mix = b.sizes, {}
    before, cpu0 = b.meter.snapshot(), w.cpu()
    began = time.monotonic()
    own = peer.release_staged()
    finished, polls = b.wait_count(done, s.jobs, timeout=30 + s.jobs / 200)
    after, cpu1 = b.meter.snapshot(), w.cpu()
    if finished is None:
        b.notes.append(f"{peer.name}: the drain of {s.jobs} jobs did not finish")
    else:
        d = b.meter.delta(before, after, own={"get": polls, **own})
        mix = {k: round(v / s.jobs, 3) for k, v in sorted(d.items(), key=lambda kv: -kv[1])
               if k != "cpu" and v / s.jobs >= 0.005}
        out["drain_jobs_s"] = s.jobs / (finished - began)
        out["drain_cmds_per_job"] = b.meter.calls(d) / s.jobs
        out["drain_scripts_per_job"] = b.meter.scripts(d) / s.jobs
        out["drain_redis_cpu_us_per_job"] = d["cpu"] * 1e6 / s.jobs
        out["drain_worker_cpu_us_per_job"] = (cpu1 - cpu0) * 1e6 / s.jobs
    return mix


def _peer_latency(b: Bench, peer: Peer, out: dict[str, float | None]) -> None:
    """Enqueue to start of a lone job, with the pool idle."""
    s = b.sizes
    stamps, latencies = peer.key("stamps"), []
    for _ in range(s.latency_samples):
        time.sleep(peer.wake_gap)
        sent = time.time()
        peer.send("stamp", (stamps,))
        reply = b.client.blpop([stamps], timeout=5)
        if reply is None:
            b.notes.append(f"{peer.name}: a wake-latency job did not start within 5s")
            continue
        latencies.append((float(reply[1]) - sent) * 1000)
    if latencies:
        out["wake_latency_p50_ms"] = statistics.median(latencies)
        out["wake_latency_p90_ms"] = percentile(latencies, 0.9)


def _peer_idle(b: Bench, peer: Peer, w: PeerWorker, idle_seconds: float,
               out: dict[str, float | None]) -> None:
    """Commands and CPU of an idle pool, and its memory."""
    time.sleep(max(0.5, peer.wake_gap))
    before, cpu0, began = b.meter.snapshot(), w.cpu(), time.monotonic()
    time.sleep(idle_seconds)
    after, cpu1, seconds = b.meter.snapshot(), w.cpu(), time.monotonic() - began
    out["idle_cmds_per_s"] = b.meter.calls(b.meter.delta(before, after)) / seconds
    out["idle_worker_cpu_ms_per_s"] = (cpu1 - cpu0) * 1000 / seconds
    out["idle_pss_mb"] = tree_pss_mb(w.proc.pid)


def _peer_fairness(b: Bench, peer: Peer, out: dict[str, float | None]) -> None:
    """The quiet tenant: the flood, then the quiet job, queued before the pool sees them."""
    key, flood = peer.key("seq"), b.sizes.flood
    peer.stage_many("seq", [(key, "flood")] * flood)
    peer.stage_one("seq", (key, "quiet"))
    peer.release_staged()
    reply = b.client.blpop([f"{key}:quiet"], timeout=30 + flood / 200)
    if reply is None:
        b.notes.append(f"{peer.name}: the quiet job did not run")
    else:
        out["flood_before_quiet"] = int(reply[1]) - 1
    if b.wait_count(key, flood + 1, timeout=30 + flood / 200)[0] is None:
        b.notes.append(f"{peer.name}: the flood did not drain")


def _producer_figures(prefix: str, found: dict[str, float]) -> dict[str, float | None]:
    return {f"{prefix}_jobs_s": found["rate"], f"{prefix}_p50_us": found["p50"],
            f"{prefix}_p99_us": found["p99"]}


def measure_producers(b: Bench) -> dict[str, float | None]:
    """delay() one job a call: in a loop, from THREADS threads, from COROUTINES coroutines
    (adelay), all on one App (auto-pipelining as EMQ_AUTOPIPELINE says: off by default)."""
    n, out = b.sizes.one_by_one, {}
    with b.queue() as (app, tasks):
        counter, noop = b.key(app, "done"), tasks["noop"]
        groups = [f"g{i % FEW_GROUPS}" for i in range(max(n, 10 * producers.COROUTINES))]
        noop.delay(counter, groups[0])    # the connection opened, the path learnt
        out.update(_producer_figures(
            "enqueue_one", producers.one_by_one(lambda i: noop.delay(counter, groups[i]), n)))
        out.update(_producer_figures(
            "enqueue_threads", producers.threaded(lambda i: noop.delay(counter, groups[i]),
                                                  n)))

        async def adelay(i: int) -> None:
            await noop.adelay(counter, groups[i])

        out.update(_producer_figures("enqueue_async", producers.coroutines(
            adelay, len(groups), close=app.aclose)))
    return out


def measure_emqtasks(b: Bench) -> dict[str, float | None]:
    """The same figures from emqtasks' own scenarios (bench.py), -c N, 10 groups."""
    out = measure_producers(b)
    drain = scenario_drain(b, FEW_GROUPS)
    out.update({"enqueue_bulk_jobs_s": drain["enqueue"], "drain_jobs_s": drain["drain"],
                "drain_cmds_per_job": drain["cmds"], "drain_scripts_per_job": drain["scripts"],
                "drain_redis_cpu_us_per_job": drain["cpu_us"],
                "drain_worker_cpu_us_per_job": drain["worker_cpu_us"]})
    idle = scenario_latency_and_idle(b)
    out.update({"wake_latency_p50_ms": idle["p50"], "wake_latency_p90_ms": idle["p90"],
                "idle_cmds_per_s": idle["idle_cmds"],
                "idle_worker_cpu_ms_per_s": idle["idle_worker_cpu_ms"],
                "idle_pss_mb": idle["idle_pss_mb"]})
    with b.queue() as (app, tasks), b.worker(app):
        seq = tasks["seq"]
        warm = b.key(app, "seq-warm")
        seq.map([(warm, "warm")] * (4 * b.sizes.concurrency))
        b.wait_count(warm, 4 * b.sizes.concurrency, timeout=30)
        out["flood_before_quiet"] = fairness_drill(b, app, seq, "peers", True)[0]
    return out


# -- running and reporting ----------------------------------------------------------------------
@dataclass
class PeersRun:
    """One ``bench --peers``: what it measured, and with what."""

    sizes: Sizes
    names: list[str]
    versions: dict[str, str]
    skipped: list[str]
    peer_idle: float
    concurrency: int
    results: dict[str, list[dict[str, float | None]]] = field(default_factory=dict)
    mixes: dict[str, dict[str, float]] = field(default_factory=dict)  # drain cmds per job
    redis_version: str = "?"
    elapsed: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)
    floors: list[dict[str, float]] = field(default_factory=list)   # PING round trips/s


def run(redis_url: str | None, concurrency: int, jobs: int | None, runs: int | None,
        as_json: bool, quick: bool) -> None:
    if redis_url and is_cluster_url(redis_url):
        raise BenchError("--peers measures one server: not a redis+cluster:// URL")
    versions, skipped = installed()
    for line in skipped:
        say(line)
    if not versions:
        raise BenchError("--peers needs Huey and/or Dramatiq: pip install 'emqtasks[peers]'")
    base = Sizes.of(concurrency, jobs, runs or (1 if quick else FULL_RUNS), quick)
    sizes = replace(base, latency_samples=LATENCY_SAMPLES[quick])
    peer_idle = PEER_IDLE_SECONDS[quick]
    # emqtasks' idle window stays 2 of its ticks (20 s at the default 10 s tick)
    sizes = replace(sizes, idle_seconds=max(peer_idle, sizes.idle_seconds))
    names = ["emqtasks", LUA, *versions]
    pr = PeersRun(sizes, names, {"emqtasks": _version("emqtasks"), LUA: "scripts", **versions},
                  skipped, peer_idle, concurrency, {n: [] for n in names})
    began, load_before = time.monotonic(), os.getloadavg()
    old_term = signal.signal(signal.SIGTERM, exit_on_signal)
    try:
        b = measure_systems(redis_url, pr)
    finally:
        signal.signal(signal.SIGTERM, old_term)
    pr.elapsed, pr.load = time.monotonic() - began, (load_before[0], os.getloadavg()[0])
    report(b, pr, as_json)


def measure_systems(redis_url: str | None, pr: PeersRun) -> Bench:
    """Each system in turn, ``runs`` times, on one server (a private one unless given)."""
    server: LocalRedis | None = None
    try:
        server, url, pr.redis_version = open_server(redis_url)
        b = Bench(url, pr.sizes, shared=server is None)
        if _module_version(b.client) is None:   # emqtasks runs the scripts: one column
            pr.names.remove(LUA)
            pr.skipped.append("the server has no emq module: the emqtasks column is the Lua "
                              "scripts (build the module to compare the two paths)")
        else:
            pr.versions["emqtasks"] += " native"
        say(f"emqtasks bench --peers: redis {pr.redis_version} at {redacted(url)}"
            f"{'' if b.shared else ' (private)'}, concurrency {pr.concurrency}, "
            f"{pr.sizes.jobs:,} jobs, {pr.sizes.runs} run(s), {os.cpu_count()} CPUs; "
            + ", ".join(f"{n} {pr.versions[n]}" for n in pr.names) + f"; logs in {b.log_dir}")
        try:
            for r in range(pr.sizes.runs):
                n = 4 * pr.sizes.one_by_one
                pr.floors.append({"raw": producers.raw_ping_floor(url, n),
                                  "redis_py": producers.redis_py_ping_floor(url, n)})
                for name in pr.names:
                    say(f"  {name}: run {r + 1}/{pr.sizes.runs}")
                    pr.results[name].append(measure_system(b, pr, name))
        except redis.exceptions.RedisError as exc:
            raise BenchError(f"Redis error during the bench: {exc}") from None
        finally:
            b.client.close()
        return b
    finally:
        if server is not None:
            server.close()


def measure_system(b: Bench, pr: PeersRun, name: str) -> dict[str, float | None]:
    if name == "emqtasks":
        return measure_emqtasks(b)
    if name == LUA:
        with native_mode("off"):    # the bench's queues and its worker read EMQ_NATIVE
            return measure_emqtasks(b)
    peer = PEER_CLASSES[name](b, uuid.uuid4().hex[:10])
    try:
        found, pr.mixes[name] = measure_peer(b, peer, pr.peer_idle)
        return found
    finally:
        peer.cleanup()


def report(b: Bench, pr: PeersRun, as_json: bool) -> None:
    rows, names, concurrency = rows_for(pr.sizes), pr.names, pr.concurrency
    figures = {n: {r.key: median([x.get(r.key) for x in pr.results[n]]) for r in rows}
               for n in names}
    peers = [n for n in names if n != "emqtasks"]
    ratios = {p: {r.key: _ratio(figures["emqtasks"][r.key], figures[p][r.key])
                  for r in rows if r.ratio} for p in peers}
    if b.shared:
        b.notes.insert(0, "--redis-url given: INFO counts every client of that server, so "
                          "other traffic inflates the Redis-side figures")
    if not b.notes and not b.worker_problems:
        shutil.rmtree(b.log_dir, ignore_errors=True)
    bulk = {"emqtasks": f"map(): {CHUNK:,} jobs per round trip",
            LUA: f"map(): {CHUNK:,} jobs per round trip",
            **{p: PEER_CLASSES[p].bulk_api for p in peers if p != LUA}}
    workers = {"emqtasks": f"emqtasks worker -c {concurrency} ({FEW_GROUPS} groups)",
               LUA: f"EMQ_NATIVE=off emqtasks worker -c {concurrency} ({FEW_GROUPS} groups)",
               "huey": f"huey_consumer -w {concurrency} -k process",
               "dramatiq": "dramatiq --processes {} --threads {}".format(
                   *dramatiq_shape(concurrency))}
    idle_windows = {n: (pr.sizes.idle_seconds if n in ("emqtasks", LUA) else pr.peer_idle)
                    for n in names}
    targets = producer_targets(pr, figures) + drain_targets(pr, figures)
    if as_json:
        click.echo(json.dumps({
            "mode": "peers", "floor_round_trips_s": floor_of(pr), "targets": targets,
            "redis_version": pr.redis_version, "private_server": not b.shared,
            "cpus": os.cpu_count(), "sizes": asdict(pr.sizes), "elapsed_s": round(pr.elapsed, 1),
            "systems": {n: {"version": pr.versions[n], "worker": workers[n],
                            "bulk_api": bulk[n], "idle_seconds": idle_windows[n],
                            "figures": figures[n], "runs": pr.results[n],
                            "drain_commands_per_job": pr.mixes.get(n)} for n in names},
            "ratios": ratios, "skipped": pr.skipped, "notes": b.notes,
            "load_average": {"start": pr.load[0], "end": pr.load[1]},
            "worker_problems": b.worker_problems[:50],
        }, indent=2))
        return
    click.echo(render(rows, names, pr.versions, figures, ratios,
                      f"emqtasks bench --peers: redis {pr.redis_version}, concurrency "
                      f"{concurrency}, {os.cpu_count()} CPUs, median of {pr.sizes.runs} "
                      f"run(s), {pr.elapsed:.0f}s"))
    click.echo("ratio = emqtasks / peer; 'better' says which way is better for that row")
    floors = floor_of(pr)
    click.echo(f"round-trip floor, this run: a raw socket's PING loop "
               f"{floors['raw'] or 0:,.0f}/s, redis-py's {floors['redis_py'] or 0:,.0f}/s")
    for t in targets:
        click.echo(f"target: {t['what']}: {_fmt_ratio(t['value'])} (>= {t['target']:g}): "
                   f"{t['verdict']}")
    click.echo(f"load average {pr.load[0]:.2f} at the start, {pr.load[1]:.2f} at the end "
               f"(other work on the machine skews every column)")
    for n in names:
        click.echo(f"{n}: {workers[n]}; bulk {bulk[n]}; idle over {idle_windows[n]:g}s")
    for line in [*pr.skipped, *(f"note: {note}" for note in b.notes)]:
        click.echo(line)
    if b.worker_problems:
        click.echo(f"the workers logged {len(b.worker_problems)} error line(s) (logs in "
                   f"{b.log_dir}); the first ones:")
        for line in b.worker_problems[:10]:
            click.echo(f"  {line}")


def floor_of(pr: PeersRun) -> dict[str, float | None]:
    """The medians of the run's PING floors (round trips/s)."""
    return {k: median([f.get(k) for f in pr.floors]) for k in ("raw", "redis_py")}


def producer_targets(pr: PeersRun, figures: dict[str, dict[str, float | None]]
                     ) -> list[dict[str, Any]]:
    """Issue 31's producer targets, each with its figure and "met" / "not met"."""
    raw = floor_of(pr)["raw"]
    out: list[dict[str, Any]] = []
    for n in (x for x in ("emqtasks", LUA) if x in pr.names):
        value = _ratio(figures[n].get("enqueue_one_jobs_s"), raw)
        out.append({"what": f"{n} enqueue 1-by-1 / the raw PING floor", "value": value,
                    "target": producers.ONE_TARGET,
                    "verdict": producers.verdict(value, producers.ONE_TARGET)})
        if "huey" in pr.names:
            value = _ratio(figures[n].get("enqueue_threads_jobs_s"),
                           figures["huey"].get("enqueue_threads_jobs_s"))
            out.append({"what": f"{n} enqueue from {producers.THREADS} threads / Huey's",
                        "value": value, "target": producers.THREADS_TARGET,
                        "verdict": producers.verdict(value, producers.THREADS_TARGET)})
    return out


#: Issue 31 item 1: drain jobs/s over Huey's, on the module and on the scripts.
DRAIN_TARGETS = {"emqtasks": 2.5, LUA: 2.0}


def drain_targets(pr: PeersRun, figures: dict[str, dict[str, float | None]]
                  ) -> list[dict[str, Any]]:
    """Issue 31's drain targets (emqtasks / Huey, each path), "met" / "not met"."""
    if "huey" not in pr.names:
        return []
    out: list[dict[str, Any]] = []
    for n in (x for x in ("emqtasks", LUA) if x in pr.names):
        # the emqtasks column runs the scripts when the server has no module
        target = DRAIN_TARGETS[n if LUA in pr.names else LUA]
        value = _ratio(figures[n].get("drain_jobs_s"), figures["huey"].get("drain_jobs_s"))
        out.append({"what": f"{n} drain / Huey's", "value": value, "target": target,
                    "verdict": producers.verdict(value, target)})
    return out


def _fmt_ratio(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def render(rows: list[Row], names: list[str], versions: dict[str, str],
           figures: dict[str, dict[str, float | None]],
           ratios: dict[str, dict[str, float | None]], header: str) -> str:
    def fmt(v: float | None, digits: int) -> str:
        return "n/a" if v is None else f"{v:,.{digits}f}"

    peers = [n for n in names if n != "emqtasks"]
    width = max(len(r.label) for r in rows)
    heads = [f"{n} {versions[n]}" for n in names] + [f"emq/{p}" for p in peers]
    colw = max(12, *(len(h) for h in heads))
    line = f"{'scenario':<{width}}  " + "  ".join(f"{h:>{colw}}" for h in heads)
    out = [header, line + "  unit      better", "-" * (len(line) + 18)]
    for r in rows:
        cells = [fmt(figures[n][r.key], r.digits) for n in names]
        cells += [fmt(ratios[p].get(r.key), 2) if r.ratio else "" for p in peers]
        out.append(f"{r.label:<{width}}  " + "  ".join(f"{c:>{colw}}" for c in cells)
                   + f"  {r.unit:<9} {r.better}")
    return "\n".join(out)


@contextmanager
def native_mode(mode: str) -> Iterator[None]:
    before = os.environ.get("EMQ_NATIVE")
    os.environ["EMQ_NATIVE"] = mode
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("EMQ_NATIVE", None)
        else:
            os.environ["EMQ_NATIVE"] = before


def _module_version(client: redis.Redis) -> int | None:
    try:
        return loaded_version(client)
    except redis.exceptions.NoPermissionError:
        return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"
