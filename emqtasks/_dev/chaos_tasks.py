"""The tasks of the chaos soak (:mod:`emqtasks._dev.chaos`). Each job's only argument is its
own id; a run that got to its end counts itself in a hash outside the queue, so the soak
can tell a lost job (no run) from a duplicate (more than one).

With the soak's history folder in the environment (history.ENV), each run also appends
``start`` and ``end`` records to it, returns its own token (``<job id>|<attempt>|<pid>|<nonce>``)
as its result, and the child records what the server answered its ack: ``ack ok`` (the
task_succeeded hook) or ``ack stale`` (the runner's log line of a fenced-out holder)."""

from __future__ import annotations

import logging
import os
import random
import time
from typing import Any

from ..producer.app import App, default_app
from ..producer.context import JobContext, current_job
from .history import ENV, Recorder
from .taskclient import task_redis

#: Generous: a chaos event fails the attempt of every job in flight, and none of the jobs
#: that should succeed may run out of attempts.
ATTEMPTS = 30
LEASE = 2.0          # short, so the jobs of a SIGKILLed master come back quickly
#: Retries after 0.2 s, doubling to 1 s: a full server fails every attempt of the jobs that
#: run meanwhile (their count of runs is a write it refuses) for seconds at a time.
RETRY_BACKOFF, RETRY_BACKOFF_MAX = 0.2, 1.0

def runs_key(queue: str) -> str:
    return f"emqchaos:{queue}:runs"


def tries_key(queue: str) -> str:
    return f"emqchaos:{queue}:tries"


def group_of(job_id: str, **_: Any) -> str:
    return job_id.split("-", 1)[0]


def chord_group(*_: Any, **__: Any) -> str:
    return "chords"


_history = Recorder(os.environ[ENV], "task") if os.environ.get(ENV) else None
#: (job id, attempt) -> the token of this process's run of it that returned, for the stale
#: ack's record (the runner logs it after the run's context is gone).
_runs: dict[tuple[str, int], str] = {}


def _start(**fields: Any) -> str:
    """This run's token, its start recorded."""
    ctx = current_job()
    run = f"{ctx.id}|{ctx.attempts}|{os.getpid()}|{random.getrandbits(32):08x}"
    if _history is not None:
        _history.record("start", "invoke", id=ctx.id, run=run, **fields)
    return run


def _end(run: str) -> str:
    ctx = current_job()
    _runs[(ctx.id, ctx.attempts)] = run
    if len(_runs) > 1000:
        _runs.pop(next(iter(_runs)))
    if _history is not None:
        _history.record("end", "ok", id=ctx.id, run=run)
    return run


def _ran(job_id: str) -> None:
    time.sleep(random.random() * 0.004)   # a few ms in flight, for the kills to land in
    task_redis().hincrby(runs_key(default_app.settings.queue), job_id, 1)


def work(job_id: str) -> str:
    """Succeeds."""
    run = _start()
    _ran(job_id)
    return _end(run)


def flaky(job_id: str) -> str:
    """Fails its first try, then succeeds: a retry through `delayed`."""
    run = _start()
    if task_redis().hincrby(tries_key(default_app.settings.queue), job_id, 1) == 1:
        raise RuntimeError(f"first try of {job_id} fails on purpose")
    _ran(job_id)
    return _end(run)


def doomed(job_id: str) -> None:
    """Always fails: must end in dead, and only these may."""
    _start()
    raise RuntimeError(f"{job_id} always fails")


def joined(members: list[str], tag: str) -> str:
    """A chord's callback: given its members' results (their run tokens)."""
    return _end(_start(chord=tag, members=members))


def bind(app: App) -> dict[str, Any]:
    """The chaos tasks registered on ``app``, by short name."""
    return {fn.__name__: app.task(fn, name=f"chaos.{fn.__name__}",
                                  group=chord_group if fn is joined else group_of,
                                  lease=LEASE, retry_backoff=RETRY_BACKOFF,
                                  retry_backoff_max=RETRY_BACKOFF_MAX, retry_jitter=False,
                                  max_attempts=2 if fn is doomed else ATTEMPTS)
            for fn in (work, flaky, doomed, joined)}


TASKS = bind(default_app)


class _StaleAcks(logging.Handler):
    """Records ``ack stale`` from the runner's log line of a refused ack (outcome stale)."""

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "emq_job", None)   # the job's fields (worker/logs.py)
        if _history is None or not isinstance(fields, dict) or fields.get("outcome") != "stale":
            return
        run = _runs.get((fields.get("job_id", ""), fields.get("attempt", -1)))
        if run is not None:
            _history.record("ack", "stale", id=fields["job_id"], run=run)


if _history is not None:
    @default_app.on("task_succeeded")
    def _acked(ctx: JobContext) -> None:
        if _history is not None and isinstance(ctx.result, str):
            _history.record("ack", "ok", id=ctx.id, run=ctx.result)

    logging.getLogger("emqtasks.child").addHandler(_StaleAcks(logging.DEBUG))
