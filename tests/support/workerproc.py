"""The tests' worker subprocess: emqtasks.testing.WorkerProcess with the suite's defaults
(modules from tests/tasks, a fast tick, a log file per worker)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from emqtasks.testing import WorkerProcess

#: The folder of the task modules workers import with -A.
HERE = Path(__file__).resolve().parent.parent / "tasks"


class WorkerProc(WorkerProcess):
    def __init__(self, redis_url: str, queue: str, *extra: str, concurrency: int = 2,
                 tick: float = 0.2, modules: tuple[str, ...] = ("worker_tasks",)) -> None:
        log_dir = Path(os.environ.get("TMPDIR", "/tmp"))
        env = dict(os.environ, EMQ_REDIS_URL=redis_url)
        super().__init__(modules, redis_url=redis_url, queue=queue, concurrency=concurrency,
                         tick=tick, extra=extra, path=str(HERE), env=env,
                         log_path=log_dir / f"emq-worker-{queue}-{time.time_ns()}.log")

    def stop(self, timeout: float = 20.0) -> int:
        return super().stop(timeout)
