"""Live workers: the heartbeat each master writes on its tick, and the list read from it.

A master writes, once per tick and in the same round trip as the tick's reap, one string
key per queue it serves, ``emq:{q}:worker:<id>`` (JSON: host, pid, queues, concurrency,
busy children, version, started, and the server time of the beat), set with an expiry of
BEAT_TICKS ticks, and the worker's id into the queue's index hash ``emq:{q}:workers``. A
master that dies stops beating and its key expires by itself; the reader drops index
entries whose key is gone. No SCAN: a queue of 200,000 job rows lists its workers in two
commands.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import Any

#: A heartbeat lives this many ticks: a master missing two beats in a row is gone.
BEAT_TICKS = 3


@dataclass
class Beat:
    """What one master says about itself on each tick."""

    host: str
    pid: int
    queues: list[str]
    concurrency: int
    version: str
    started: float            # unix seconds, the master's clock (for display only)
    busy: int = 0             # children running a job now
    id: str = field(default="")

    def __post_init__(self) -> None:
        if not self.id:
            self.id = f"{self.host}:{self.pid}:{int(self.started * 1000)}"


def new_beat(queues: list[str], concurrency: int) -> Beat:
    from .._version import __version__
    return Beat(socket.gethostname(), os.getpid(), list(queues), concurrency, __version__,
                time.time())


def worker_key(base: str, worker_id: str) -> str:
    return f"{base}worker:{worker_id}"


def index_key(base: str) -> str:
    return f"{base}workers"


def write(pipe: Any, base: str, beat: Beat, ttl_ms: int) -> None:
    """Queue the heartbeat's two commands on a pipeline (SET PX, HSET of the index)."""
    pipe.set(worker_key(base, beat.id), json.dumps(asdict(beat)), px=ttl_ms)
    pipe.hset(index_key(base), beat.id, "1")


def remove(client: Any, base: str, worker_id: str) -> None:
    """A stopping master's goodbye (best effort: its key would expire anyway)."""
    pipe = client.pipeline(transaction=False)
    pipe.delete(worker_key(base, worker_id))
    pipe.hdel(index_key(base), worker_id)
    pipe.execute()


def read(client: Any, base: str) -> list[dict[str, Any]]:
    """The workers of a queue whose heartbeat has not expired, oldest first; index entries
    of expired ones are dropped."""
    ids = client.hkeys(index_key(base))
    if not ids:
        return []
    values = client.mget([worker_key(base, i) for i in ids])
    gone = [i for i, v in zip(ids, values) if v is None]
    if gone:
        client.hdel(index_key(base), *gone)
    out = []
    for v in values:
        if v is None:
            continue
        try:
            out.append(json.loads(v))
        except ValueError:
            continue
    out.sort(key=lambda w: (w.get("started", 0), w.get("id", "")))
    return out
