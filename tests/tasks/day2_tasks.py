"""Tasks of the day-two tests (async tasks, several queues, retry policies, the job's
context, hooks), run by real worker processes. Each records what it did in Redis, under keys
of the worker's first queue (the default app points there)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time

from emqtasks import NoCurrentJob, Retry, current_job, default_app, on, task


def _r():  # type: ignore[no-untyped-def]
    return default_app.client


def _k(name: str) -> str:
    return f"t2:{default_app.settings.queue}:{name}"


def _server_ms() -> int:
    secs, micros = _r().time()
    return int(secs) * 1000 + int(micros) // 1000


# -- async tasks ---------------------------------------------------------------------------
@task(name="d2.async_add", retry_delay=0.05)
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0.01)
    return a + b


@task(name="d2.async_flaky", retry_delay=0.05, max_attempts=3)
async def async_flaky(tag: str) -> int:
    n = _r().hincrby(_k("tries"), tag, 1)
    await asyncio.sleep(0)
    if n < 3:
        raise ValueError(f"try {n} of {tag}")
    return n


@task(name="d2.async_stuck", time_limit=0.5, max_attempts=2, retry_delay=0.05)
async def async_stuck(tag: str) -> None:
    _r().hincrby(_k("starts"), tag, 1)
    await asyncio.sleep(60)


@task(name="d2.async_nap", group=lambda tag, *a, **k: tag.split(":")[0], retry_delay=0.05,
      lease=2.0, max_attempts=5)
async def async_nap(tag: str, seconds: float) -> str:
    """Counts how many naps run at once (the highest count seen is kept), then counts its
    completion per tag."""
    r = _r()
    now = r.incr(_k("running"))
    r.eval("if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then "
           "redis.call('SET', KEYS[1], ARGV[1]) end", 1, _k("peak"), now)
    r.hincrby(_k("starts"), tag, 1)
    r.hset(_k("pid"), tag, os.getpid())
    try:
        await asyncio.sleep(seconds)
    finally:
        r.decr(_k("running"))
    r.hincrby(_k("runs"), tag, 1)
    return tag


@task(name="d2.sync_record", group=lambda tag, *a, **k: tag.split(":")[0], retry_delay=0.05)
def sync_record(tag: str) -> str:
    """Notes its start order on the worker's first queue and the queue it ran from."""
    r = _r()
    r.rpush(_k("order"), tag)
    r.hset(_k("queue_of"), tag, current_job().queue)
    return tag


# -- retry policies ------------------------------------------------------------------------
@task(name="d2.backoff", retry_backoff=0.4, retry_jitter=False, retry_backoff_max=1.6,
      max_attempts=5, retry_delay=5.0)
def backoff(tag: str) -> None:
    """Always fails, noting the server time of each start."""
    _r().rpush(_k(f"at:{tag}"), _server_ms())
    raise RuntimeError(f"failure of {tag}")


@task(name="d2.jittered", retry_backoff=0.4, retry_jitter=True, max_attempts=4)
def jittered(tag: str) -> None:
    _r().rpush(_k(f"at:{tag}"), _server_ms())
    raise RuntimeError(f"failure of {tag}")


@task(name="d2.picky", max_attempts=5, retry_delay=0.05, dont_retry_for=(KeyError,))
def picky(tag: str, kind: str) -> None:
    _r().hincrby(_k("starts"), tag, 1)
    raise {"key": KeyError, "value": ValueError}[kind](tag)


@task(name="d2.narrow", max_attempts=5, retry_delay=0.05, retry_for=(ConnectionError,))
def narrow(tag: str, kind: str) -> None:
    _r().hincrby(_k("starts"), tag, 1)
    raise {"conn": ConnectionError, "value": ValueError}[kind](tag)


@task(name="d2.retry_wins", max_attempts=3, retry_for=(ConnectionError,))
def retry_wins(tag: str) -> int:
    n = _r().hincrby(_k("tries"), tag, 1)
    if n == 1:
        raise Retry(delay=0.05)
    return n


# -- the job's context ---------------------------------------------------------------------
def _snapshot() -> dict[str, object]:
    job = current_job()
    return {"id": job.id, "task": job.task, "queue": job.queue, "group": job.group,
            "attempts": job.attempts, "max_attempts": job.max_attempts, "fence": job.fence,
            "enqueued_at": job.enqueued_at.timestamp() if job.enqueued_at else None,
            "holds": job.still_holds()}


@task(name="d2.whoami", group="ctx", max_attempts=4, retry_delay=0.05)
def whoami(tag: str, fail_times: int) -> dict[str, object]:
    snap = _snapshot()
    _r().rpush(_k(f"ctx:{tag}"), json.dumps(snap))
    if int(snap["attempts"]) <= fail_times:  # type: ignore[call-overload]
        raise RuntimeError("again")
    return snap


@task(name="d2.async_whoami", group="ctx", max_attempts=4, retry_delay=0.05)
async def async_whoami(tag: str) -> dict[str, object]:
    await asyncio.sleep(0.01)
    snap = _snapshot()
    _r().rpush(_k(f"ctx:{tag}"), json.dumps(snap))
    return snap


@task(name="d2.outlives", group="ctx", lease=3.0, max_attempts=3, retry_delay=0.05)
def outlives(tag: str) -> None:
    """Notes its fence, waits for the test's go (meanwhile the test expires and reaps the
    lease, and another child claims the job again), then notes whether it still holds."""
    job = current_job()
    r = _r()
    r.rpush(_k(f"fences:{tag}"), job.fence)
    r.blpop([_k(f"go:{tag}")], timeout=20)
    r.rpush(_k(f"holds:{tag}"), json.dumps([job.fence, job.still_holds()]))


@task(name="d2.logs", group="ctx")
def logs(tag: str) -> list[str]:
    """Logs through a handler of its own with the job fields in its format; returns what
    the handler wrote."""
    import io

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(emq_job_id)s %(emq_task)s %(message)s"))
    user = logging.getLogger("d2.user")
    user.addHandler(handler)
    try:
        user.warning("user log line of %s", tag)
    finally:
        user.removeHandler(handler)
    return out.getvalue().split()


# -- hooks ---------------------------------------------------------------------------------
def _note(event: str, job: object = None) -> None:
    if os.environ.get("D2_HOOKS") != "1":
        return
    ident = getattr(job, "id", "-")
    exc = getattr(job, "exception", None)
    try:
        current = current_job().id
    except NoCurrentJob:
        current = None
    _r().rpush(_k("hooks"), json.dumps({
        "event": event, "id": ident, "pid": os.getpid(), "exc": type(exc).__name__,
        "msg": str(exc) if exc is not None else None, "task": getattr(job, "task", None),
        "group": getattr(job, "group", None), "attempts": getattr(job, "attempts", None),
        "fence": getattr(job, "fence", None), "current": current, "at": time.time()}))
    if os.environ.get("D2_HOOKS_RAISE") == "1":
        raise RuntimeError(f"hook {event} raises on purpose")


@on("child_started")
def _child_started() -> None:
    _note("child_started")


@on("task_started")
def _task_started(job: object) -> None:
    _note("task_started", job)


@on("task_succeeded")
def _task_succeeded(job: object) -> None:
    _note("task_succeeded", job)


@on("task_retried")
def _task_retried(job: object) -> None:
    _note("task_retried", job)


@on("task_dead")
def _task_dead(job: object) -> None:
    _note("task_dead", job)


@on("worker_stopping")
def _worker_stopping() -> None:
    _note("worker_stopping")


@task(name="d2.once_fails", group="hooks", max_attempts=2, retry_delay=0.05)
def once_fails(tag: str, mode: str) -> str:
    """ok: succeeds; retry_then_ok: fails its first attempt; dead: always fails."""
    n = _r().hincrby(_k("tries"), tag, 1)
    if mode == "dead" or (mode == "retry_then_ok" and n == 1):
        raise ValueError(f"{mode} {n}")
    return tag


@task(name="d2.kills_its_child", group="lost", max_attempts=2, retry_delay=0.05)
def kills_its_child(tag: str) -> None:
    """Kills its own child (as the OOM killer would): the master settles each attempt."""
    _r().hincrby(_k("tries"), tag, 1)
    os.kill(os.getpid(), signal.SIGKILL)


@task(name="d2.ignores_its_limit", group="limited", max_attempts=2, retry_delay=0.05,
      time_limit=0.2)
def ignores_its_limit(tag: str) -> None:
    """Runs past its time limit with SIGTERM blocked (as a C library may hold it): only the
    master's SIGKILL ends it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    _r().hincrby(_k("tries"), tag, 1)
    time.sleep(30)
