"""The child: claim -> run -> ack, repeat until a claim answers empty; never crashed by a job.

A child waits on its pipe for the master's go, drains, and reports idle. It talks to Redis
over its own connection, opened after the fork, and to its master only over the pipe and
the shared slots (see slots.py). A job's outcome is one of: acknowledged with its result,
retried after a delay, or dead-lettered with the reason.
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import serialization
from ..errors import RateLimited, Retry, SerializationError, TimeLimitExceeded, UnknownTask
from ..queue import Lease, Queue
from ..registry import Registry
from .resilience import Outage
from .slots import Slots

log = logging.getLogger("emqtasks.child")

#: The most of an error message (or task name) a failure log line quotes.
LOG_TEXT_MAX = 300

GO, STOP = b"go", b"stop"          # master -> child
GOT_WORK, IDLE = b"g", b"i"        # child -> master: "claimed, and more is waiting" / idle


@dataclass(frozen=True)
class Outcome:
    """What became of one job, for tests and the summary."""

    job_id: str
    verdict: str          # done, retry, dead, stale, rate_limited
    error: str | None = None


class Runner:
    """Runs leases against a registry and reports each outcome through the fence."""

    def __init__(self, queue: Queue, registry: Registry | None = None,
                 default_time_limit: float = 0.0) -> None:
        self.queue = queue
        #: Default: the tasks of every App in this process.
        self.registry = registry if registry is not None else every_task()
        self.default_time_limit = default_time_limit
        self._signatures: dict[str, inspect.Signature | None] = {}
        #: How Redis calls are made; a child routes them through its Outage.
        self.call: Callable[..., Any] = lambda fn, *args: fn(*args)
        #: The job of the last execute(), and whether its task function is running now
        #: (a time-limit SIGTERM raises into the task only then).
        self.current: Lease | None = None
        self.in_task = False

    def prepare(self, lease: Lease) -> tuple[Callable[..., Any], list[Any], dict[str, Any]]:
        """Look the task up and decode its arguments; raises for a job that can never run."""
        task = self.registry.get(lease.task)
        args, kwargs = serialization.loads_args(lease.payload)
        sig = self._signature(lease.task, task.spec.fn)
        if sig is not None:
            try:
                sig.bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"arguments do not fit {lease.task}{sig}: {exc}") from None
        return task.spec.fn, args, kwargs

    def _signature(self, name: str, fn: Callable[..., Any]) -> inspect.Signature | None:
        if name not in self._signatures:
            try:
                self._signatures[name] = inspect.signature(fn)
            except (TypeError, ValueError):
                self._signatures[name] = None
        return self._signatures[name]

    def time_limit(self, lease: Lease) -> float:
        if lease.task in self.registry:
            limit = self.registry.get(lease.task).spec.time_limit
            if limit:
                return float(limit)
        return self.default_time_limit

    def execute(self, lease: Lease) -> tuple[str | None, Outcome | None]:
        """Run one job. Returns (result JSON, None) on success, else (None, its outcome)
        after the failure went through the fence. The caller acks a success."""
        try:
            fn, args, kwargs = self.prepare(lease)
        except (UnknownTask, SerializationError, TypeError) as exc:
            return None, self._fail(lease, f"{type(exc).__name__}: {exc}", final=True)
        self.current = lease
        try:
            self.in_task = True
            try:
                value = fn(*args, **kwargs)
            finally:
                self.in_task = False
        except Retry as exc:
            return None, self._fail(lease, _describe(exc), delay=exc.delay)
        except RateLimited as exc:
            return None, self._back_off(lease, exc)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            return None, self._fail(lease, _describe(exc))
        try:
            return serialization.dumps_result(value), None
        except SerializationError as exc:
            return None, self._fail(lease, f"{type(exc).__name__}: {exc}", final=True)

    def _fail(self, lease: Lease, error: str, delay: float | None = None,
              final: bool = False) -> Outcome:
        verdict = self.call(self.queue.retry, lease, error, delay, final)
        name = verdict.outcome
        log.warning("job %s (%s) failed, %s: %s", lease.id, _brief(lease.task, 120), name,
                    _brief(error.strip().splitlines()[-1] if error.strip() else error))
        return Outcome(lease.id, name, error)

    def _back_off(self, lease: Lease, exc: RateLimited) -> Outcome:
        """The task hit an outside limit: the job goes back to its lane unspent and its
        group sits out the delay (fenced; STALE if the lease was lost meanwhile)."""
        reason = f"{RateLimited.__name__}: {exc}"
        verdict = self.call(self.queue.release, lease, reason, exc.delay)
        name = "rate_limited" if verdict else "stale"
        log.info("job %s (%s) %s: group %s sits out %gs", lease.id, _brief(lease.task, 120),
                 name, _brief(lease.group, 120), exc.delay)
        return Outcome(lease.id, name, reason)

    def run_once(self) -> Outcome | None:
        """Claim one job, run it, settle it. For tests and scripts: None when nothing waits."""
        leases = self.queue.claim(1)
        if not leases:
            return None
        result, outcome = self.execute(leases[0])
        if outcome is not None:
            return outcome
        acked, _ = self.queue.ack(leases[0], result or "null")
        return Outcome(leases[0].id, "done" if acked else "stale")


def every_task() -> Registry:
    """One table of the tasks of every App in this process (DuplicateTaskName if two Apps
    give one name to different functions)."""
    from ..app import all_apps

    return Registry.merged(app.registry for app in all_apps())


def _brief(text: str, limit: int = LOG_TEXT_MAX) -> str:
    """Text cut for a log line: an error message may quote a whole payload (the row keeps
    the full text; logs get the start of it and its length)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def _describe(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"{type(exc).__name__}: {exc}\n{text}"


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this child when the master dies (no-op elsewhere)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Child:
    """The loop of one forked child."""

    def __init__(self, index: int, pipe: Any, slots: Slots, make_queue: Callable[[], Queue],
                 master_pid: int, max_tasks: int, default_time_limit: float,
                 registry: Registry) -> None:
        self.index = index
        self.registry = registry
        self.pipe = pipe
        self.slots = slots
        self.make_queue = make_queue
        self.master_pid = master_pid
        self.max_tasks = max_tasks
        self.default_time_limit = default_time_limit
        self.done = 0
        self.terminating = False

    def main(self) -> None:
        # Ctrl-C reaches the whole process group and systemd sends SIGTERM to the whole
        # cgroup: both are the master's to handle. A SIGTERM here only means "finish this
        # job and claim no more", so a job is never cut short by the group signal.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        _die_with_parent()
        if os.getppid() != self.master_pid:
            return
        # Keep retrying Redis through a warm stop (the ack of the last job must land); give
        # up only when the master is gone.
        self.outage = Outage(log, f"child {self.index}",
                             stop=lambda: os.getppid() != self.master_pid)
        # A cluster client connects as it is made: ride out a server that is down now,
        # rather than die and be respawned in a tight loop.
        queue = self.outage.call(self.make_queue)
        self.runner = Runner(queue, self.registry, self.default_time_limit)
        self.runner.call = self.outage.call
        self.outage.call(queue.ping)   # connect now: the first wake pays no handshake
        while not self._should_stop():
            try:
                message = self.pipe.recv_bytes()
            except (EOFError, OSError):
                return
            if message == STOP:
                return
            self._drain()
            if self._spent():
                return
            self.pipe.send_bytes(IDLE)

    def _on_term(self, _signum: int, _frame: Any) -> None:
        runner: Runner | None = getattr(self, "runner", None)
        lease = runner.current if runner is not None else None
        if runner is not None and lease is not None \
                and self.slots.take_time_limit(self.index, lease.nonce):
            # The master's SIGTERM for a job past its time limit: stop the task (the runner
            # fails the job through the fence) and stay for the next job. The one handler
            # that raises: as with Celery's soft time limit, the task itself must be left.
            # Past the task already (its result being written): nothing to stop.
            if runner.in_task:
                limit = runner.time_limit(lease)
                raise TimeLimitExceeded(f"ran past its time limit of {limit:g}s")
            return
        self.terminating = True

    def _spent(self) -> bool:
        return self.max_tasks > 0 and self.done >= self.max_tasks

    def _should_stop(self) -> bool:
        return (self.terminating or self.slots.stopping or os.getppid() != self.master_pid
                or self._spent())

    def _drain(self) -> None:
        queue, runner, slots, index = self.runner.queue, self.runner, self.slots, self.index
        if self._should_stop():
            return
        leases = self.outage.call(queue.claim, 1)
        if not leases:
            return
        if leases[0].more:
            self.pipe.send_bytes(GOT_WORK)   # there is more: the master recruits a sibling
        lease: Lease | None = leases[0]
        while lease is not None:
            slots.start(index, lease, runner.time_limit(lease))
            result, outcome = runner.execute(lease)
            # The slot keeps the lease until its outcome is written: a child that dies in
            # between has its job retried through the fence (stale if the ack landed).
            self.done += 1
            more = not self._should_stop()
            if outcome is None:
                _, lease = self.outage.call(queue.ack, lease, result or "null", more)
            elif more:
                claimed = self.outage.call(queue.claim, 1)
                lease = claimed[0] if claimed else None
            else:
                lease = None
        slots.clear(index)
