"""Tasks of the batch review tests (test_batch_review.py): each run, each success hook and
each context it saw is recorded in Redis under its queue's keys, so a test can count them."""

from __future__ import annotations

import os
import signal
import time

from emqtasks import current_job, default_app, on, task
from emqtasks.errors import Retry
from emqtasks.worker import child

# The tests lay their jobs out by place in a batch (sizes 1, 2, 4, then 8: jobs 7..14), which
# holds while every job before runs short, under the worker's 1 ms. On a loaded machine a
# fast job (a round trip) can take longer, and the layout moved (CI's abort test found its
# victim not yet claimed). In the worker that imports these tasks, a job under 50 ms is
# short; the jobs meant to run long here run 60 ms or more.
child.SHORT = 0.05


def _k(name: str) -> str:
    return f"br:{default_app.settings.queue}:{name}"


def _ran(tag: str) -> None:
    """One round trip: this run (the tag, and the id current_job() gave it)."""
    ctx = current_job()
    pipe = default_app.client.pipeline(transaction=False)
    pipe.hincrby(_k("runs"), tag, 1)
    pipe.rpush(_k("order"), tag)
    if ctx.id != tag:
        pipe.rpush(_k("wrong_ctx"), f"{tag}:{ctx.id}")
    pipe.execute()


@task(name="br.fast", group=lambda tag, *_: tag.split("-")[0])
def fast(tag: str) -> str:
    _ran(tag)
    return tag


@task(name="br.sleep", group=lambda tag, *_: tag.split("-")[0])
def sleep(tag: str, seconds: float) -> str:
    _ran(tag)
    time.sleep(seconds)
    return tag


@task(name="br.stop_master", group=lambda tag: tag.split("-")[0])
def stop_master(tag: str) -> str:
    """Asks its worker for a warm stop (SIGTERM to the master) from inside a batch."""
    _ran(tag)
    os.kill(os.getppid(), signal.SIGTERM)
    return tag


@task(name="br.die_once", group=lambda tag: tag.split("-")[0])
def die_once(tag: str) -> str:
    """Its child is SIGKILLed on the first attempt (the master releases the jobs held
    behind it)."""
    _ran(tag)
    if current_job().attempts == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return tag


@task(name="br.retry_once", group=lambda tag: tag.split("-")[0])
def retry_once(tag: str) -> str:
    _ran(tag)
    if current_job().attempts == 1:
        raise Retry(delay=0)
    return tag


@on("task_succeeded")
def _succeeded(ctx) -> None:  # type: ignore[no-untyped-def]
    default_app.client.hincrby(_k("succeeded"), ctx.id, 1)


@on("task_retried")
def _retried(ctx) -> None:  # type: ignore[no-untyped-def]
    default_app.client.hincrby(_k("retried"), ctx.id, 1)


@task(name="br.limited", group=lambda tag, *_: tag.split("-")[0], time_limit=0.5)
def limited(tag: str, seconds: float) -> str:
    """Runs within its 0.5 s time limit counted from its start (not from its claim)."""
    _ran(tag)
    time.sleep(seconds)
    return tag


@task(name="br.api", group=lambda tag: tag.split("-")[0])
def api(tag: str) -> str:
    """Hits an outside limit on its first run: its group sits out 1 s (RateLimited)."""
    from emqtasks.errors import RateLimited

    _ran(tag)
    if default_app.client.set(_k(f"limited:{tag}"), 1, nx=True):
        raise RateLimited(1.0)
    return tag


@task(name="br.hard_stop", group=lambda tag: tag.split("-")[0])
def hard_stop(tag: str) -> str:
    """Interrupts its worker twice (a hard stop: the children are killed) mid-batch."""
    _ran(tag)
    os.kill(os.getppid(), signal.SIGINT)
    time.sleep(0.01)
    os.kill(os.getppid(), signal.SIGINT)
    time.sleep(0.05)
    return tag


@task(name="br.cut_once", group=lambda tag: tag.split("-")[0])
def cut_once(tag: str) -> str:
    """Once: the server cuts its child's own connection (the one its acks are posted on,
    found in the child process), so the acks posted next are lost with it."""
    _ran(tag)
    if default_app.client.set(_k(f"cut:{tag}"), 1, nx=True):
        import gc

        from emqtasks.worker.child import Child

        child = next(o for o in gc.get_objects() if isinstance(o, Child))
        default_app.client.client_kill_filter(_id=child.queues.queues[0].client.client_id())
    return tag


@task(name="br.term_self", group=lambda tag: tag.split("-")[0])
def term_self(tag: str) -> str:
    """A warm stop reaches its own child mid-batch (SIGTERM: the child finishes the job in
    hand and starts no other); the child's pid is noted."""
    _ran(tag)
    default_app.client.hset(_k("pid"), tag, os.getpid())
    os.kill(os.getpid(), signal.SIGTERM)
    return tag


@task(name="br.pid", group=lambda tag: tag.split("-")[0])
def pid(tag: str) -> str:
    _ran(tag)
    default_app.client.hset(_k("pid"), tag, os.getpid())
    return tag


@task(name="br.abort_next", group=lambda tag, *_: tag.split("-")[0])
def abort_next(tag: str, victim: str) -> str:
    """Asks an abort of ``victim`` (a job held behind this one: claimed, not started), then
    runs past the watchdog's 0.1 s."""
    _ran(tag)
    asked = default_app.queue().abort_ask(victim)
    default_app.client.hset(_k("asked"), victim, str(asked))
    time.sleep(0.3)
    return tag
