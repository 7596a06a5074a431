"""``emqtasks bench --loop-lag``: what an ASGI server's event loop suffers from the producer calls.

An ASGI app (looplag_app.py) on uvicorn in a process of its own, a worker on its queue, and a
client here that sends rounds of 200 concurrent requests (``--concurrency`` sets the
number) to one endpoint at a time: ``/async`` (``await task.adelay()``, ``await
handle.aget()``), ``/sync`` (``task.delay().get()`` in the same ``async def``) and
``/plain`` (no emqtasks). For each: requests/s, the requests' p50/p99 latency, and the
server loop's lag (a coroutine that sleeps 1 ms, late by how much) at p50/p99/max. The
client is a bare HTTP/1.1 one of 200 keep-alive connections, cheap beside the server.
Each endpoint is measured twice: "burst", the 200 fired at once (the server saturated:
what it answers per second, and the lag of a loop that parses 200 requests in one turn,
emqtasks or not: ``/plain`` shows it), and "paced", the 200 started 2.5 ms apart (400
requests/s offered, all in flight together when each waits on a job: the lag a server
that keeps up sees). The server is uvicorn (``pip install -e '.[test]'``).
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
#: Between the starts of a round's requests (seconds): 0 fires the 200 at once (the server
#: saturated: its requests/s), PACED spreads them over half a second (400/s offered, what
#: a server carries: its loop lag).
PACED = 0.0025
#: Under this p99 lag (ms) the async endpoints keep the loop responsive (issue 26's bar).
LAG_BAR_MS = 5.0


def run(redis_url: str | None, concurrency: int, rounds: int, as_json: bool) -> None:
    try:
        import uvicorn  # noqa: F401
    except ImportError:
        raise BenchError("--loop-lag serves its app on uvicorn: pip install -e '.[test]'") \
            from None
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


class Http:
    """A bare HTTP/1.1 client: ``size`` keep-alive connections, one request at a time on
    each (what ``size`` callers would hold), replies read by their Content-Length. Its own
    cost per request is a small part of the server's, so what is measured is the server."""

    def __init__(self, port: int, size: int) -> None:
        self.port = port
        self.size = size
        self.free: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = \
            asyncio.Queue()

    async def open(self) -> None:
        for _ in range(self.size):
            self.free.put_nowait(await asyncio.open_connection("127.0.0.1", self.port))

    async def get(self, path: str) -> tuple[int, Any]:
        reader, writer = await self.free.get()
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            return status, json.loads(await reader.readexactly(length))
        finally:
            self.free.put_nowait((reader, writer))

    async def close(self) -> None:
        while not self.free.empty():
            self.free.get_nowait()[1].close()


async def _measure(port: int, concurrency: int, rounds: int) -> dict[str, dict[str, Any]]:
    await _until_up(port)
    http = Http(port, concurrency)
    await http.open()
    try:
        results = {}
        for endpoint in ENDPOINTS:
            await _round(http, endpoint, concurrency, 0.0)     # warm: connections, pools
            for pace, stagger in (("burst", 0.0), ("paced", PACED)):
                await http.get("/probe/start")
                took: list[float] = []
                began = time.perf_counter()
                for _ in range(rounds):
                    took += await _round(http, endpoint, concurrency, stagger)
                wall = time.perf_counter() - began
                _, lag = await http.get("/probe/stop")
                results[f"{endpoint} {pace}"] = r = _figures(took, wall, lag)
                say(f"  /{endpoint} {pace}: {r['requests_s']:,.0f} req/s, loop lag p99 "
                    f"{r['lag_p99_ms']:.2f} ms")
        return results
    finally:
        await http.close()


async def _until_up(port: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            writer = (await asyncio.open_connection("127.0.0.1", port))[1]
            writer.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise BenchError("the ASGI server did not come up within 30 s") from None
        await asyncio.sleep(0.1)


async def _round(http: Http, endpoint: str, concurrency: int, stagger: float) -> list[float]:
    """``concurrency`` requests, started ``stagger`` seconds apart; each one's latency (s)."""
    async def one(i: int) -> float:
        await asyncio.sleep(i * stagger)
        began = time.perf_counter()
        status, value = await http.get(f"/{endpoint}?i={i}")
        if status != 200 or value != i + 1:
            raise BenchError(f"/{endpoint}?i={i} answered {status} {value!r}")
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
    click.echo(f"{'endpoint':<16}{'req/s':>8}{'p50 ms':>9}{'p99 ms':>9}"
               f"{'lag p50':>9}{'lag p99':>9}{'lag max':>9}  (lag: ms late of a 1 ms sleep)")
    for name, r in results.items():
        click.echo(f"/{name:<15}{r['requests_s']:>8,.0f}{r['latency_p50_ms']:>9.1f}"
                   f"{r['latency_p99_ms']:>9.1f}{r['lag_p50_ms']:>9.2f}{r['lag_p99_ms']:>9.2f}"
                   f"{r['lag_max_ms']:>9.1f}")
    lag = results["async paced"]["lag_p99_ms"]
    verdict = "under" if lag < LAG_BAR_MS else "OVER"
    click.echo(f"/async paced: loop lag p99 {lag:.2f} ms, {verdict} the {LAG_BAR_MS:g} ms bar")
