"""Run a real worker pool beside your code: for tests, examples and scripts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence


@contextlib.contextmanager
def worker_process(modules: Sequence[str], *, redis_url: str | None = None,
                   queue: str | None = None, concurrency: int = 2,
                   extra: Sequence[str] = (), path: str | None = None,
                   stop_timeout: float = 30.0) -> Iterator[subprocess.Popen[bytes]]:
    """``emqtasks worker -A MODULE...`` as a subprocess for the ``with`` block.

    ``path`` is put in front of PYTHONPATH so the worker can import the modules. On exit the
    worker gets SIGTERM (a warm stop) and is killed if it outlives ``stop_timeout``.
    """
    cmd = [sys.executable, "-m", "emqtasks.cli", "worker", "-c", str(concurrency), *extra]
    for module in modules:
        cmd += ["-A", module]
    if redis_url:
        cmd += ["--redis-url", redis_url]
    if queue:
        cmd += ["-Q", queue]
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(stop_timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
