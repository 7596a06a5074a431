"""The producer figures of ``emqtasks bench --peers``: the round-trip floor, and enqueues one
job a call from one thread, from 8 threads and from 256 coroutines, with each call's latency.

One synchronous enqueue is a round trip, so its yardstick is the floor measured in the same
run on the same server: a raw socket's PING loop (nothing but the loopback and the server's
reply) and redis-py's (a client library's own cost added). Concurrent producers share one
App, as a web app's threads do; each call enqueues one job and waits for its answer.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import redis

from .core import percentile

THREADS = 8
COROUTINES = 256
#: The targets of issue 31: 1-by-1 >= 0.85 x the raw floor; 8 threads >= 3 x Huey's.
ONE_TARGET = 0.85
THREADS_TARGET = 3.0


def raw_ping_floor(url: str, n: int) -> float:
    """Round trips/s of PING written and read on a bare TCP socket (the loopback's floor)."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), 5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reply = bytearray(64)     # (recv_into a buffer: a socket's bytes, never unpickled)
    try:
        if parts.password:
            user = parts.username or "default"
            sock.sendall(b"*3\r\n$4\r\nAUTH\r\n" + _bulk(user) + _bulk(parts.password))
            sock.recv_into(reply)
        ping = b"*1\r\n$4\r\nPING\r\n"
        began = time.perf_counter()
        for _ in range(n):
            sock.sendall(ping)
            got = sock.recv_into(reply)
            if reply[:got] != b"+PONG\r\n":
                raise RuntimeError("the raw PING got another reply")
        return n / (time.perf_counter() - began)
    finally:
        sock.close()


def _bulk(text: str) -> bytes:
    data = text.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def redis_py_ping_floor(url: str, n: int) -> float:
    """Round trips/s of redis-py's ``ping()`` on a client of its own."""
    client = redis.Redis.from_url(url)
    try:
        client.ping()
        began = time.perf_counter()
        for _ in range(n):
            client.ping()
        return n / (time.perf_counter() - began)
    finally:
        client.close()


def one_by_one(call: Callable[[int], Any], n: int) -> dict[str, float]:
    """``call`` n times in a loop: jobs/s, and the p50 / p99 of one call in us (a sparse
    producer: nothing else in flight)."""
    took: list[float] = []
    began = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        call(i)
        took.append(time.perf_counter() - t)
    rate = n / (time.perf_counter() - began)
    return {"rate": rate, "p50": percentile(took, 0.5) * 1e6, "p99": percentile(took, 0.99) * 1e6}


def threaded(call: Callable[[int], Any], n: int, threads: int = THREADS) -> dict[str, float]:
    """n calls shared by ``threads`` threads started together: jobs/s, p50 / p99 per call."""
    per = max(1, n // threads)
    took: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    gate = threading.Barrier(threads + 1)

    def work(k: int) -> None:
        mine = took[k]
        gate.wait()
        try:
            for i in range(per):
                t = time.perf_counter()
                call(k * per + i)
                mine.append(time.perf_counter() - t)
        except BaseException as exc:   # reported after the join
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(threads)]
    for w in workers:
        w.start()
    gate.wait()
    began = time.perf_counter()
    for w in workers:
        w.join(120)
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    every = [x for t in took for x in t]
    return {"rate": len(every) / elapsed, "p50": percentile(every, 0.5) * 1e6,
            "p99": percentile(every, 0.99) * 1e6}


def coroutines(call: Callable[[int], Awaitable[Any]], n: int, tasks: int = COROUTINES,
               close: Callable[[], Awaitable[Any]] | None = None) -> dict[str, float]:
    """n awaited calls shared by ``tasks`` coroutines of one event loop: jobs/s, p50 / p99
    (``close``: awaited at the end, on that loop: an App's aclose)."""
    per = max(1, n // tasks)

    async def main() -> dict[str, float]:
        took: list[float] = []
        await call(0)      # the loop's pool opened outside the timing

        async def one(k: int) -> None:
            for i in range(per):
                t = time.perf_counter()
                await call(k * per + i)
                took.append(time.perf_counter() - t)

        began = time.perf_counter()
        await asyncio.gather(*(one(k) for k in range(tasks)))
        elapsed = time.perf_counter() - began
        if close is not None:
            await close()
        return {"rate": len(took) / elapsed, "p50": percentile(took, 0.5) * 1e6,
                "p99": percentile(took, 0.99) * 1e6}

    return asyncio.run(main())


def verdict(value: float | None, target: float) -> str:
    return "n/a" if value is None else ("met" if value >= target else "not met")
