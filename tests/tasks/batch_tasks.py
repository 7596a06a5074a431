"""Tasks of the batch tests (test_batch_claim.py): short jobs that note what the server
holds of their group, and a long one; each records in Redis under its queue's keys."""

from __future__ import annotations

import time

from emqtasks import default_app, task

# The most of the group in flight (gactive: held by a child or running) seen by any run.
_MAX_ACTIVE = """
local a = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if a > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], a) end
redis.call('RPUSH', KEYS[3], ARGV[2])
"""


def _k(name: str) -> str:
    return f"bt:{default_app.settings.queue}:{name}"


@task(name="bt.short", group=lambda tag: tag.split(":")[0])
def short(tag: str) -> str:
    """One script call (under a ms): the group's in-flight count, and the finish order."""
    group = tag.split(":")[0]
    gactive = default_app.queue().keys.gactive
    default_app.client.eval(_MAX_ACTIVE, 3, gactive, _k(f"max:{group}"), _k("order"),
                            group, tag)
    return tag


@task(name="bt.long", group="long")
def long(seconds: float) -> str:
    r = default_app.client
    r.rpush(_k("order"), "long:start")
    time.sleep(seconds)
    r.rpush(_k("order"), "long:end")
    return "long"


@task(name="bt.noop", group="n")
def noop() -> None:
    """Nothing at all: the shortest job (a child of such jobs batches its claims)."""
