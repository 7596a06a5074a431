"""``emqtasks bench --server-cpu``: the Redis server's CPU per enqueue and per drained job.

Both paths in one run, each on its own private server: the module's (a server that loads
it) and the scripts' (a stock server, as a managed Redis gives). Per path:

* the floor: the server's CPU per PING, per empty EVALSHA (``return 0``) and per empty verb
  (``extend`` with no leases: its script, or EMQ.EXTEND), each from 5,000 calls in a loop;
* enqueue 1-by-1: ``delay()`` in a loop (10 groups), the server's CPU per call;
* a drain of ``--jobs`` no-op jobs (each does one INCR) on ``-c N``: the server's CPU per
  job, the bench's polls of the counter included (as in ``bench --peers``).

Each figure is printed in µs and in PINGs (over the same run's PING floor): on a loaded
machine the µs move by half between runs, the ratio much less.

CPU is ``INFO`` used_cpu_user + used_cpu_sys deltas; the split per verb is INFO
commandstats' ``usec`` deltas per call (the time inside each command: the rest of the
server's CPU is the event loop, the socket reads and writes, the reply buffers).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import click

from ...store.core import QueueCore
from ..localserver import LocalRedis
from .core import FEW_GROUPS, POLL, Bench, BenchError, Sizes, median, say

#: issue 31 item 4: µs of server CPU (enqueue, drained job) per path
TARGETS = {"native": (25.0, 30.0), "lua": (35.0, 50.0)}
FLOOR_CALLS = 5_000


def _stats(client: Any) -> dict[str, Any]:
    info = client.execute_command("INFO", "all")
    out: dict[str, Any] = {"cpu": float(info["used_cpu_sys"]) + float(info["used_cpu_user"])}
    for key, row in info.items():
        if key.startswith("cmdstat_"):
            out[key[len("cmdstat_"):]] = (int(row["calls"]), int(row["usec"]))
    return out


def _split(before: dict[str, Any], after: dict[str, Any], per: int) -> dict[str, Any]:
    """CPU µs per unit, and per command: calls per unit and µs inside it per call."""
    verbs = {}
    for name, value in after.items():
        if name in ("cpu", "info"):
            continue
        c0, u0 = before.get(name, (0, 0))
        calls, usec = value[0] - c0, value[1] - u0
        if calls > 0 and calls / per >= 0.005:
            verbs[name] = {"per_unit": round(calls / per, 3),
                           "usec_per_call": round(usec / calls, 2)}
    return {"cpu_us": (after["cpu"] - before["cpu"]) * 1e6 / per, "verbs": verbs}


def _floor(b: Bench, core: QueueCore) -> dict[str, float]:
    """The server's CPU per call of the cheapest command of each kind."""
    c = b.client
    sha = c.script_load("return 0")
    out = {}
    calls: dict[str, Callable[[], Any]] = {"ping": lambda: c.execute_command("PING"),
             "evalsha_empty": lambda: c.evalsha(sha, 0),
             "verb_empty": lambda: core.hot.call("extend", core.keys.fixed, [1000])}
    for name, fn in calls.items():
        fn()
        s0 = _stats(c)
        for _ in range(FLOOR_CALLS):
            fn()
        s1 = _stats(c)
        out[name] = (s1["cpu"] - s0["cpu"]) * 1e6 / FLOOR_CALLS
    return out


def _enqueue(b: Bench) -> dict[str, Any]:
    n = b.sizes.one_by_one
    with b.queue() as (app, tasks):
        counter, noop = b.key(app, "done"), tasks["noop"]
        groups = [f"g{i % FEW_GROUPS}" for i in range(n)]
        for g in groups[:FEW_GROUPS]:       # the lanes exist; the connection is open
            noop.delay(counter, g)
        s0 = _stats(b.client)
        for g in groups:
            noop.delay(counter, g)
        return _split(s0, _stats(b.client), n)


def _drain(b: Bench) -> dict[str, Any] | None:
    n = b.sizes.jobs
    with b.queue() as (app, tasks):
        counter = b.key(app, "done")
        app.pause()
        b.enqueue_batch(tasks["noop"], counter, FEW_GROUPS, n)
        with b.worker(app):
            s0 = _stats(b.client)
            app.resume()
            done, _polls = b.wait_count(counter, n, timeout=30 + n / 200)
            if done is not None:
                _acks_in(b, app.queue().keys.active)
            s1 = _stats(b.client)
        if done is None:
            b.notes.append(f"the drain of {n} jobs did not finish")
            return None
        return _split(s0, s1, n)


def _acks_in(b: Bench, active: str, timeout: float = 10.0) -> None:
    """Until no job is active: the counter moves inside the job, its ack comes after (posted,
    or sent with the next claim), so the last jobs' acks may still be on their way when it
    reaches n (the drain then read 0.993 acks a job)."""
    deadline = time.monotonic() + timeout
    while b.client.zcard(active) and time.monotonic() < deadline:
        time.sleep(POLL)


def _path(path: str, sizes: Sizes) -> tuple[dict[str, Any], list[str]]:
    server = LocalRedis(module=path == "native").start()
    os.environ["EMQ_NATIVE"] = "require" if path == "native" else "off"
    try:
        b = Bench(server.url, sizes, shared=False)
        try:
            runs: list[dict[str, Any]] = []
            for i in range(sizes.runs):
                say(f"  {path}: run {i + 1} of {sizes.runs}")
                core = QueueCore(b.client, f"floor-{i}")
                runs.append({"floor": _floor(b, core), "enqueue": _enqueue(b),
                             "drain": _drain(b)})
            return _summary(runs), b.notes
        finally:
            b.client.close()
    finally:
        server.close()


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def med_split(kind: str) -> dict[str, Any] | None:
        real = [r[kind] for r in runs if r[kind] is not None]
        if not real:
            return None
        names = sorted({v for r in real for v in r["verbs"]})
        return {"cpu_us": median([r["cpu_us"] for r in real]), "runs": [r["cpu_us"] for r in real],
                "verbs": {v: {k: median([r["verbs"][v][k] for r in real if v in r["verbs"]])
                              for k in ("per_unit", "usec_per_call")} for v in names}}

    return {"floor": {k: median([r["floor"][k] for r in runs]) for k in runs[0]["floor"]},
            "enqueue": med_split("enqueue"), "drain": med_split("drain")}


def run(concurrency: int, jobs: int | None, runs: int | None, quick: bool,
        as_json: bool) -> None:
    sizes = Sizes.of(concurrency, jobs, runs, quick)
    began = time.monotonic()
    saved = os.environ.get("EMQ_NATIVE")
    results, notes = {}, []
    try:
        for path in ("native", "lua"):
            try:
                results[path], found = _path(path, sizes)
            except BenchError as exc:
                notes.append(f"{path}: {exc.message}")
                continue
            notes.extend(f"{path}: {n}" for n in found)
    finally:
        if saved is None:
            os.environ.pop("EMQ_NATIVE", None)
        else:
            os.environ["EMQ_NATIVE"] = saved
    load = os.getloadavg()
    if as_json:
        click.echo(json.dumps({"sizes": {"one_by_one": sizes.one_by_one, "jobs": sizes.jobs,
                                         "runs": sizes.runs, "concurrency": concurrency},
                               "load": load, "results": results, "notes": notes}, indent=2))
        return
    click.echo(f"server CPU per job: -c {concurrency}, {sizes.one_by_one:,} enqueues 1-by-1, "
               f"drain of {sizes.jobs:,}, median of {sizes.runs}, {os.cpu_count()} CPUs, "
               f"load {load[0]:.2f} / {load[1]:.2f}, {time.monotonic() - began:.0f} s")
    for path, res in results.items():
        enq_t, drain_t = TARGETS[path]
        fl = res["floor"]
        click.echo(f"\n{path} ({'module' if path == 'native' else 'scripts, stock server'})")
        click.echo(f"  floor, server CPU per call: PING {fl['ping']:.1f} us, empty EVALSHA "
                   f"{fl['evalsha_empty']:.1f} us, empty verb (extend) {fl['verb_empty']:.1f} us")
        for kind, target in (("enqueue", enq_t), ("drain", drain_t)):
            r = res[kind]
            if r is None:
                click.echo(f"  {kind}: no figure")
                continue
            met = "met" if r["cpu_us"] <= target else "not met"
            label = "per enqueue" if kind == "enqueue" else "per drained job"
            pings = r["cpu_us"] / fl["ping"]
            click.echo(f"  server CPU {label}: {r['cpu_us']:.1f} us = {pings:.1f} "
                       f"PINGs (target <= {target:.0f}: {met}; runs "
                       f"{', '.join(f'{x:.1f}' for x in r['runs'])})")
            for verb, v in sorted(r["verbs"].items(), key=lambda kv: -kv[1]["per_unit"]):
                click.echo(f"    {verb:<14} {v['per_unit']:>6.3f} calls, "
                           f"{v['usec_per_call']:>6.2f} us inside each")
    for note in notes:
        click.echo(f"note: {note}")
