"""``emqtasks bench --loop-lag``: what an ASGI server's event loop suffers from the producer calls.

An ASGI app (looplag_app.py) on uvicorn in a process of its own, a worker on its queue, and a
client here that sends rounds of 200 concurrent requests (``--concurrency`` sets the
number) to one endpoint at a time: ``/async`` (``await task.adelay()``, ``await
handle.aget()``), ``/sync`` (``task.delay().get()`` in the same ``async def``) and
``/plain`` (no emqtasks). For each: requests/s, the requests' p50/p99 latency, and the
server loop's lag (a coroutine that sleeps 1 ms, late by how much) at p50/p99/max. The
client is httpx, as a Python caller of the API would be (uvicorn and httpx: ``pip install
-e '.[test]'``): its pace spreads the requests' arrivals as many callers' would. (A client
that fires all 200 in one instant makes the server parse 200 requests in one turn of its
loop: then the lag is the HTTP stack's, with or without emqtasks.)
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import click

from ...testing import WorkerProcess
from ..localserver import free_port
from .core import BenchError, percentile, say
from .harness import open_server

APP = "emqtasks._dev.bench.looplag_app"
ENDPOINTS = ("async", "sync", "plain")
#: Under this p99 lag (ms) the async endpoints keep the loop responsive (issue 26's bar).
LAG_BAR_MS = 5.0


def run(redis_url: str | None, concurrency: int, rounds: int, as_json: bool) -> None:
    try:
        import httpx  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise BenchError(f"--loop-lag needs uvicorn and httpx ({exc.name} is missing): "
                         "pip install -e '.[test]'") from None
    server, url, version = open_server(redis_url)
    queue = f"bench-lag-{uuid.uuid4().hex[:8]}"
    logs = Path(tempfile.mkdtemp(prefix="emq-bench-lag-"))
    env = dict(os.environ, EMQ_REDIS_URL=url, EMQ_QUEUE=queue)
    port = free_port()
    web = subprocess.Popen([sys.executable, "-m", "uvicorn", f"{APP}:asgi", "--host",
                            "127.0.0.1", "--port", str(port), "--log-level", "warning",
                            "--no-access-log", "--loop", "asyncio", "--lifespan", "on"],
                           env=env, stdout=subprocess.DEVNULL,
                           stderr=open(logs / "uvicorn.log", "w"))  # noqa: SIM115
    worker = WorkerProcess([APP], redis_url=url, queue=queue, concurrency=2, env=env,
                           log_path=logs / "worker.log")
    try:
        worker.wait_ready(30)
        say(f"emqtasks bench --loop-lag: redis {version}, uvicorn on :{port}, worker -c 2, "
            f"{rounds} rounds of {concurrency} concurrent requests per endpoint")
        results = asyncio.run(_measure(port, concurrency, rounds))
    finally:
        worker.stop(15)
        web.terminate()
        try:
            web.wait(15)
        except subprocess.TimeoutExpired:
            web.kill()
        from ...producer.app import App

        App(redis_url=url, queue=queue).purge()
        if server is not None:
            server.close()
    _report(results, version, concurrency, rounds, as_json)


async def _measure(port: int, concurrency: int, rounds: int) -> dict[str, dict[str, Any]]:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits,
                                 timeout=300) as http:
        await _until_up(http)
        results = {}
        for endpoint in ENDPOINTS:
            await _round(http, endpoint, concurrency)          # warm: connections, pools
            (await http.get("/probe/start")).raise_for_status()
            took: list[float] = []
            began = time.perf_counter()
            for _ in range(rounds):
                took += await _round(http, endpoint, concurrency)
            wall = time.perf_counter() - began
            lag = (await http.get("/probe/stop")).json()
            results[endpoint] = _figures(took, wall, lag)
            say(f"  /{endpoint}: {results[endpoint]['requests_s']:,.0f} req/s, loop lag p99 "
                f"{results[endpoint]['lag_p99_ms']:.2f} ms")
        return results


async def _until_up(http: Any) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            if (await http.get("/plain")).status_code == 200:
                return
        except Exception:
            if time.monotonic() > deadline:
                raise BenchError("the ASGI server did not come up within 30 s") from None
        await asyncio.sleep(0.1)


async def _round(http: Any, endpoint: str, concurrency: int) -> list[float]:
    """``concurrency`` requests at once; each one's latency (s)."""
    async def one(i: int) -> float:
        began = time.perf_counter()
        reply = await http.get(f"/{endpoint}", params={"i": i})
        if reply.status_code != 200 or reply.json() != i + 1:
            raise BenchError(f"/{endpoint}?i={i} answered {reply.status_code} {reply.text}")
        return time.perf_counter() - began
    return list(await asyncio.gather(*(one(i) for i in range(concurrency))))


def _figures(took: list[float], wall: float, lag: list[float]) -> dict[str, Any]:
    ms = [x * 1000 for x in lag] or [0.0]
    return {"requests": len(took), "wall_s": wall, "requests_s": len(took) / wall,
            "latency_p50_ms": percentile(took, 0.5) * 1000,
            "latency_p99_ms": percentile(took, 0.99) * 1000,
            "lag_samples": len(lag), "lag_p50_ms": percentile(ms, 0.5),
            "lag_p99_ms": percentile(ms, 0.99), "lag_max_ms": max(ms)}


def _report(results: dict[str, dict[str, Any]], version: str, concurrency: int, rounds: int,
            as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"redis_version": version, "concurrency": concurrency,
                               "rounds": rounds, "lag_bar_ms": LAG_BAR_MS,
                               "endpoints": results}, indent=2))
        return
    click.echo(f"emqtasks bench --loop-lag: redis {version}, {rounds} x {concurrency} "
               "concurrent requests per endpoint, uvicorn + worker -c 2 on this machine")
    click.echo(f"{'endpoint':<10}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
               f"{'lag p50':>9}{'lag p99':>9}{'lag max':>9}  (lag: ms late of a 1 ms sleep)")
    for name, r in results.items():
        click.echo(f"/{name:<9}{r['requests_s']:>9,.0f}{r['latency_p50_ms']:>9.1f}"
                   f"{r['latency_p99_ms']:>9.1f}{r['lag_p50_ms']:>9.2f}{r['lag_p99_ms']:>9.2f}"
                   f"{r['lag_max_ms']:>9.1f}")
    verdict = "under" if results["async"]["lag_p99_ms"] < LAG_BAR_MS else "OVER"
    click.echo(f"async endpoints' loop lag p99 {results['async']['lag_p99_ms']:.2f} ms: "
               f"{verdict} the {LAG_BAR_MS:g} ms bar")
