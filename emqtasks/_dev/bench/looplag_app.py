"""The ASGI app ``emqtasks bench --loop-lag`` serves on uvicorn, and the task its worker runs.

A bare ASGI app (no framework: what is measured is emqtasks' share of the loop's time):

- ``/async?i=N``: ``await add.adelay(N, 1)`` then ``await handle.aget()``;
- ``/sync?i=N``: the same with ``add.delay(N, 1).get()``, blocking the loop meanwhile;
- ``/plain``: no emqtasks at all (what the server and the client cost by themselves);
- ``/probe/start``, ``/probe/stop``: the loop-lag probe's samples between the two.

The probe is a coroutine started with the app that sleeps 1 ms again and again and notes
how late it woke: the time the loop was kept from it by whatever ran in between.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import parse_qs

from ...producer.app import App

#: What the probe sleeps each turn (seconds).
PROBE_SLEEP = 0.001

app = App()    # EMQ_REDIS_URL and EMQ_QUEUE, for the server and the worker alike


@app.task(name="looplag.add")
def add(a: int, b: int) -> int:
    return a + b


class Probe:
    """Sleeps PROBE_SLEEP again and again; while on, records how late each wake was (s)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.on = False

    async def run(self) -> None:
        while True:
            began = time.perf_counter()
            await asyncio.sleep(PROBE_SLEEP)
            if self.on:
                self.samples.append(time.perf_counter() - began - PROBE_SLEEP)


probe = Probe()


async def handle(path: str, query: dict[str, list[str]]) -> Any:
    i = int(query.get("i", ["0"])[0])
    if path == "/async":
        job = await add.adelay(i, 1)
        return await job.aget(timeout=60)
    if path == "/sync":
        return add.delay(i, 1).get(timeout=60)
    if path == "/plain":
        await asyncio.sleep(0)
        return i + 1
    if path == "/probe/start":
        probe.samples, probe.on = [], True
        return "on"
    if path == "/probe/stop":
        probe.on = False
        return probe.samples
    return None


async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ASGI entry point (``uvicorn emqtasks._dev.bench.looplag_app:asgi``)."""
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    query = parse_qs(scope.get("query_string", b"").decode())
    value = await handle(scope["path"], query)
    body = json.dumps(value).encode()
    await send({"type": "http.response.start", "status": 404 if value is None else 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Any, send: Any) -> None:
    task: asyncio.Task[None] | None = None
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await app.aopen()
            task = asyncio.create_task(probe.run())
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if task is not None:
                task.cancel()
            await app.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
