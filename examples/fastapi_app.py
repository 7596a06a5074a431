"""An ASGI app (FastAPI) that enqueues jobs and awaits their results without blocking its loop.

    pip install fastapi uvicorn httpx
    python examples/fastapi_app.py          # a worker, the app on uvicorn, a few requests

or serve it yourself (from examples/, EMQ_REDIS_URL pointing at your server):

    emqtasks worker -A fastapi_app -c 2
    uvicorn fastapi_app:api
    curl -X POST 'localhost:8000/add?a=2&b=3'

The lifespan opens the App's pool on the server's event loop (a wrong URL fails the start,
not the first request) and closes it at shutdown. Every handler awaits: ``adelay`` sends
the job, ``aget`` waits on the job's own notification key while the loop serves others.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException

from emqtasks import App, ResultTimeout, TaskFailed
from emqtasks.testing import worker_process

app = App(redis_url=os.environ.get("EMQ_REDIS_URL", "embedded"), queue="example-fastapi")


@app.task
def add(a: int, b: int) -> int:
    return a + b


@app.task(group=lambda tenant, *_a, **_k: tenant)   # fair between tenants
def report(tenant: str, rows: int) -> str:
    return f"{tenant}: {rows} rows"


@app.task(max_attempts=1)
def divide(a: int, b: int) -> float:
    return a / b


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    await app.aopen()
    yield
    await app.aclose()


api = FastAPI(lifespan=lifespan)


@api.post("/add")
async def add_now(a: int, b: int) -> dict[str, Any]:
    """Enqueue and await the result within the request."""
    handle = await add.adelay(a, b)
    return {"job": handle.id, "result": await handle.aget(timeout=10)}


@api.post("/divide")
async def divide_now(a: int, b: int) -> dict[str, Any]:
    handle = await divide.adelay(a, b)
    try:
        return {"result": await handle.aget(timeout=10)}
    except TaskFailed as exc:
        raise HTTPException(422, f"failed on the worker: {exc}") from None
    except ResultTimeout:
        raise HTTPException(504, f"job {handle.id} is still running") from None


@api.post("/reports/{tenant}", status_code=202)
async def start_reports(tenant: str, count: int = 3) -> dict[str, Any]:
    """Fire and forget: one round trip for every job, the ids back at once."""
    handles = await report.amap([(tenant, n) for n in range(count)])
    return {"jobs": [h.id for h in handles]}


@api.get("/jobs/{job_id}")
async def job(job_id: str) -> dict[str, Any]:
    info = await app.ajob(job_id)
    if info is None:
        raise HTTPException(404, f"no job {job_id}")
    return {"id": job_id, "state": info["state"]}


@api.delete("/jobs/{job_id}")
async def cancel(job_id: str) -> dict[str, str]:
    return {"verdict": (await app.acancel(job_id)).name.lower()}


@api.get("/stats")
async def stats() -> dict[str, Any]:
    s = await app.astats()
    return {"pending": s["pending"], "active": s["active"], "groups": sorted(s["groups"])}


async def demo() -> None:
    """Serve the app on uvicorn on a free port and send it a few requests."""
    import httpx
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(api, host="127.0.0.1", port=0, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        sums = await asyncio.gather(*(http.post("/add", params={"a": i, "b": 1})
                                      for i in range(50)))
        print(f"50 concurrent /add -> {sum(r.json()['result'] for r in sums)}")
        failed = await http.post("/divide", params={"a": 1, "b": 0})
        print(f"/divide by 0 -> {failed.status_code} {failed.json()['detail']}")
        jobs = (await http.post("/reports/acme", params={"count": 3})).json()["jobs"]
        print(f"/reports/acme -> {len(jobs)} jobs accepted")
        for _ in range(500):
            states = [(await http.get(f"/jobs/{j}")).json()["state"] for j in jobs]
            if states == ["done"] * 3:
                break
            await asyncio.sleep(0.02)
        print(f"report states: {', '.join(states)}")
        print(f"/stats -> {(await http.get('/stats')).json()}")
    server.should_exit = True
    await serving


def main() -> None:
    app.purge()
    with worker_process(["fastapi_app"], concurrency=2, path=str(Path(__file__).parent)):
        asyncio.run(demo())
    app.purge()


if __name__ == "__main__":
    main()
