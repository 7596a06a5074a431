"""Guarding external writes with the fence: a stale holder's write is refused.

    python examples/fencing/fenced_writes.py

A job publishes a document into SQLite, storing the claim's ``fence`` with it and refusing
any write that brings a smaller one. The first claim stalls (as a paused process would)
until its lease is lost on purpose: the lease is expired and reaped, another child claims
the job again (fence 2) and writes. When the stale holder wakes up, ``still_holds()`` says
False and its write, carrying fence 1, changes nothing.
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
import time
from pathlib import Path

from emqtasks import App, current_job
from emqtasks.testing import worker_process

app = App(redis_url=os.environ.get("EMQ_REDIS_URL", "embedded"), queue="example-fence")
DB = Path(tempfile.gettempdir()) / f"emqtasks-example-fence-{os.getuid()}.db"
K = "example-fence:"
db: sqlite3.Connection | None = None


@app.on("child_started")
def open_db() -> None:
    """Once per worker child, after the fork: its own connection."""
    global db
    db = sqlite3.connect(DB, timeout=10, isolation_level=None)


def write(doc_id: str, body: str, fence: int) -> bool:
    """Upsert the document unless the row already holds a newer fence; True if written."""
    assert db is not None
    cur = db.execute(
        "INSERT INTO docs(id, body, fence) VALUES (?, ?, ?) "
        "ON CONFLICT(id) DO UPDATE SET body = excluded.body, fence = excluded.fence "
        "WHERE excluded.fence >= docs.fence", (doc_id, body, fence))
    return cur.rowcount == 1


@app.task(lease=30.0, max_attempts=3)
def publish(doc_id: str, body: str) -> bool:
    job = current_job()
    if job.fence == 1:
        # The first claim stalls until the example has taken its lease away.
        app.client.rpush(K + "stalled", "1")
        app.client.blpop([K + "go"], timeout=30)
        body += " (from the stale holder)"
    holds = job.still_holds()
    wrote = write(doc_id, body, job.fence)
    app.client.rpush(K + "log", json.dumps([job.fence, holds, wrote]))
    return wrote


def lose_the_lease(job_id: str) -> None:
    """Expire the lease (its deadline into the past) and reap it: the job goes back to its
    lane and another child claims it."""
    q = app.queue()
    while True:
        secs, _ = app.client.time()
        app.client.zadd(q.keys.active, {job_id: int(secs) * 1000 - 60_000}, xx=True)
        if q.reap()[0]:
            return
        time.sleep(0.05)


def wait_for(key: str, n: int) -> None:
    deadline = time.monotonic() + 30
    while app.client.llen(key) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {key}")
        time.sleep(0.02)


def main() -> None:
    app.purge()
    app.client.delete(K + "stalled", K + "go", K + "log")
    DB.unlink(missing_ok=True)
    with sqlite3.connect(DB) as setup:
        setup.execute("CREATE TABLE docs (id TEXT PRIMARY KEY, body TEXT, fence INTEGER)")
    with worker_process(["fenced_writes"], concurrency=2, path=str(Path(__file__).parent)):
        h = publish.delay("doc-1", "hello")
        wait_for(K + "stalled", 1)
        lose_the_lease(h.id)
        wait_for(K + "log", 1)            # the new holder (fence 2) wrote
        app.client.rpush(K + "go", "1")   # the stale holder wakes up
        wait_for(K + "log", 2)
        for fence, holds, wrote in map(json.loads, app.client.lrange(K + "log", 0, -1)):
            print(f"claim with fence {fence}: still_holds() = {holds}, "
                  f"write {'accepted' if wrote else 'refused'}")
        print(f"job result: {h.get(timeout=30)}")
    with sqlite3.connect(DB) as check:
        body, fence = check.execute("SELECT body, fence FROM docs WHERE id = 'doc-1'").fetchone()
    print(f"row doc-1: {body!r}, fence {fence}")
    app.purge()
    app.client.delete(K + "stalled", K + "go", K + "log")
    DB.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
