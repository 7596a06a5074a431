"""``emqtasks bench --tracing``: what OpenTelemetry costs a worker (issue 28).

The drain of ``--jobs`` no-op jobs (20,000; 2,000 with --quick) in 10 groups from a paused
queue, three ways, interleaved run by run (medians of ``--runs``, default 3):

- ``off``: OpenTelemetry not importable in the worker (a package on its PYTHONPATH named
  ``opentelemetry`` whose import fails, as if it were not installed; redis-py 8 imports it
  by itself where it is, so installed is not off);
- ``api``: the API importable (redis-py loads it), no SDK: the jobs carry no context;
- ``sdk``: the SDK in the worker, a BatchSpanProcessor exporting to an in-memory exporter
  (tracing_sdk.py), and each job sent under a current context (a W3C carrier in its
  envelope): a ``process`` span per job, child of it.

Worker CPU per job is the master's and children's user+system time over the drain (from
/proc) divided by the jobs; drain jobs/s is resume to the last completion.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import click

from .core import CHUNK, FEW_GROUPS, Bench, Sizes, median, say
from .harness import open_server

MODES = ("off", "api", "sdk")
_HIDE = 'raise ImportError("hidden by emqtasks bench --tracing: tracing off")\n'


def run(redis_url: str | None, concurrency: int, jobs: int | None, runs: int | None,
        as_json: bool, quick: bool) -> None:
    sizes = Sizes.of(concurrency, jobs, runs, quick)
    hidden = Path(tempfile.mkdtemp(prefix="emq-bench-nootel-"))
    (hidden / "opentelemetry").mkdir()
    (hidden / "opentelemetry" / "__init__.py").write_text(_HIDE)
    server, url, version = open_server(redis_url)
    try:
        b = Bench(url, sizes, shared=server is None)
        say(f"emqtasks bench --tracing: redis {version}, -c {concurrency}, {sizes.jobs} jobs, "
            f"{sizes.runs} run(s) of {', '.join(MODES)}; worker logs in {b.log_dir}")
        results: dict[str, list[dict[str, float | None]]] = {m: [] for m in MODES}
        try:
            for i in range(sizes.runs):
                for mode in MODES:
                    r = drain(b, mode, str(hidden))
                    results[mode].append(r)
                    say(f"  run {i + 1} {mode}: {_f(r['drain'], 0)} jobs/s, "
                        f"{_f(r['worker_cpu_us'], 1)} us worker CPU per job")
        finally:
            b.client.close()
    finally:
        shutil.rmtree(hidden, ignore_errors=True)
        if server is not None:
            server.close()
    if not b.notes and not b.worker_problems:
        shutil.rmtree(b.log_dir, ignore_errors=True)   # kept to read only when it went wrong
    report(b, results, version, concurrency, as_json)


def _carried() -> AbstractContextManager[Any]:
    """A current context to send under (the API alone passes it on): the jobs of the sdk
    runs carry a traceparent, as jobs a traced web request sends do."""
    from opentelemetry import trace

    ctx = trace.SpanContext(0x5EED_0000_0000_0000_0000_0000_0000_0001, 0x5EED_0000_0000_0001,
                            is_remote=True, trace_flags=trace.TraceFlags(1))
    return trace.use_span(trace.NonRecordingSpan(ctx))


def drain(b: Bench, mode: str, hidden: str) -> dict[str, float | None]:
    n = b.sizes.jobs
    with b.queue() as (app, tasks):
        counter = b.key(app, "done")
        app.pause()
        calls = [(counter, f"g{i % FEW_GROUPS}") for i in range(n)]
        with _carried() if mode == "sdk" else nullcontext():
            for i in range(0, n, CHUNK):
                tasks["noop"].map(calls[i:i + CHUNK])
        path = hidden if mode == "off" else None
        modules = ("emqtasks._dev.bench.tracing_sdk",) if mode == "sdk" else ()
        with b.worker(app, modules=modules, path=path) as w:
            cpu0, began = w.cpu(), time.monotonic()
            app.resume()
            done, _ = b.wait_count(counter, n, timeout=30 + n / 200)
            cpu1 = w.cpu()
        if done is None:
            b.notes.append(f"{mode}: the drain of {n} jobs did not finish")
            return {"drain": None, "worker_cpu_us": None}
        return {"drain": n / (done - began), "worker_cpu_us": (cpu1 - cpu0) * 1e6 / n}


def report(b: Bench, results: dict[str, list[dict[str, float | None]]], version: str,
           concurrency: int, as_json: bool) -> None:
    figures = {m: {k: median([r[k] for r in rs]) for k in ("drain", "worker_cpu_us")}
               for m, rs in results.items()}
    if as_json:
        click.echo(json.dumps({"redis_version": version, "concurrency": concurrency,
                               "jobs": b.sizes.jobs, "figures": figures, "runs": results,
                               "notes": b.notes, "worker_problems": b.worker_problems[:50]},
                              indent=2))
        return
    click.echo(f"emqtasks bench --tracing: redis {version}, -c {concurrency}, "
               f"{b.sizes.jobs} no-op jobs, median of {b.sizes.runs} run(s)")
    click.echo(f"{'tracing':<42} {'drain jobs/s':>12} {'worker CPU/job':>15}")
    labels = {"off": "off (OpenTelemetry not importable)",
              "api": "API installed, no SDK",
              "sdk": "SDK, BatchSpanProcessor, in-memory"}
    for mode in MODES:
        f = figures[mode]
        click.echo(f"{labels[mode]:<42} {_f(f['drain'], 0):>12} "
                   f"{_f(f['worker_cpu_us'], 1):>12} us")
    for note in b.notes + b.worker_problems[:10]:
        click.echo(f"note: {note}")


def _f(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"
