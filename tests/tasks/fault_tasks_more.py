"""More tasks for the fault-injection tests (test_faults_worker.py,
test_faults_connections.py and test_faults_races.py), run in real workers.

Like fault_tasks.py, each records what it did in Redis under ``t:<queue>:*`` keyed by a tag
the test chooses; times are the server's (ms), so they compare with the job rows.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

from fault_tasks import _k, _r, _started

from emqtasks import Retry, task


def _server_ms() -> int:
    secs, micros = _r().time()
    return int(secs) * 1000 + int(micros) // 1000


def _note(name: str, tag: str, value: object) -> None:
    _r().hset(_k(name), tag, str(value))


def _ran(tag: str) -> None:
    _r().hincrby(_k("runs"), tag, 1)


# -- 12. a task that kills its own child -----------------------------------------------------

@task(name="fm.exit_self", group="suicide", lease=1.0, retry_delay=0.05, max_attempts=3)
def exit_self(tag: str) -> None:
    """Ends its own process without unwinding: no outcome can be written by the child."""
    _started(tag)
    os._exit(1)


@task(name="fm.sigkill_self", group="suicide", lease=1.0, retry_delay=0.05, max_attempts=3)
def sigkill_self(tag: str) -> None:
    _started(tag)
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(10)   # not reached


@task(name="fm.plain", group=lambda tag, *a, **k: tag.split(":")[0], max_attempts=3)
def plain(tag: str) -> int:
    """A normal job: records the pid that ran it."""
    _started(tag)
    _ran(tag)
    return os.getpid()


# -- 13. memory ----------------------------------------------------------------------------------

@task(name="fm.memerr", group="mem", lease=2.0, retry_delay=0.05, max_attempts=3)
def memerr(tag: str, failures: int) -> str:
    """A real MemoryError for its first `failures` starts: an allocation malloc refuses
    (4 EiB, past any address space), so nothing is actually taken from the machine."""
    _started(tag)
    n = int(_r().hget(_k("starts"), tag) or 0)
    if n <= failures:
        bytearray(1 << 62)
    _ran(tag)
    return tag


@task(name="fm.hog", group="mem", lease=2.0, retry_delay=0.05, max_attempts=3)
def hog(tag: str, chunk_mb: int, cap_mb: int) -> str:
    """First start: allocates (and touches) memory chunk by chunk up to cap_mb, noting its
    progress, then waits to be killed. Later starts return at once."""
    _started(tag)
    if int(_r().hget(_k("starts"), tag) or 0) == 1:
        held = []
        while len(held) * chunk_mb < cap_mb:
            held.append(b"\x01" * (chunk_mb << 20))   # bytes * n writes every page
            _note("allocated_mb", tag, len(held) * chunk_mb)
            time.sleep(0.02)
        time.sleep(30)
    _ran(tag)
    return tag


# -- 14. tasks that never return -----------------------------------------------------------

@task(name="fm.forever", group="limit", lease=1.0, retry_delay=0.05, max_attempts=2,
      time_limit=1.0)
def forever(tag: str) -> None:
    """Python code that never returns (but lets signals in between its sleeps)."""
    _started(tag)
    while True:
        time.sleep(0.05)


@task(name="fm.forever_in_c", group="limit", lease=1.0, retry_delay=0.05, max_attempts=1,
      time_limit=1.0)
def forever_in_c(tag: str) -> None:
    """Never returns from C, with the GIL held and SIGTERM kept out (as a C library may do):
    no Python signal handler can run, so only SIGKILL ends it. (A plain usleep would not do:
    a signal interrupts it, and Python then runs the handler.)"""
    _started(tag)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    libc = ctypes.PyDLL("libc.so.6")
    while True:
        libc.usleep(ctypes.c_uint(30_000_000))


@task(name="fm.stubborn", group="limit", lease=1.0, retry_delay=0.05, max_attempts=1,
      time_limit=1.0)
def stubborn(tag: str) -> None:
    """Swallows whatever is raised into it and carries on."""
    _started(tag)
    while True:
        try:
            time.sleep(0.05)
        except BaseException:   # on purpose: a task that will not stop
            _r().hincrby(_k("swallowed"), tag, 1)


# -- 15. a retry delay longer than the lease ------------------------------------------------

@task(name="fm.late", group="late", lease=0.5, retry_delay=2.0, max_attempts=3)
def late(tag: str, how: str) -> str:
    """Fails its first start (raise, Retry(delay=2.0), or kill its own child), noting the
    server time of the failure; the second start notes its server time and succeeds."""
    _started(tag)
    now = _server_ms()
    if int(_r().hget(_k("starts"), tag) or 0) == 1:
        _note("failed_at", tag, now)
        if how == "raise":
            raise RuntimeError("first attempt fails")
        if how == "retry":
            raise Retry(delay=2.0)
        os.kill(os.getpid(), signal.SIGKILL)
    _note("rerun_at", tag, now)
    _ran(tag)
    return tag


# -- 16. pause and resume racing -----------------------------------------------------------------

@task(name="fm.quick", group=lambda tag, *a, **k: tag.split(":")[0], max_attempts=3)
def quick(tag: str) -> str:
    _ran(tag)
    return tag


# -- 18. a burst ---------------------------------------------------------------------------------

@task(name="fm.burst", group=lambda i, **_: f"b{i % 8}", max_attempts=3, result_ttl=1)
def burst(i: int) -> None:
    """One counter for the whole burst (no per-job record: the memory check would see it)."""
    _r().incr(_k("burst"))
