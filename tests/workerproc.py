"""Start and stop a real ``emqtasks worker`` subprocess for tests; bounded waits only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent


class WorkerProc:
    def __init__(self, redis_url: str, queue: str, *extra: str, concurrency: int = 2,
                 tick: float = 0.2, modules: tuple[str, ...] = ("worker_tasks",)) -> None:
        log_dir = Path(os.environ.get("TMPDIR", "/tmp"))
        self.log_path = log_dir / f"emq-worker-{queue}-{time.time_ns()}.log"
        cmd = [sys.executable, "-m", "emqtasks.cli", "worker", "-c", str(concurrency),
               "-Q", queue, "--redis-url", redis_url, "--tick", str(tick), *extra]
        for m in modules:
            cmd += ["-A", m]
        env = dict(os.environ, PYTHONPATH=str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   EMQ_REDIS_URL=redis_url)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text()

    def children(self) -> list[int]:
        try:
            text = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def wait_for(self, predicate: Callable[[], object], timeout: float = 15.0,
                 what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; worker log:\n{self.output()}")
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited ({self.proc.returncode}) while waiting "
                                     f"for {what}; log:\n{self.output()}")
            time.sleep(0.02)

    def wait_ready(self, timeout: float = 15.0) -> None:
        self.wait_for(lambda: "tasks registered" in self.output() and len(self.children()) > 0,
                      timeout, "worker start")

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.log.close()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the master only (its children notice through the parent-death signal)."""
        self.proc.kill()
        self.proc.wait(5)

    def __enter__(self) -> WorkerProc:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(5)
        if not self.log.closed:
            self.log.close()
