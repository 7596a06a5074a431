"""The masters' heartbeats: one string key per master and queue, and the index that lists them.

A master writes, once per tick and in the same round trip as the tick's reap, its Beat as
JSON under ``QueueKeys.worker(id)`` with an expiry, and its id into the index hash
``QueueKeys.workers``. A master that dies stops beating and its key expires by itself; the
reader drops index entries whose key is gone. No SCAN: a queue of 200,000 job rows lists its
workers in two commands. How often a master beats is heartbeat.py's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .keys import QueueKeys


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


def write(pipe: Any, keys: QueueKeys, beat: Beat, ttl_ms: int) -> None:
    """Queue the heartbeat's two commands on a pipeline (SET PX, HSET of the index)."""
    pipe.set(keys.worker(beat.id), json.dumps(asdict(beat)), px=ttl_ms)
    pipe.hset(keys.workers, beat.id, "1")


def remove(client: Any, keys: QueueKeys, worker_id: str) -> None:
    """A stopping master's goodbye (best effort: its key would expire anyway)."""
    pipe = client.pipeline(transaction=False)
    pipe.delete(keys.worker(worker_id))
    pipe.hdel(keys.workers, worker_id)
    pipe.execute()


def read(client: Any, keys: QueueKeys) -> list[dict[str, Any]]:
    """The workers of a queue whose heartbeat has not expired, oldest first; index entries
    of expired ones are dropped."""
    ids = client.hkeys(keys.workers)
    if not ids:
        return []
    values = client.mget([keys.worker(i) for i in ids])
    gone = [i for i, v in zip(ids, values) if v is None]
    if gone:
        client.hdel(keys.workers, *gone)
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
