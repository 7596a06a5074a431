"""Batch enqueue: map() sends thousands of jobs in one round trip, each with its own verdict.

    python examples/batch.py
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from emqtasks import App
from emqtasks.testing import worker_process

app = App(redis_url=os.environ.get("EMQ_REDIS_URL", "embedded"), queue="example-batch")


@app.task(group=lambda album, photo: f"album-{album}", result_ttl=60)
def thumbnail(album: int, photo: int) -> int:
    return album * 1000 + photo


def main() -> None:
    app.purge()
    calls = [(album, photo) for album in range(10) for photo in range(500)]
    started = time.perf_counter()
    handles = thumbnail.map(calls)
    took = time.perf_counter() - started
    print(f"enqueued {len(handles)} jobs in one call: {len(handles) / took:,.0f} jobs/s")
    with worker_process(["batch"], concurrency=4, path=str(Path(__file__).parent)):
        total = sum(h.get(timeout=120) for h in handles)
    print(f"all {len(handles)} done, checksum {total}")
    app.purge()


if __name__ == "__main__":
    main()
