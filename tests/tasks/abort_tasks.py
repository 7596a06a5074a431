"""Tasks the abort tests run in real worker processes (tests/test_abort.py). Each says it
started on a list the test blocks on, and how it ended in a hash."""

from __future__ import annotations

import asyncio
import os
import time

from emqtasks import current_job, default_app, on, task
from emqtasks.errors import Aborted


def _r():  # type: ignore[no-untyped-def]
    return default_app.client


def _k(name: str) -> str:
    return f"t:{default_app.settings.queue}:{name}"


def _started(tag: str) -> None:
    ctx = current_job()
    pipe = _r().pipeline()
    pipe.hset(_k("pid"), tag, os.getpid())
    pipe.hset(_k("nonce"), tag, ctx._lease.nonce)
    pipe.rpush(_k("started"), tag)
    pipe.execute()


def _ended(tag: str, how: str) -> None:
    _r().hset(_k("ended"), tag, how)


@task(name="a.busy", group=lambda tag: tag)
def busy(tag: str) -> int:
    """A pure-Python busy loop: stopped by Aborted at a bytecode boundary. (Each task
    says it started inside its handler: the abort may land before that call returns.)"""
    n = 0
    try:
        _started(tag)
        while True:
            n += 1
    except Aborted:
        _ended(tag, "aborted")
        raise


@task(name="a.stubborn", group=lambda tag: tag, abort_grace=1.0)
def stubborn(tag: str) -> None:
    """Swallows Aborted and goes on: killed after its 1 s grace (long enough for its
    handler's write on a loaded machine)."""
    first = True
    while True:
        try:
            if first:
                first = False
                _started(tag)
            while True:
                time.sleep(0.01)
        except Aborted:
            _r().hincrby(_k("swallowed"), tag, 1)


@task(name="a.deaf", group=lambda tag: tag)
def deaf(tag: str) -> None:
    """Swallows Aborted, with no abort_grace of its own: the worker's --abort-grace."""
    stubborn.spec.fn(tag)


@task(name="a.polite", group=lambda tag: tag)
def polite(tag: str) -> str:
    """Swallows every exception (Aborted too) but checks current_job().aborted."""
    try:
        _started(tag)
    except Exception:   # what a careless loop does
        pass
    while True:
        try:
            time.sleep(0.01)
        except Exception:   # what a careless loop does
            pass
        if current_job().aborted:
            _ended(tag, "saw aborted")
            return "stopped cleanly"


@task(name="a.sleeper", group=lambda tag: tag)
async def sleeper(tag: str) -> str:
    """An async task parked at an await: its coroutine is cancelled."""
    _started(tag)
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        _ended(tag, "cancelled")
        raise
    return tag


@task(name="a.quick", group=lambda tag: tag)
def quick(tag: str) -> str:
    return tag


@on("task_dead")
def _dead(ctx) -> None:  # type: ignore[no-untyped-def]
    _r().rpush(_k("dead_hook"), f"{ctx.id} {type(ctx.exception).__name__}")
