"""A worker's drain with batched claims on against off, interleaved on one private server.

    python -m emqtasks._dev.bench.batches [-c 8] [--jobs 20000] [--runs 3]

Each run drains the same no-op jobs (10 groups, each job one INCR, the queue paused while
they are enqueued, timed from ``resume`` to the last completion) with the worker's
``EMQ_BATCH_CLAIMS`` set to 1, then 0; per setting the median jobs/s and the server's and the
worker's CPU per job. The path is the one ``EMQ_NATIVE`` picks (``off``: the scripts). Not
a test: compare the two rows of one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from .core import CHUNK, FEW_GROUPS, Bench, Sizes
from .harness import open_server

SETTINGS = {"on": "1", "off": "0"}


def _server_cpu(b: Bench) -> float:
    info = b.client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def drain(b: Bench, jobs: int) -> tuple[float, float, float]:
    """One drain: jobs/s, server CPU µs per job, worker CPU µs per job."""
    with b.queue() as (app, tasks):
        counter = b.key(app, "done")
        app.pause()
        calls: list[Any] = [(counter, f"g{i % FEW_GROUPS}") for i in range(jobs)]
        for i in range(0, jobs, CHUNK):
            tasks["noop"].map(calls[i:i + CHUNK])
        with b.worker(app) as w:
            server0, worker0 = _server_cpu(b), w.cpu()
            began = time.monotonic()
            app.resume()
            done, _ = b.wait_count(counter, jobs, timeout=30 + jobs / 200)
            server1, worker1 = _server_cpu(b), w.cpu()
    if done is None:
        raise SystemExit(f"the drain of {jobs} jobs did not finish")
    return (jobs / (done - began), (server1 - server0) * 1e6 / jobs,
            (worker1 - worker0) * 1e6 / jobs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-c", "--concurrency", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    server, url, version = open_server(None)
    b = Bench(url, Sizes.of(args.concurrency, args.jobs, args.runs, False), shared=False)
    figures: dict[str, list[tuple[float, float, float]]] = {k: [] for k in SETTINGS}
    try:
        for run in range(args.runs):
            for label, value in SETTINGS.items():
                os.environ["EMQ_BATCH_CLAIMS"] = value
                figures[label].append(drain(b, args.jobs))
                rate, srv, wrk = figures[label][-1]
                print(f"run {run + 1}, batches {label}: {rate:,.0f} jobs/s, server CPU "
                      f"{srv:.1f} µs/job, worker CPU {wrk:.1f} µs/job", flush=True)
    finally:
        os.environ.pop("EMQ_BATCH_CLAIMS", None)
        b.client.close()
        if server is not None:
            server.close()
    path = os.environ.get("EMQ_NATIVE", "auto")
    for label, rows in figures.items():
        print(f"batches {label} (EMQ_NATIVE={path}, {version}, -c {args.concurrency}): "
              f"median {statistics.median(r[0] for r in rows):,.0f} jobs/s, server CPU "
              f"{statistics.median(r[1] for r in rows):.1f} µs/job, worker CPU "
              f"{statistics.median(r[2] for r in rows):.1f} µs/job")


if __name__ == "__main__":
    main()
