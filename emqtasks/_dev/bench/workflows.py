"""`emqtasks bench --workflows`: what chains and chords cost and how fast they run.

1. Round trips: an in-process claim -> ack-and-claim-next loop over plain jobs and over the
   steps of chains (the hand-over rides on the ack): script calls and Redis CPU per job.
2. 1,000 chains of 5 steps on a worker: enqueue time and steps/s, against the same number
   of plain jobs.
3. A chord of 10,000 no-op members on a worker: enqueue time, time until its callback ran
   (once: counted), members/s.
"""

from __future__ import annotations

import time
from typing import Any

from ...workflows.canvas import chain, chord
from .core import Bench, median, say
from .harness import bench_on, report
from .scenarios import Row


def _drain_in_process(app: Any) -> tuple[int, float]:
    q = app.queue()
    leases = q.claim(1)
    lease = leases[0] if leases else None
    done, began = 0, time.perf_counter()
    while lease is not None:
        _, lease = q.ack(lease, "null", claim_next=True)
        done += 1
    return done, time.perf_counter() - began


def round_trips(b: Bench, chains: int, steps: int) -> dict[str, float]:
    """Script calls and Redis CPU per job: plain jobs vs chain steps, drained in process."""
    out: dict[str, float] = {}
    for kind in ("plain", "chain"):
        with b.queue() as (app, tasks):
            counter = b.key(app, "rt")
            relay = tasks["relay"]
            if kind == "plain":
                tasks["noop"].map([(counter,)] * (chains * steps))
            else:
                for _ in range(chains):
                    chain(relay.s(0, counter).set(group="default"),
                          *[relay.s(counter) for _ in range(steps - 1)]).apply_async(app=app)
            before = b.meter.snapshot()
            done, _ = _drain_in_process(app)
            d = b.meter.delta(before, b.meter.snapshot())
            out[f"{kind}_calls"] = b.meter.scripts(d) / max(done, 1)   # scripts or EMQ.*
            out[f"{kind}_inner"] = b.meter.calls(d) / max(done, 1)
            out[f"{kind}_cpu_us"] = d["cpu"] * 1e6 / max(done, 1)
    return out


def chains_on_worker(b: Bench, chains: int, steps: int) -> dict[str, float]:
    with b.queue() as (app, tasks):
        counter = b.key(app, "chains")
        relay = tasks["relay"]
        app.pause()
        began = time.perf_counter()
        for i in range(chains):
            chain(relay.s(i, counter).set(group="default"),
                  *[relay.s(counter) for _ in range(steps - 1)]).apply_async(app=app)
        enqueue_s = time.perf_counter() - began
        with b.worker(app):
            t0 = time.monotonic()
            app.resume()
            reached, _ = b.wait_count(counter, chains * steps, timeout=600)
    run_s = (reached - t0) if reached else None
    with b.queue() as (app, tasks):
        counter = b.key(app, "plain")
        app.pause()
        tasks["noop"].map([(counter,)] * (chains * steps))
        with b.worker(app):
            t0 = time.monotonic()
            app.resume()
            plain_at, _ = b.wait_count(counter, chains * steps, timeout=600)
    plain_s = (plain_at - t0) if plain_at else None
    n = chains * steps
    return {"enqueue_wf_s": chains / enqueue_s, "steps_s": n / run_s if run_s else 0.0,
            "plain_s": n / plain_s if plain_s else 0.0}


def chord_on_worker(b: Bench, members: int) -> dict[str, float]:
    with b.queue() as (app, tasks):
        counter, done = b.key(app, "members"), b.key(app, "callback")
        app.pause()
        began = time.perf_counter()
        h = chord([tasks["noop"].si(counter) for _ in range(members)],
                  tasks["relay"].si("x", done)).apply_async(app=app)
        enqueue_s = time.perf_counter() - began
        with b.worker(app):
            t0 = time.monotonic()
            app.resume()
            reached, _ = b.wait_count(done, 1, timeout=600)
            h.get(timeout=60)
            time.sleep(0.2)
            runs = int(b.client.get(done) or 0)
    if runs != 1:
        b.notes.append(f"the chord's callback ran {runs} times")
    total = (reached - t0) if reached else None
    return {"enqueue_s": enqueue_s, "complete_s": total or 0.0,
            "members_s": members / total if total else 0.0, "callback_runs": float(runs)}


def measure(b: Bench, quick: bool) -> list[Row]:
    chains, steps = (200, 5) if quick else (1_000, 5)
    members = 2_000 if quick else 10_000
    runs = b.sizes.runs
    say("  round trips per job: plain vs chain steps")
    rt = [round_trips(b, chains, steps) for _ in range(runs)]
    say(f"  {chains} chains of {steps} steps on a worker")
    ch = [chains_on_worker(b, chains, steps) for _ in range(runs)]
    say(f"  a chord of {members} members on a worker")
    co = [chord_on_worker(b, members) for _ in range(runs)]

    def m(rows: list[dict[str, float]], key: str) -> float | None:
        return median([r[key] for r in rows])

    from . import celery_workflows as cw
    say("  end to end, worker up: emqtasks" + (" and Celery" if cw.available() else ""))
    e2e = [cw.emqtasks_e2e(b, chains, steps, members) for _ in range(runs)]
    peer = [c for c in (cw.celery_e2e(b, chains, steps, members) for _ in range(runs)
                        if cw.available()) if c is not None]
    if not cw.available():
        b.notes.append("Celery is not installed: pip install 'celery[redis]' to compare")
    compare = [
        Row("wf_e2e_chains", f"4  end to end: {chains} chains of {steps}, emqtasks",
            m(e2e, "chains_s"), "s", [r["chains_s"] for r in e2e], 2),
        Row("wf_e2e_chord", f"4  end to end: a chord of {members}, emqtasks",
            m(e2e, "chord_s"), "s", [r["chord_s"] for r in e2e], 2),
    ]
    if peer:
        compare += [
            Row("celery_e2e_chains", f"4  end to end: {chains} chains of {steps}, Celery",
                m(peer, "chains_s"), "s", [r["chains_s"] for r in peer], 2),
            Row("celery_e2e_chord", f"4  end to end: a chord of {members}, Celery",
                m(peer, "chord_s"), "s", [r["chord_s"] for r in peer], 2),
            Row("celery_chord_callbacks", "4    Celery's callback runs", m(peer,
                "chord_callbacks"), "runs", [r["chord_callbacks"] for r in peer], 0),
        ]

    rows = [
        Row("wf_trips_plain", "1  round trips (script calls) per job, plain (claim+ack loop)",
            m(rt, "plain_calls"), "calls/job", [r["plain_calls"] for r in rt], 3),
        Row("wf_trips_chain", "1  round trips (script calls) per job, chain steps",
            m(rt, "chain_calls"), "calls/job", [r["chain_calls"] for r in rt], 3),
        Row("wf_inner_plain", "1  commands counted per job, plain (inner ones: Lua only)",
            m(rt, "plain_inner"), "cmds/job", [r["plain_inner"] for r in rt], 1),
        Row("wf_inner_chain", "1  commands counted per job, chain steps (inner: Lua only)",
            m(rt, "chain_inner"), "cmds/job", [r["chain_inner"] for r in rt], 1),
        Row("wf_cpu_plain", "1  Redis CPU per job, plain", m(rt, "plain_cpu_us"), "us/job",
            [r["plain_cpu_us"] for r in rt], 1),
        Row("wf_cpu_chain", "1  Redis CPU per job, chain steps", m(rt, "chain_cpu_us"),
            "us/job", [r["chain_cpu_us"] for r in rt], 1),
        Row("wf_chain_enqueue", f"2  enqueue {chains} chains of {steps} (one call each)",
            m(ch, "enqueue_wf_s"), "chains/s", [r["enqueue_wf_s"] for r in ch], 0),
        Row("wf_chain_steps", f"2  {chains} chains of {steps}: steps run",
            m(ch, "steps_s"), "jobs/s", [r["steps_s"] for r in ch], 0),
        Row("wf_chain_plain", f"2    the same {chains * steps} as plain jobs",
            m(ch, "plain_s"), "jobs/s", [r["plain_s"] for r in ch], 0),
        Row("wf_chord_enqueue", f"3  enqueue a chord of {members} (one call)",
            m(co, "enqueue_s"), "s", [r["enqueue_s"] for r in co], 2),
        Row("wf_chord_complete", f"3  chord of {members}: enqueue to callback done",
            m(co, "complete_s"), "s", [r["complete_s"] for r in co], 2),
        Row("wf_chord_members", f"3  chord of {members}: members run",
            m(co, "members_s"), "jobs/s", [r["members_s"] for r in co], 0),
        Row("wf_chord_callbacks", "3  callback runs (must be 1)", m(co, "callback_runs"),
            "runs", [r["callback_runs"] for r in co], 0),
    ]
    return rows + compare


def run(redis_url: str | None, concurrency: int, runs: int | None, quick: bool,
        as_json: bool) -> None:
    title, detail = "emqtasks bench --workflows", f", -c {concurrency}"
    with bench_on(redis_url, concurrency, runs, quick, title, detail) as (b, version):
        rows = measure(b, quick)
    report(b, rows, version, title, as_json, detail)
