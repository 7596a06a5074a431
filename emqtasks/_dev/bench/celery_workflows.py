"""The same workflows end to end on emqtasks and on Celery (when it is installed).

Both with a worker of concurrency 8 already up (Celery: ``celery worker -c 8``, prefork,
broker and result backend on the bench's private Redis, database 1; emqtasks: ``worker -c
8``), each timed from the first enqueue to the last step's INCR: 1,000 chains of 5 ``relay``
steps (each hands its result to the next), then a chord of 10,000 ``noop`` members onto an
immutable callback. Celery's figures are its defaults (JSON, prefetch 4, the Redis result
backend's chord counter); emqtasks' are its defaults.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import subprocess
import sys
import time
from typing import Any
from urllib.parse import urlparse, urlunparse

import redis

from ...workflows.canvas import chain, chord
from .core import Bench, say


def available() -> bool:
    return importlib.util.find_spec("celery") is not None


def _db1(url: str) -> str:
    u = urlparse(url)
    return urlunparse(u._replace(path="/1"))


def _wait(r: Any, key: str, target: int, timeout: float) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if int(r.get(key) or 0) >= target:
            return time.monotonic()
        time.sleep(0.01)
    return None


def emqtasks_e2e(b: Bench, chains: int, steps: int, members: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with b.queue() as (app, tasks):
        counter, done = b.key(app, "e2e"), b.key(app, "e2e-cb")
        relay = tasks["relay"]
        with b.worker(app):
            t0 = time.monotonic()
            for i in range(chains):
                chain(relay.s(i, counter).set(group="default"),
                      *[relay.s(counter) for _ in range(steps - 1)]).apply_async(app=app)
            end = _wait(b.client, counter, chains * steps, 600)
            out["chains_s"] = (end - t0) if end else 0.0
            t0 = time.monotonic()
            chord([tasks["noop"].si(counter) for _ in range(members)],
                  relay.si("x", done)).apply_async(app=app)
            end = _wait(b.client, done, 1, 600)
            out["chord_s"] = (end - t0) if end else 0.0
    return out


def celery_e2e(b: Bench, chains: int, steps: int, members: int) -> dict[str, float] | None:
    if b.shared:
        b.notes.append("Celery's workflows are measured on a private server only (it "
                       "flushes database 1 after): skipped with --redis-url")
        return None
    url = _db1(b.url)
    r = redis.Redis.from_url(url)
    r.flushdb()
    env = dict(os.environ, EMQ_BENCH_CELERY_URL=url, EMQ_BENCH_CELERY_QUEUE="bench")
    log_path = b.log_dir / "celery-worker.log"
    with open(log_path, "wb") as log:
        return _run_celery(b, r, env, log, log_path, chains, steps, members)


def _run_celery(b: Bench, r: Any, env: dict[str, str], log: Any, log_path: Any, chains: int,
                steps: int, members: int) -> dict[str, float] | None:
    url = env["EMQ_BENCH_CELERY_URL"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "emqtasks._dev.bench.celery_tasks", "worker",
         "-c", "8", "-P", "prefork", "-Q", "bench", "-l", "info", "--without-gossip",
         "--without-mingle", "--without-heartbeat"], stdout=log, stderr=subprocess.STDOUT,
        env=env)
    out: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 60
        while b"ready." not in log_path.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                b.notes.append(f"the Celery worker did not start: "
                               f"{log_path.read_text(errors='replace')[-500:]}")
                return None
            time.sleep(0.05)
        os.environ["EMQ_BENCH_CELERY_URL"] = url
        os.environ["EMQ_BENCH_CELERY_QUEUE"] = "bench"
        from celery import chain as cchain
        from celery import chord as cchord

        from .celery_tasks import celery_app
        c = celery_app()
        results: list[Any] = []   # released while the server is up (their __del__ calls it)
        t0 = time.monotonic()
        for i in range(chains):
            results.append(cchain(c["relay"].s(i, "c:e2e"),
                                  *[c["relay"].s("c:e2e") for _ in range(steps - 1)])
                           .apply_async())
        end = _wait(r, "c:e2e", chains * steps, 600)
        out["chains_s"] = (end - t0) if end else 0.0
        t0 = time.monotonic()
        results.append(cchord([c["noop"].si("c:e2e") for _ in range(members)])(
            c["relay"].si("x", "c:cb")))
        end = _wait(r, "c:cb", 1, 600)
        out["chord_s"] = (end - t0) if end else 0.0
        time.sleep(0.5)
        out["chord_callbacks"] = float(int(r.get("c:cb") or 0))
        # Every AsyncResult goes now, while the server is up: each one's __del__ talks to it.
        for mapping in getattr(c["app"].backend, "_pending_results", ()):
            mapping.clear()
        del results
        gc.collect()
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        r.flushdb()
        r.close()
    say("  (Celery done)")
    return out
