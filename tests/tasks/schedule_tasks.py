"""Tasks the schedule tests run in real workers. Each records its runs in Redis, per queue."""

from __future__ import annotations

import time

from emqtasks import default_app, task


def _k(name: str) -> str:
    return f"t:{default_app.settings.queue}:{name}"


@task(name="s.tick", group="ticks")
def tick(tag: str) -> str:
    """Counts its runs per tag and notes when each started."""
    r = default_app.client
    pipe = r.pipeline()
    pipe.hincrby(_k("runs"), tag, 1)
    pipe.rpush(_k(f"at:{tag}"), f"{time.time():.3f}")
    pipe.execute()
    return tag


@task(name="s.slow", group="slow")
def slow(tag: str, seconds: float) -> str:
    """Notes its start and end (wall clock, s) as one interval, then returns."""
    start = time.time()
    time.sleep(seconds)
    default_app.client.rpush(_k(f"spans:{tag}"), f"{start:.3f} {time.time():.3f}")
    return tag


@task(name="s.quick", group="ticks", result_ttl=0)
def quick(tag: str) -> str:
    """Keeps no row once done (result_ttl=0): the schedule's marker alone refuses a repeat."""
    default_app.client.hincrby(_k("runs"), tag, 1)
    return tag
