"""Microbenchmark: the Lua verbs (EVALSHA) against their EMQ.* twins, on a private server.

    python -m emqtasks.native.microbench [--server PATH] [-n 100000] [--rounds 3] [-P 1]

For enqueue and claim, redis-benchmark drives each form with 50 connections (`-c 50`) and
reports calls/s; the server's CPU (INFO used_cpu_user + used_cpu_sys) over the run gives
µs per call, and INFO commandstats the time inside the command itself. Enqueue makes
unique ids with redis-benchmark's __rand_int__ (one group); claim runs on a prefilled queue
of 10 groups, with enough jobs for every call to lease one. A drain (enqueue 1-by-1, then
claim → ack-and-claim-next until empty, from one Python client) gives the server's CPU per
drained job. Each round runs Lua then native on fresh queues; figures are medians over the
rounds. Not a test: load on a shared machine makes absolute figures move, compare ratios.

``--loop`` instead runs a worker child's own loop — ``Queue`` claim, the ``Runner`` running a
no-op task, ack-and-claim-next — in this process on both paths (``EMQ_NATIVE=require`` and
``off``, alternating), and reports jobs/s, this process's CPU per job (the Python side of the
hot path, the wire included) and the server's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from .._dev.localserver import find_binary, free_port, wait_ready
from ..store.commands import COMMANDS
from ..store.keys import FIXED, QueueKeys
from ..store.scripts import source
from .build import build, last_reason

PAYLOAD = '{"v":1,"a":[42,"report"],"k":{}}'


def _cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _cmdstat(r: redis.Redis, name: str) -> tuple[int, int]:
    stats = r.info("commandstats").get(f"cmdstat_{name.lower()}", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def _benchmark(bench: str, port: int, n: int, clients: int, pipeline: int, rand: int,
               args: list[str]) -> float:
    cmd = [bench, "-h", "127.0.0.1", "-p", str(port), "-c", str(clients), "-n", str(n),
           "-P", str(pipeline), "-r", str(rand), "--csv", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True).stdout
    for line in out.splitlines():
        # the test name holds the payload's quotes and commas: the figures are the last 7
        fields = [f.strip('"') for f in line.rsplit(",", 7)]
        if len(fields) == 8 and fields[1].replace(".", "", 1).isdigit():
            return float(fields[1])
    raise RuntimeError(f"no figure in redis-benchmark output: {out!r}")


class Bench:
    def __init__(self, server: str, module: Path, clients: int, pipeline: int) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="emq-microbench-"))
        self.proc = subprocess.Popen(
            [server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.dir), "--loadmodule", str(module)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ready(self.port, self.proc, time.monotonic() + 20)
        # Any: redis-py's execute_command has no annotations
        self.r: Any = redis.Redis(port=self.port, decode_responses=True)
        bench = find_binary("redis-benchmark")
        if bench is None:
            raise SystemExit("redis-benchmark not found (it comes with redis-server)")
        self.bench: str = bench
        self.clients, self.pipeline = clients, pipeline
        self.sha = {v: self.r.script_load(source(v)) for v in ("enqueue", "claim", "ack")}

    def close(self) -> None:
        self.r.close()
        self.proc.terminate()
        self.proc.wait(20)

    def _call(self, k: QueueKeys, native: bool, verb: str) -> list[str]:
        if native:
            return [COMMANDS[verb], *k.fixed]
        return ["EVALSHA", self.sha[verb], str(len(FIXED)), *k.fixed]

    def measure(self, k: QueueKeys, native: bool, verb: str, n: int, args: list[str],
                rand: int) -> dict[str, float]:
        name = COMMANDS[verb] if native else "evalsha"
        calls0, usec0 = _cmdstat(self.r, name)
        cpu0 = _cpu(self.r)
        rps = _benchmark(self.bench, self.port, n, self.clients, self.pipeline, rand,
                         [*self._call(k, native, verb), *args])
        cpu1 = _cpu(self.r)
        calls1, usec1 = _cmdstat(self.r, name)
        calls = max(calls1 - calls0, 1)
        return {"calls_s": rps, "cpu_us": (cpu1 - cpu0) * 1e6 / n,
                "cmd_us": (usec1 - usec0) / calls}

    def prefill(self, k: QueueKeys, n: int, groups: int = 10) -> None:
        for start in range(0, n, 1000):
            jobs = []
            for i in range(start, min(n, start + 1000)):
                jobs += [f"p{i}", "t", PAYLOAD, f"g{i % groups}", 3, 10**7, 1000, 0, 0, 0]
            self.r.execute_command(COMMANDS["enqueue"], *k.fixed, len(jobs) // 10, *jobs)

    def drain(self, k: QueueKeys, native: bool, n: int) -> dict[str, float]:
        """Enqueue n jobs one by one, then claim and ack-with-claim-next until empty."""
        call = self._call(k, native, "enqueue")
        claim = self._call(k, native, "claim")
        ack = self._call(k, native, "ack")
        pipe = self.r.pipeline(transaction=False)
        names = [COMMANDS[v] for v in ("enqueue", "claim", "ack")] if native else ["evalsha"]
        usec0 = sum(_cmdstat(self.r, name)[1] for name in names)
        cpu0 = _cpu(self.r)
        t0 = time.perf_counter()
        for i in range(n):
            pipe.execute_command(*call, 1, f"d{i}", "t", PAYLOAD, f"g{i % 10}", 3, 10**7,
                                 1000, 0, 0, 0)
            if len(pipe) >= 100:
                pipe.execute()
        pipe.execute()
        job = self.r.execute_command(*claim, 1, "n0")
        job = job[0] if job else None
        done = 0
        while job:
            verdict, job = self.r.execute_command(*ack, job[0], job[3], job[4], "null",
                                                  f"n{done}")
            done += verdict
        elapsed = time.perf_counter() - t0
        cpu = _cpu(self.r) - cpu0
        usec = sum(_cmdstat(self.r, name)[1] for name in names) - usec0
        if done != n:
            raise RuntimeError(f"drained {done} of {n}")
        return {"jobs_s": n / elapsed, "cpu_us": cpu * 1e6 / n, "cmd_us": usec / n}

    def history_round(self, i: int, drain_n: int) -> dict[str, dict[str, float]]:
        """Drains with the history off and on (App.set_history), Lua and native."""
        out: dict[str, dict[str, float]] = {}
        for native in (False, True):
            tag = "native" if native else "lua"
            for on in (False, True):
                k = QueueKeys(f"mh{i}{tag}{int(on)}")
                self.r.hset(k.gdefaults, "history", 24 if on else 0)
                out[f"drain {tag} history {'on' if on else 'off'}"] = self.drain(
                    k, native, drain_n)
            self.r.flushall()
        return out

    def round(self, i: int, n: int, drain_n: int) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for native in (False, True):
            tag = "native" if native else "lua"
            k = QueueKeys(f"mb{i}{tag}")
            job = ["__rand_int__", "t", PAYLOAD, "g", "3", str(10**7), "1000", "0", "0", "0"]
            out[f"enqueue {tag}"] = self.measure(k, native, "enqueue", n, ["1", *job], 10**9)
            k2 = QueueKeys(f"mc{i}{tag}")
            self.prefill(k2, n + 1000)
            out[f"claim {tag}"] = self.measure(k2, native, "claim", n, ["1", "nonce"], 1)
            out[f"drain {tag}"] = self.drain(QueueKeys(f"md{i}{tag}"), native, drain_n)
            self.r.flushall()
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default=os.environ.get("EMQ_REDIS_SERVER"))
    ap.add_argument("-n", type=int, default=100_000, help="calls per redis-benchmark run")
    ap.add_argument("--drain", type=int, default=20_000, help="jobs per drain")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-c", "--clients", type=int, default=50)
    ap.add_argument("-P", "--pipeline", type=int, default=1)
    ap.add_argument("--history", action="store_true",
                    help="only the drains, with the history counters off and on")
    ap.add_argument("--loop", action="store_true",
                    help="only a worker child's claim -> run -> ack loop, through Queue")
    opts = ap.parse_args(argv)
    server = opts.server or find_binary("redis-server")
    if not server:
        raise SystemExit("no redis-server (set --server)")
    module = build(tempfile.mkdtemp(prefix="emq-mb-"))
    if module is None:
        raise SystemExit(f"cannot build the module: {last_reason}")
    version = subprocess.run([server, "--version"], capture_output=True, text=True).stdout
    print(f"server: {version.strip()}\nclients {opts.clients}, pipeline {opts.pipeline}, "
          f"{opts.n} calls per run, drain {opts.drain} jobs, {opts.rounds} rounds")
    if opts.loop:
        return _loop(server, module, opts)
    b = Bench(server, module, opts.clients, opts.pipeline)
    if opts.history:
        return _history(b, opts)
    rounds: list[dict[str, dict[str, float]]] = []
    try:
        for i in range(opts.rounds):
            rounds.append(b.round(i, opts.n, opts.drain))
    finally:
        b.close()
    med: dict[str, dict[str, float]] = {
        name: {f: statistics.median(r[name][f] for r in rounds) for f in rounds[0][name]}
        for name in rounds[0]}
    print(f"{'':16}{'calls/s':>12}{'server CPU us/call':>20}{'in-command us':>16}")
    for name, figs in med.items():
        if name.startswith("drain"):
            continue
        print(f"{name:16}{figs['calls_s']:12,.0f}{figs['cpu_us']:20.1f}{figs['cmd_us']:16.1f}")
    for verb in ("enqueue", "claim"):
        lua, nat = med[f"{verb} lua"], med[f"{verb} native"]
        print(f"{verb}: native/lua calls/s {nat['calls_s'] / lua['calls_s']:.2f}x, "
              f"server CPU {nat['cpu_us'] / lua['cpu_us']:.2f}x, "
              f"in-command {nat['cmd_us'] / lua['cmd_us']:.2f}x")
    lua, nat = med["drain lua"], med["drain native"]
    print(f"drain (1 client): lua {lua['jobs_s']:,.0f} jobs/s {lua['cpu_us']:.1f} us/job, "
          f"native {nat['jobs_s']:,.0f} jobs/s {nat['cpu_us']:.1f} us/job, "
          f"CPU ratio {nat['cpu_us'] / lua['cpu_us']:.2f}x")
    per_round = [(r["enqueue native"]["calls_s"] / r["enqueue lua"]["calls_s"],
                  r["claim native"]["calls_s"] / r["claim lua"]["calls_s"]) for r in rounds]
    print("per round native/lua calls/s (enqueue, claim): "
          + ", ".join(f"({a:.2f}, {c:.2f})" for a, c in per_round))
    return 0


def _history(b: Bench, opts: argparse.Namespace) -> int:
    try:
        rounds = [b.history_round(i, opts.drain) for i in range(opts.rounds)]
    finally:
        b.close()
    for fig, what in (("cpu_us", "server CPU"), ("cmd_us", "in-command time")):
        med = {name: statistics.median(r[name][fig] for r in rounds) for name in rounds[0]}
        for tag in ("lua", "native"):
            off, on = med[f"drain {tag} history off"], med[f"drain {tag} history on"]
            print(f"drain {tag}: {what} per job {off:.1f} us history off, {on:.1f} us on: "
                  f"{(on / off - 1) * 100:+.1f}%")
    print("per round (lua off/on, native off/on us/job): " + ", ".join(
        "({:.1f}/{:.1f}, {:.1f}/{:.1f})".format(*(r[f"drain {t} history {o}"]["cpu_us"]
                                                 for t in ("lua", "native")
                                                 for o in ("off", "on")))
        for r in rounds))
    return 0


def _loop_once(url: str, mode: str, n: int) -> tuple[float, float, float]:
    """(jobs/s, client CPU us/job, server CPU us/job) of one drain of n no-op jobs."""
    from ..producer.app import App
    from ..store.connection import connect
    from ..store.queue import Queue
    from ..worker.queues import QueueSet
    from ..worker.runner import Runner

    app = App(redis_url=url, queue=f"loop-{mode}")
    noop = app.task(name="microbench.noop", group=lambda i: f"g{i % 10}")(_noop)
    noop.map([(i,) for i in range(n)])
    client = connect(url, single_thread=True)
    queues = [Queue(client, app.settings.queue, native=mode)]
    qs, runner = QueueSet(queues, None), Runner(queues, app.registry)
    admin: Any = app.client
    cpu0, own0, t0 = _cpu(admin), time.process_time(), time.perf_counter()
    done, claimed = 0, qs.claim()
    while claimed is not None:
        qi, lease = claimed
        result, _, _ = runner.execute(lease, qi, runner.plan(lease))
        _, claimed = qs.ack(qi, lease, result or "null", True)
        done += 1
    t1, own1, cpu1 = time.perf_counter(), time.process_time(), _cpu(admin)
    client.close()
    app.purge()
    app.close()
    if done != n:
        raise RuntimeError(f"drained {done} of {n}")
    return n / (t1 - t0), (own1 - own0) * 1e6 / n, (cpu1 - cpu0) * 1e6 / n


def _noop(i: int) -> None:
    return None


def _loop(server: str, module: Path, opts: argparse.Namespace) -> int:
    from .._dev.localserver import LocalRedis

    figures: dict[str, list[tuple[float, float, float]]] = {"require": [], "off": []}
    os.environ["EMQ_REDIS_SERVER"] = server
    with LocalRedis(module=False, extra=("--loadmodule", str(module))) as srv:
        for _ in range(opts.rounds):
            for mode in figures:
                figures[mode].append(_loop_once(srv.url, mode, opts.drain))
    med = {m: [statistics.median(r[i] for r in rows) for i in range(3)]
           for m, rows in figures.items()}
    for mode, name in (("require", "native"), ("off", "lua")):
        jobs_s, own, cpu = med[mode]
        print(f"loop {name:6}: {jobs_s:8,.0f} jobs/s, this process {own:6.1f} us/job, "
              f"server {cpu:6.1f} us/job")
    nat, lua = med["require"], med["off"]
    print(f"native/lua: jobs/s {nat[0] / lua[0]:.2f}x, client CPU {nat[1] / lua[1]:.2f}x, "
          f"server CPU {nat[2] / lua[2]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
