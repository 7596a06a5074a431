"""Run your tasks beside your code and your tests: a real worker pool (``WorkerProcess``,
the one launcher of ``emqtasks worker`` subprocesses, used by your tests and examples and by
emqtasks' own tests, bench and demo), or the due jobs of a queue here, in this process
(``run_pending``, ``InlineApp``). The pytest plugin (emqtasks/pytest.py) is built on both."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .producer.app import App
from .store.queue import Queue

if TYPE_CHECKING:
    from .worker.runner import Outcome

#: The most jobs one run_pending() runs: a task that enqueues itself, or work that keeps
#: making work, fails the call instead of running for ever.
PENDING_LIMIT = 1000


class WorkerProcess:
    """``emqtasks worker -A MODULE...`` as a subprocess, in its own process group.

    ``path`` goes in front of PYTHONPATH so the worker can import the modules. With
    ``log_path`` its output goes to that file (``output()`` reads it); without, it shares
    this process's stdout and stderr. Every wait is bounded.
    """

    def __init__(self, modules: Sequence[str], *, redis_url: str | None = None,
                 queue: str | None = None, concurrency: int = 2, tick: float | None = None,
                 extra: Sequence[str] = (), path: str | None = None,
                 env: Mapping[str, str] | None = None, log_path: Path | None = None) -> None:
        cmd = [sys.executable, "-m", "emqtasks.cli", "worker", "-c", str(concurrency)]
        for module in modules:
            cmd += ["-A", module]
        if redis_url:
            cmd += ["--redis-url", redis_url]
        if queue:
            cmd += ["-Q", queue]
        if tick is not None:
            cmd += ["--tick", f"{tick:g}"]
        cmd += list(extra)
        environ = dict(os.environ if env is None else env)
        if path:
            environ["PYTHONPATH"] = os.pathsep.join(filter(None, [path,
                                                                  environ.get("PYTHONPATH")]))
        self.log_path = log_path
        self.log: IO[str] | None = open(log_path, "w") if log_path else None  # noqa: SIM115
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, env=environ, start_new_session=True,
                                     stdout=self.log, stderr=subprocess.STDOUT if self.log
                                     else None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self, tail: int | None = None) -> str:
        """The worker's log so far (its last ``tail`` lines); "" without a log file."""
        if self.log_path is None:
            return ""
        if self.log is not None and not self.log.closed:
            self.log.flush()
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text if tail is None else "\n".join(text.splitlines()[-tail:])

    def children(self) -> list[int]:
        """The pids of the master's children (Linux)."""
        try:
            text = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def wait_for(self, predicate: Callable[[], object], timeout: float = 15.0,
                 what: str = "condition") -> None:
        """Until predicate() is true; AssertionError with the log on timeout or exit."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; worker log:\n"
                                     f"{self.output()}")
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited ({self.proc.returncode}) while waiting "
                                     f"for {what}; log:\n{self.output()}")
            time.sleep(0.02)

    def wait_ready(self, timeout: float = 15.0) -> None:
        """Until the master logged its start and forked its children (needs log_path)."""
        self.wait_for(lambda: "tasks registered" in self.output() and len(self.children()) > 0,
                      timeout, "worker start")

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (a warm stop), then SIGKILL of the group if it outlives ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill_group()
        self._close_log()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the master only (its children notice through the parent-death signal)."""
        self.proc.kill()
        self.proc.wait(5)

    def _kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(5)

    def _close_log(self) -> None:
        if self.log is not None and not self.log.closed:
            self.log.close()

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self._kill_group()
        self._close_log()


@contextlib.contextmanager
def worker_process(modules: Sequence[str], *, redis_url: str | None = None,
                   queue: str | None = None, concurrency: int = 2,
                   extra: Sequence[str] = (), path: str | None = None,
                   stop_timeout: float = 30.0,
                   **options: Any) -> Iterator[subprocess.Popen[bytes]]:
    """A worker pool for the length of a ``with`` block (yields its Popen); on exit it gets
    SIGTERM (a warm stop) and is killed if it outlives ``stop_timeout``."""
    worker = WorkerProcess(modules, redis_url=redis_url, queue=queue, concurrency=concurrency,
                           extra=extra, path=path, **options)
    try:
        yield worker.proc
    finally:
        worker.stop(stop_timeout)


def run_pending(queue: Queue, *, limit: int = PENDING_LIMIT) -> list[Outcome]:
    """Claim and run every job of ``queue`` that is due, here, one at a time, until none is
    due; returns what became of each, in the order they ran.

    The jobs run as a worker's child runs them — the same Runner, on the tasks and hooks
    of every App in this process: claimed in the ring's order, a success acknowledged, a
    failure retried or dead by its task's policy. A retry due at once (``retry_delay=0``)
    runs again in this call; one with a delay stays delayed, as do jobs enqueued with a
    countdown. A sync task's ``time_limit`` is not enforced (a worker's master does that).
    More than ``limit`` jobs in one call raise RuntimeError.
    """
    # Imported here: importing emqtasks.testing (the examples do) loads no worker module
    from .worker.runner import Runner

    runner = Runner(queue)
    outcomes: list[Outcome] = []
    try:
        while True:
            outcome = runner.run_once()
            if outcome is None:
                moved, _ = queue.promote()   # retries and countdowns that are due now
                if moved:
                    continue
                return outcomes
            outcomes.append(outcome)
            if len(outcomes) > limit:
                raise RuntimeError(f"run_pending ran more than {limit} jobs and more are "
                                   f"due (a task that enqueues itself?); pass limit=N to "
                                   f"allow more")
    finally:
        runner.close()


class InlineApp(App):
    """An App that also runs its queue's due jobs in this process: ``run_pending()``. The
    pytest plugin's ``emq_app`` is one; it serves as any App otherwise."""

    def run_pending(self, queue: str | None = None, *,
                    limit: int = PENDING_LIMIT) -> list[Outcome]:
        """run_pending() on this App's queue (or the one named)."""
        return run_pending(self.queue(queue), limit=limit)
